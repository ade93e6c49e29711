# The model's default sampling params in `ssmserve serve` (vLLM's --generation-config / --override-generation-config,
# default "auto": the checkpoint's generation_config.json): a request that leaves temperature / max_tokens unset gets
# the model's, one that sets them keeps its own; chat's max_tokens default is max_new_tokens, completions keep 16;
# an override's max_new_tokens caps every request; a malformed file stops the server at startup naming it.
import json
import shutil
import subprocess

try:
    import httpx
except ImportError:  # openai >= 3 depends on the httpx2 fork
    import httpx2 as httpx
import pytest

from conftest import BINARY, MODEL, Server

MESSAGES = [{"role": "user", "content": "Tell me a story about the sea."}]
PROMPT = "And the LORD said unto Moses,"


def model_with(tmp_path, **sampling):
    """A copy of the bundled checkpoint whose generation_config.json also holds `sampling` (Qwen3.5-style keys)."""
    d = tmp_path / "model"
    shutil.copytree(MODEL, d)
    cfg = json.loads((d / "generation_config.json").read_text())
    cfg.update(sampling)
    (d / "generation_config.json").write_text(json.dumps(cfg))
    return d


def post(server, path, body):
    r = httpx.post(server.base_url + path, json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def chat(server, **fields):
    out = post(server, "/v1/chat/completions", {"messages": MESSAGES, "ignore_eos": True, **fields})
    return out["choices"][0]["message"]["content"], out["usage"]["completion_tokens"]


def complete(server, **fields):
    out = post(server, "/v1/completions", {"prompt": PROMPT, "ignore_eos": True, **fields})
    return out["choices"][0]["text"], out["usage"]["completion_tokens"]


@pytest.fixture(scope="module")
def greedy_default_server(tmp_path_factory):
    """A server whose model recommends greedy decoding (temperature 0) and 5 new tokens."""
    s = Server(model=model_with(tmp_path_factory.mktemp("gen"), temperature=0.0, top_p=0.9, top_k=None,
                                max_new_tokens=5))
    yield s
    assert s.stop() == 0


def test_startup_log_names_the_defaults(greedy_default_server):
    out = greedy_default_server.output()
    assert ("Default sampling parameters have been overridden by the model's Hugging Face generation config recommended "
            "from the model creator. If this is not intended, please relaunch with `--generation-config vllm`.") in out, out
    assert "Using default sampling params from model: {'temperature': 0.0, 'top_p': 0.9, 'max_tokens': 5}" in out, out


def test_unset_fields_take_the_defaults_set_ones_keep_their_own(greedy_default_server):
    s = greedy_default_server
    greedy, n = chat(s, temperature=0, max_tokens=5)
    assert n == 5
    # No temperature, no max_tokens: the model's (greedy, 5 tokens), with any seed.
    for seed in (1, 2):
        assert chat(s, seed=seed) == (greedy, 5)
    assert chat(s, temperature=None, max_tokens=None, seed=3) == (greedy, 5)  # null = unset, as vLLM
    # The request's own temperature (a seeded sample, not greedy) and max_tokens.
    sampled, n = chat(s, temperature=1.5, top_p=1.0, seed=7, max_tokens=5)
    assert n == 5 and sampled != greedy
    assert chat(s, temperature=1.5, top_p=1.0, seed=7, max_tokens=5) == (sampled, 5)  # deterministic
    assert chat(s, max_tokens=9)[1] == 9
    assert chat(s, max_completion_tokens=3)[1] == 3


def test_completions_take_the_sampling_defaults_but_keep_max_tokens_16(greedy_default_server):
    s = greedy_default_server
    greedy, n = complete(s, temperature=0, max_tokens=16)
    assert complete(s, seed=11) == (greedy, 16)  # vLLM: completions' max_tokens defaults to 16 whatever the model's
    assert complete(s, seed=11, max_tokens=4)[1] == 4
    sampled, _ = complete(s, temperature=1.5, top_p=1.0, seed=7)
    assert sampled != greedy


def test_vllm_mode_with_an_override_that_caps_max_tokens(tmp_path):
    s = Server("--generation-config", "vllm", "--override-generation-config", '{"max_new_tokens": 3, "top_k": null}',
               model=model_with(tmp_path, temperature=0.0))
    try:
        assert "from vllm: {'max_tokens': 3}" in s.output(), s.output()
        assert chat(s, temperature=0)[1] == 3
        assert chat(s, temperature=0, max_tokens=10)[1] == 3  # vLLM's override_max_tokens: every request
        assert complete(s, temperature=0)[1] == 3
        # vllm: the file's temperature 0 is not read; a request without one samples at 1.0 (seeded: not greedy).
        greedy, _ = chat(s, temperature=0, seed=5)
        assert any(chat(s, seed=seed)[0] != greedy for seed in (5, 6, 7))
    finally:
        assert s.stop() == 0


def test_bundled_model_has_no_defaults(server):
    """The bundled checkpoint's generation_config.json has no sampling keys: no notice, vLLM's neutral defaults."""
    assert "Default sampling parameters" not in server.output()


@pytest.mark.parametrize("field,value,needle", [
    ("temperature", -1, 'field "temperature" must be a number >= 0 (got -1)'),
    ("top_p", "high", 'field "top_p" must be a number in (0, 1] (got "high")'),
    ("max_new_tokens", 0, 'field "max_new_tokens" must be a positive integer (got 0)'),
])
def test_malformed_file_stops_the_server(tmp_path, field, value, needle):
    d = model_with(tmp_path, **{field: value})
    r = subprocess.run([str(BINARY), "serve", "--model", str(d), "--port", "0", "--threads", "1"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1, r.stderr
    assert f"error: {d / 'generation_config.json'}: {needle}" in r.stderr, r.stderr
    assert '--generation-config="vllm"' in r.stderr, r.stderr


def test_bad_flags_stop_the_server(tmp_path):
    for args, needle in [(["--generation-config", str(tmp_path / "absent")], "no such folder"),
                         (["--generation-config", str(tmp_path)], "generation_config.json not found"),
                         (["--override-generation-config", "[1]"], "--override-generation-config must be a JSON object"),
                         (["--override-generation-config", '{"top_k": 1.5}'],
                          '--override-generation-config: field "top_k" must be an integer')]:
        r = subprocess.run([str(BINARY), "serve", "--model", str(MODEL), "--port", "0", "--threads", "1", *args],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 1 and needle in r.stderr, (args, r.stderr)
