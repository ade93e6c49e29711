# CLI contracts around serving: `serve` rejects meaningless flags with a clear error, `generate --prompts-file`
# honours per-line sampling fields, and `generate` respects the model's context (max_position_embeddings, or
# --max-model-len) as vLLM.
import json
import os
import subprocess
from pathlib import Path

from conftest import BINARY, MODEL

ENV = dict(os.environ, OMP_WAIT_POLICY="passive")


def run(*args, stdin=None):
    return subprocess.run([str(BINARY), *map(str, args)], input=stdin, capture_output=True, text=True, env=ENV, timeout=120)


def model_with_context(tmp_path, n):
    """The bundled model with max_position_embeddings = n (weights and tokenizer linked, config rewritten)."""
    d = tmp_path / f"ctx{n}"
    d.mkdir()
    for f in MODEL.iterdir():
        if f.name != "config.json":
            (d / f.name).symlink_to(f)
    cfg = json.loads((MODEL / "config.json").read_text())
    cfg["max_position_embeddings"] = n
    (d / "config.json").write_text(json.dumps(cfg))
    return d


# 14. Empty model names and non-positive or too large --max-model-len are errors, not silently ignored.
def test_serve_rejects_bad_name_and_max_model_len(tmp_path):
    for args, needle in [(["--served-model-name", ""], "--served-model-name"),
                         (["--served-model-name", "  "], "--served-model-name"),
                         (["--max-model-len", 0], "--max-model-len"),
                         (["--max-model-len", -5], "--max-model-len")]:
        r = run("serve", "--model", MODEL, "--port", 0, *args)
        assert r.returncode == 1 and needle in r.stderr, (args, r.stderr)
    r = run("serve", "--model", model_with_context(tmp_path, 64), "--port", 0, "--max-model-len", 100)
    assert r.returncode == 1 and "--max-model-len 100 is larger than the model's context of 64" in r.stderr, r.stderr


def generate_json(*args, stdin=None):
    r = run("generate", "--model", MODEL, "--json", "--threads", 2, *args, stdin=stdin)
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for line in r.stdout.splitlines()], r.stderr


# 15. Per-line sampling fields of --prompts-file override the flags.
def test_prompts_file_per_line_fields():
    lines = [{"prompt": "Hello", "max_tokens": 3, "ignore_eos": True},
             {"prompt": "Hello", "max_tokens": 7, "ignore_eos": True, "logprobs": 2},
             {"prompt": "Hello"},
             {"prompt": "Hello", "max_tokens": 20, "ignore_eos": True, "stop": ["the"], "temperature": 0.8, "seed": 3}]
    outs, _ = generate_json("--prompts-file", "-", "--max-tokens", 5, "--ignore-eos",
                            stdin="".join(json.dumps(x) + "\n" for x in lines))
    assert [len(o["token_ids"]) for o in outs[:3]] == [3, 7, 5]
    assert outs[0]["logprobs"] is None and len(outs[1]["logprobs"]) == 7
    assert outs[0]["text"] == outs[2]["text"][:len(outs[0]["text"])]
    assert outs[3]["finish_reason"] in ("stop", "length") and "the" not in outs[3]["text"]
    for bad, needle in [({"prompt": "x", "max_tokens": "5"}, "max_tokens"), ({"prompt": "x", "max_tokenz": 5}, "max_tokenz"),
                        ({"prompt": "x", "max_tokens": 0}, "max_tokens"), ({"prompt": "x", "top_p": 7}, "top_p")]:
        r = run("generate", "--model", MODEL, "--prompts-file", "-", stdin=json.dumps(bad) + "\n")
        assert r.returncode == 1 and "<stdin>:1" in r.stderr and needle in r.stderr, (bad, r.stderr)


# 16. generate stops at the model's context (warning, finish_reason "length") and refuses prompts that fill it.
def test_generate_respects_max_position_embeddings(tmp_path):
    m = model_with_context(tmp_path, 12)
    r = run("generate", "--model", m, "--json", "--prompt", "Hello there", "--max-tokens", 50, "--ignore-eos")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert len(out["prompt_token_ids"]) + len(out["token_ids"]) == 12 and out["finish_reason"] == "length"
    assert "maximum context length of 12" in r.stderr
    r = run("generate", "--model", m, "--prompt", "word " * 20)
    assert r.returncode == 1 and "maximum context length of 12" in r.stderr, r.stderr


