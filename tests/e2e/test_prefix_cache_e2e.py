# Prefix caching (issue 28) as users see it: `generate --json` reports num_cached_tokens (a repeated prompt is served
# from the cache with the same text), the flags are vLLM's and bad values are clear errors naming them, and the
# Python LLM takes enable_prefix_caching / mamba_block_size and reports RequestOutput.num_cached_tokens; the server's and
# the Python prompt's cache_salt (vLLM's) keep tenants' blocks apart.
import json
import os
import subprocess

import pytest

from conftest import BINARY, MODEL

ENV = dict(os.environ, OMP_WAIT_POLICY="passive")
LONG = ("It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want "
        "of a wife. However little known the feelings or views of such a man may be on his first entering a "
        "neighbourhood, this truth is so well fixed in the minds of the surrounding families, that he is considered "
        "the rightful property of some one or other of their daughters. ") * 2


def run(*args, stdin=None):
    return subprocess.run([str(BINARY), *map(str, args)], input=stdin, capture_output=True, text=True, env=ENV, timeout=180)


def generate_json(*flags):
    lines = "".join(json.dumps({"prompt": p}) + "\n" for p in [LONG, LONG, LONG + " And so"])
    r = run("generate", "--model", MODEL, "--prompts-file", "-", "--json", "--max-tokens", "12", "--max-num-seqs", "1",
            "--threads", "2", *flags, stdin=lines)
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for line in r.stdout.splitlines() if line.strip()]


def test_generate_json_reports_cached_tokens():
    cached = generate_json("--mamba-block-size", "32")
    plain = generate_json("--no-enable-prefix-caching")
    assert all("num_cached_tokens" in o for o in cached + plain)
    assert [o["num_cached_tokens"] for o in plain] == [0, 0, 0]
    n = len(cached[0]["prompt_token_ids"])
    assert cached[0]["num_cached_tokens"] == 0
    assert cached[1]["num_cached_tokens"] == (n - 1) // 32 * 32 > 0  # the whole prompt but its last token, in blocks
    assert cached[2]["num_cached_tokens"] >= 32
    for a, b in zip(cached, plain):
        assert a["token_ids"] == b["token_ids"] and a["text"] == b["text"]


@pytest.mark.parametrize("flags,needle", [
    (["--mamba-cache-mode", "sometimes"], "--mamba-cache-mode"),
    (["--mamba-block-size", "-4"], "--mamba-block-size"),
    (["--mamba-block-size", "4096", "--max-num-batched-tokens", "2048"], "--mamba-block-size"),
    (["--no-enable-prefix-caching", "--mamba-block-size", "64"], "--mamba-block-size"),
    (["--num-state-blocks", "2"], "--num-state-blocks"),
    (["--swap-space", "-1"], "--swap-space"),
    (["--swap-space", "1e9"], "--swap-space"),
])
def test_bad_prefix_cache_flags_are_named(flags, needle):
    r = run("generate", "--model", MODEL, "--prompt", "Hello", "--max-tokens", "2", *flags)
    assert r.returncode == 1
    assert r.stderr.startswith("error:") and needle in r.stderr, r.stderr


def test_python_llm_prefix_caching():
    ssmserve = pytest.importorskip("ssmserve")
    sp = ssmserve.SamplingParams(temperature=0, max_tokens=8)
    llm = ssmserve.LLM(str(MODEL), threads=2, mamba_block_size=32)
    first = llm.generate([LONG], sp)[0]
    second = llm.generate([LONG], sp)[0]
    assert first.num_cached_tokens == 0 and second.num_cached_tokens > 0
    assert second.outputs[0].token_ids == first.outputs[0].token_ids
    # vLLM's cache_salt in a prompt dict: only the same salt shares blocks.
    salted = [llm.generate([{"prompt": LONG, "cache_salt": s}], sp)[0] for s in ("a", "a", "b")]
    assert [o.num_cached_tokens for o in salted] == [0, second.num_cached_tokens, 0]
    assert all(o.outputs[0].token_ids == first.outputs[0].token_ids for o in salted)
    for bad in ("", 3):
        with pytest.raises(ValueError, match="cache_salt"):
            llm.generate([{"prompt": LONG, "cache_salt": bad}], sp)
    off = ssmserve.LLM(str(MODEL), threads=2, enable_prefix_caching=False)
    off.generate([LONG], sp)
    assert off.generate([LONG], sp)[0].num_cached_tokens == 0


def test_swap_space_is_a_no_op_on_the_cpu():
    r = run("--log-level", "info", "generate", "--model", MODEL, "--prompt", "Hello", "--max-tokens", "2", "--threads", "2",
            "--swap-space", "1")
    assert r.returncode == 0, r.stderr
    assert "--swap-space: no effect on this backend" in r.stderr


def test_server_cache_salt_keeps_tenants_apart():
    try:
        import httpx
    except ImportError:
        import httpx2 as httpx
    from conftest import Server
    s = Server("--mamba-block-size", 32)
    try:
        url = s.base_url + "/v1/completions"

        def cached(**extra):
            r = httpx.post(url, json={"prompt": LONG, "max_tokens": 2, "temperature": 0, **extra}, timeout=120)
            assert r.status_code == 200, r.text
            return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

        assert cached() == 0 and cached() > 0
        assert cached(cache_salt="tenant-a") == 0 and cached(cache_salt="tenant-a") > 0
        assert cached(cache_salt="tenant-b") == 0
        chat = httpx.post(s.base_url + "/v1/chat/completions", timeout=120, json={
            "messages": [{"role": "user", "content": LONG}], "max_tokens": 1, "cache_salt": "tenant-c"})
        assert chat.status_code == 200, chat.text
        for bad in ("", 7, "x" * 5000):
            r = httpx.post(url, json={"prompt": "hi", "max_tokens": 1, "cache_salt": bad}, timeout=30)
            assert r.status_code == 400 and r.json()["error"]["param"] == "cache_salt", r.text
    finally:
        s.stop()