# 17. generate takes vLLM's --max-model-len as serve does (the same help text and checks): >= 1, at most the
# model's context, for hybrids within what one request's KV blocks can take in the pool; generation stops there.
def test_generate_max_model_len(tmp_path):
    def help_line(cmd):
        text = run(cmd, "--help").stdout
        i = text.index("--max-model-len")
        return " ".join(text[i:].split("\n  -", 1)[0].split())

    assert help_line("generate").replace("or none for", "or 8192 for") == help_line("serve"), help_line("generate")
    for bad in (0, -5):
        r = run("generate", "--model", MODEL, "--prompt", "Hi", "--max-model-len", bad)
        assert r.returncode == 1 and f"--max-model-len must be a positive number of tokens (got {bad})" in r.stderr, r.stderr
    for bad in ("abc", "1.5", "true", ""):
        r = run("generate", "--model", MODEL, "--prompt", "Hi", "--max-model-len", bad)
        assert r.returncode == 1 and "--max-model-len" in r.stderr and "Traceback" not in r.stderr, (bad, r.stderr)
    r = run("generate", "--model", model_with_context(tmp_path, 64), "--prompt", "Hi", "--max-model-len", 100)
    assert r.returncode == 1 and "--max-model-len 100 is larger than the model's context of 64" in r.stderr, r.stderr
    # Within the context: generation stops at --max-model-len (finish_reason "length", a warning naming the flag), and
    # a prompt that fills it is refused; the bundled model has no context limit, so this is --max-model-len's alone.
    r = run("generate", "--model", MODEL, "--json", "--prompt", "Hello there", "--max-tokens", 50, "--ignore-eos",
            "--max-model-len", 7, "--threads", 2)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert len(out["prompt_token_ids"]) + len(out["token_ids"]) == 7 and out["finish_reason"] == "length"
    assert "maximum context length of 7 tokens (--max-model-len)" in r.stderr, r.stderr
    r = run("generate", "--model", MODEL, "--prompt", "word " * 20, "--max-model-len", 7)
    assert r.returncode == 1 and "maximum context length of 7 tokens (--max-model-len)" in r.stderr, r.stderr
    # Nothing can be cached below one state block: the warning names the flag only when the user set it.
    r = run("generate", "--model", MODEL, "--prompt", "Hi", "--max-tokens", 2, "--max-model-len", 7, "--threads", 1)
    assert r.returncode == 0 and "the state block size (--mamba-block-size, chosen from" in r.stderr, r.stderr
    r = run("generate", "--model", MODEL, "--prompt", "Hi", "--max-tokens", 2, "--max-model-len", 7,
            "--mamba-block-size", 256, "--threads", 1)
    assert r.returncode == 0 and "prefix caching: --mamba-block-size 256 is not below max_model_len 7" in r.stderr, r.stderr
    # The CLI keeps naming its flags (the Python LLM names the keywords instead: test_python_engine_args.py).
    r = run("generate", "--model", MODEL, "--prompt", "Hi", "--mamba-block-size", -1)
    assert r.returncode == 1 and "--mamba-block-size must be in [1, " in r.stderr, r.stderr
    hybrid = Path(os.environ.get("SSMSERVE_MODELS_DIR", MODEL.parents[2] / "shared" / "models")) / "tiny-minimax"
    if (hybrid / "config.json").exists():
        r = run("generate", "--model", hybrid, "--prompt", "Hi", "--num-state-blocks", 4, "--max-model-len", 8192,
                "--threads", 1)
        assert r.returncode == 1 and "--max-model-len 8192 does not fit in the block pool" in r.stderr, r.stderr


def test_generate_with_a_sentencepiece_only_checkpoint(tmp_path):
    """A folder with tokenizer.model and no tokenizer.json (as Codestral-Mamba ships) loads its SentencePiece model."""
    d = tmp_path / "spm"
    d.mkdir()
    for f in MODEL.iterdir():
        if not f.name.startswith(("tokenizer", "special_tokens")):
            (d / f.name).symlink_to(f)
    spm = MODEL.parents[1] / "tests" / "data" / "tokenizers" / "spm_bpe" / "tokenizer.model"
    (d / "tokenizer.model").symlink_to(spm)
    r = run("generate", "--model", d, "--prompt", "It is a truth universally", "--max-tokens", "4", "--threads", "2", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.splitlines()[0])
    assert len(out["prompt_token_ids"]) > 0 and len(out["token_ids"]) == 4
    (d / "tokenizer.model").unlink()
    r = run("generate", "--model", d, "--prompt", "x", "--max-tokens", "1")
    assert r.returncode == 1 and "tokenizer.json not found" in r.stderr


def test_bench_max_model_len():
    """bench latency / throughput / multiturn take vLLM's --max-model-len engine argument, checked as generate's."""
    for cmd in ("latency", "throughput", "multiturn"):
        r = run("bench", cmd, "--model", MODEL, "--max-model-len", 0, "--threads", 1)
        assert r.returncode == 1 and "--max-model-len must be a positive number of tokens (got 0)" in r.stderr, (cmd, r.stderr)
    for cmd in ("latency", "throughput"):
        r = run("bench", cmd, "--model", MODEL, "--max-model-len", 16, "--input-len", 32, "--output-len", 8, "--threads", 1)
        assert r.returncode == 1 and "--input-len 32 + --output-len 8 exceed --max-model-len 16" in r.stderr, (cmd, r.stderr)
    r = run("bench", "latency", "--model", MODEL, "--max-model-len", 16, "--input-len", 8, "--output-len", 8,
            "--num-iters", 1, "--threads", 1)
    assert r.returncode == 0 and "decode:" in r.stdout, r.stderr
    # The pool is sized for the batch, and so is the scheduler: no warning about --max-num-seqs, never given.
    assert "no room for cached states" not in r.stderr, r.stderr


def test_config_file_gives_flags_the_command_line_overrides(tmp_path):
    # vLLM's `--config FILE.yaml`: its keys are the command's long flags (dashes or underscores), the command line wins.
    cfg = tmp_path / "gen.yaml"
    cfg.write_text("prompt: 'And the LORD said'\nmax_tokens: 6\ntemperature: 0\nignore-eos: true\njson: true\n")
    out = run("generate", "--config", cfg)
    assert out.returncode == 0, out.stderr
    from_file = json.loads(out.stdout)
    flags = run("generate", "--prompt", "And the LORD said", "--max-tokens", 6, "--temperature", 0, "--ignore-eos", "--json")
    assert from_file == json.loads(flags.stdout)
    # YAML's spellings of numbers as vLLM reads them (0x6 = 6), and a key given twice: the last wins.
    cfg2 = tmp_path / "gen2.yaml"
    cfg2.write_text("prompt: 'And the LORD said'\nmax_tokens: 2\nmax-tokens: 0x6\ntemperature: 0\nignore-eos: true\njson: true\n")
    assert json.loads(run("generate", "--config", cfg2).stdout) == from_file
    shorter = run("generate", "--config", cfg, "--max-tokens", 2)
    assert shorter.returncode == 0, shorter.stderr
    assert json.loads(shorter.stdout) == json.loads(run("generate", "--prompt", "And the LORD said", "--max-tokens", 2,
                                                       "--temperature", 0, "--ignore-eos", "--json").stdout)


def test_config_file_errors_name_the_file_and_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    for text, expected in [
        ("max-tokns: 4\n", 'unknown option "max-tokns" (not a flag of ssmserve generate)'),
        ("max-tokens: four\n", '--max-tokens: expected a decimal integer, got "four"'),
        ("max-tokens: [4\n", f"--config {bad}: not valid YAML (line"),
        ("- max-tokens\n", "expected a mapping of flags to values"),
        ("max-tokens:\n", '"max-tokens" has no value'),
        ("speculative-config: {[a]: 1}\n", "a mapping's keys must be scalars"),
        ("speculative-config: &x {a: *x}\n", "nested too deeply or expands to too many nodes"),
        ("max-tokens: 3\n---\nfoo: 1\n", "holds 2 YAML documents"),
        ("prompt: [a, b]\n", '"prompt" takes one value, not a list of 2'),
        ("help: true\n", '"help" cannot be given in a config file'),
    ]:
        bad.write_text(text)
        out = run("generate", "--config", bad)
        assert out.returncode == 1 and expected in out.stderr, (text, out.stderr)
    out = run("generate", "--config", tmp_path / "missing.yaml")
    assert out.returncode == 1 and "File does not exist" in out.stderr, out.stderr
    bad.write_text("max-tokens: 2\n")
    out = run("generate", "--config", bad, "--config", bad)
    assert out.returncode == 1 and "--config is given 2 times" in out.stderr, out.stderr
    # The unknown-key error names the file.
    bad.write_text("max-tokns: 2\n")
    assert f"--config {bad}: unknown option" in run("generate", "--config", bad).stderr


def test_serve_reads_its_config_file(tmp_path):
    from conftest import MODEL_NAME, Server

    cfg = tmp_path / "serve.yaml"
    cfg.write_text("served-model-name: from-yaml\napi-key: [k1, k2]\nenable-prefix-caching: false\n"
                   "speculative-config: {method: ngram, num_speculative_tokens: 2}\n")
    s = Server("--config", cfg)  # the Server's own --served-model-name wins over the file's
    try:
        import httpx

        assert httpx.get(s.base_url + "/v1/models", timeout=10).status_code == 401
        for key in ("k1", "k2"):
            r = httpx.get(s.base_url + "/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=10)
            assert r.status_code == 200 and r.json()["data"][0]["id"] != "from-yaml", r.text
        # The file's speculative config drafts (n-gram: the continuation repeats itself) and its prefix caching is off.
        body = {"model": MODEL_NAME, "prompt": "And the LORD said unto Moses, And the LORD said unto Moses,",
                "max_tokens": 48, "temperature": 0, "ignore_eos": True}
        r = httpx.post(s.base_url + "/v1/completions", json=body, headers={"Authorization": "Bearer k1"}, timeout=60)
        assert r.status_code == 200, r.text
        m = s.metrics()
        assert m["ssmserve:spec_decode_num_drafts_total"] > 0, m
        assert m["ssmserve:prefix_cache_queries_total"] == 0, m
    finally:
        s.stop()
