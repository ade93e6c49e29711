# vLLM's `serve` command lines work unchanged: `serve MODEL`, --api-key (and VLLM_API_KEY) guarding the /v1 routes,
# several --served-model-name values, --chat-template given as the template text, /ping, "model": "" as the default
# model, and the log flags vLLM users pass.
import json
import os
import socket
import subprocess

try:
    import httpx
except ImportError:  # openai >= 3 depends on the httpx2 fork
    import httpx2 as httpx

from conftest import BINARY, MODEL, MODEL_NAME, Server


def test_api_keys_guard_the_v1_routes_only():
    s = Server("--api-key", "k1", "--api-key", "k2", "--served-model-name", "alias", "--disable-log-requests",
               "--disable-log-stats", positional=True)
    try:
        url = s.base_url
        body = {"prompt": "hi", "max_tokens": 2}
        for headers in ({}, {"Authorization": "Bearer k3"}, {"Authorization": "k1"}, {"Authorization": "Basic k1"}):
            r = httpx.post(url + "/v1/completions", json=body, headers=headers)
            assert r.status_code == 401 and r.json() == {"error": "Unauthorized"}, (headers, r.text)
        assert httpx.get(url + "/v1/models").status_code == 401
        for key in ("Bearer k1", "bearer k2"):
            r = httpx.post(url + "/v1/completions", json=body, headers={"Authorization": key})
            assert r.status_code == 200, r.text
        ok = {"Authorization": "Bearer k1"}
        # Every served name is accepted and names the response (vLLM's _get_model_name), "" is the first; /v1/models
        # lists all. A wrong method gets the 401 too (the key is checked first, before any body is read).
        for model in (MODEL_NAME, "alias", ""):
            r = httpx.post(url + "/v1/completions", json={**body, "model": model}, headers=ok)
            assert r.status_code == 200 and r.json()["model"] == (model or MODEL_NAME), r.text
        assert httpx.get(url + "/v1/completions").status_code == 401
        assert httpx.get(url + "/v1/completions", headers=ok).status_code == 405
        r = httpx.post(url + "/v1/completions", json={**body, "model": "other"}, headers=ok)
        assert r.status_code == 404
        assert [m["id"] for m in httpx.get(url + "/v1/models", headers=ok).json()["data"]] == [MODEL_NAME, "alias"]
        # Routes outside /v1 need no key (vLLM's AuthenticationMiddleware); /ping as vLLM.
        for path in ("/health", "/metrics", "/ping", "/version"):
            assert httpx.get(url + path).status_code == 200, path
        assert httpx.post(url + "/ping", content=b"").status_code == 200
        assert httpx.post(url + "/tokenize", json={"prompt": "hi", "model": "alias"}).status_code == 200
    finally:
        s.stop()


def test_vllm_api_key_variable_and_bench_serve_with_openai_api_key(tmp_path):
    s = Server(env={"VLLM_API_KEY": "zz"})
    try:
        assert httpx.get(s.base_url + "/v1/models").status_code == 401
        assert httpx.get(s.base_url + "/v1/models", headers={"Authorization": "Bearer zz"}).status_code == 200
        # `bench serve` sends $OPENAI_API_KEY (vLLM's bench); without it the 401 is named.
        cmd = [str(BINARY), "bench", "serve", "--base-url", s.base_url, "--num-prompts", "2", "--input-len", "4",
               "--output-len", "2", "--output-json", str(tmp_path / "r.json")]
        env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
        assert r.returncode != 0 and "OPENAI_API_KEY" in r.stderr, r.stderr
        for endpoint in ("/v1/completions", "/v1/chat/completions"):
            r = subprocess.run(cmd + ["--endpoint", endpoint], capture_output=True, text=True, timeout=120,
                               env=dict(env, OPENAI_API_KEY="zz"))
            assert r.returncode == 0, r.stderr
            res = json.loads((tmp_path / "r.json").read_text())
            assert res["completed"] == 2 and res["failed"] == 0, res
    finally:
        s.stop()


def test_model_given_twice_and_empty_flags_are_errors():
    for args, words in ((["serve", str(MODEL), "--model", str(MODEL)], "not both"),
                        (["serve", str(MODEL), "--api-key", ""], "--api-key must not be empty"),
                        # A flag read as a value (an unset shell variable before it): an error, not a server without
                        # its key that serves "--api-key" as a model name.
                        (["serve", str(MODEL), "--served-model-name", "--api-key", "k"], "cannot start with '-'"),
                        (["serve", str(MODEL), "--api-key", "--served-model-name"], "cannot start with '-'"),
                        (["serve", str(MODEL), "--chat-template", "{{ broken"], "--chat-template"),
                        (["serve", str(MODEL), "--chat-template", "/nonexistent/t.jinja"], "file not found")):
        r = subprocess.run([str(BINARY), *args, "--port", "0"], capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and words in r.stderr, (args, r.stderr)


def test_chat_template_given_as_text():
    # vLLM's load_chat_template: not a file and holding "{", "}" or a newline: the template itself, escapes decoded.
    s = Server("--chat-template", "{% for m in messages %}[{{ m.content }}]\\n{% endfor %}")
    try:
        ids = httpx.post(s.base_url + "/tokenize", json={"messages": [{"role": "user", "content": "hi"}]}).json()["tokens"]
        assert httpx.post(s.base_url + "/detokenize", json={"tokens": ids}).json()["prompt"] == "[hi]\n"
    finally:
        s.stop()


def test_access_lines_at_serves_default_log_level():
    # `serve` logs at info by default (as vLLM's server): one access line per response, uvicorn's form;
    # --disable-uvicorn-access-log turns them off.
    s = Server()
    try:
        httpx.post(s.base_url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2})
        httpx.get(s.base_url + "/nope")
        with socket.create_connection(("127.0.0.1", s.port), timeout=10) as c:
            c.sendall(b'GET /q"\\\xff HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n')
            while c.recv(4096):
                pass
        out = s.output()
    finally:
        s.stop()
    assert '"POST /v1/completions HTTP/1.1" 200 OK' in out and '"GET /nope HTTP/1.1" 404 Not Found' in out, out
    # Quotes, backslashes and non-ASCII bytes of a target are percent-encoded (one valid line, one quoted field).
    assert '"GET /q%22%5C%FF HTTP/1.1" 404 Not Found' in out, out
    s = Server("--disable-uvicorn-access-log")
    try:
        httpx.post(s.base_url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2})
        out = s.output()
    finally:
        s.stop()
    assert "POST /v1/completions" not in out, out


def test_seed_minus_one_is_no_seed(server):
    # vLLM's SamplingParams: seed -1 is no seed (samples differ run to run); another seed repeats.
    body = {"prompt": "Once upon a time", "max_tokens": 24, "temperature": 1.0, "ignore_eos": True}
    texts = {httpx.post(server.base_url + "/v1/completions", json={**body, "seed": -1}).json()["choices"][0]["text"]
             for _ in range(4)}
    assert len(texts) > 1
    same = {httpx.post(server.base_url + "/v1/completions", json={**body, "seed": -2}).json()["choices"][0]["text"]
            for _ in range(2)}
    assert len(same) == 1


def test_vllm_flags_with_no_effect_and_vllm_spellings():
    # Flags of vLLM launch scripts that change nothing here start the server; vLLM's spellings (-tp, -O3,
    # underscores, human-readable token counts) read as vLLM reads them.
    s = Server("-tp", "1", "--max_model_len", "2k", "--max-num-batched-tokens", "1K", "--trust-remote-code",
               "--enforce-eager", "--enable-chunked-prefill", "--no-enable-chunked-prefill", "--kv-cache-dtype", "auto",
               "-O3", "--uvicorn-log-level", "warning", "--enable-prompt-tokens-details", "--disable-fastapi-docs",
               "--enable-log-requests", "--tokenizer-mode", "auto", "--revision", "main", "--download-dir", "/tmp",
               "-pp", "1", "--data-parallel-size=1", "--distributed-executor-backend", "mp", "--scheduling-policy",
               "fcfs", "--response-role", "assistant", "--max-log-len", "100", "--compilation-config", '{"level": 0}')
    try:
        assert httpx.get(s.base_url + "/v1/models").json()["data"][0]["max_model_len"] == 2000
        r = httpx.post(s.base_url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2})
        assert r.status_code == 200, r.text
    finally:
        s.stop()
    for args, words in ((["--kv-cache-dtype", "fp8"], "--kv-cache-dtype fp8"),
                        (["--scheduling-policy", "priority"], "--scheduling-policy priority"),
                        (["-pp", "2"], "--pipeline-parallel-size 2"),
                        (["--distributed-executor-backend", "ray"], "--distributed-executor-backend ray"),
                        (["--max-model-len", "1.5K"], "decimals are not allowed with binary suffixes"),
                        (["--max-model-len", "12q"], "--max-model-len"),
                        (["--seed", "-3"], "--seed"),
                        (["--seed", "18446744073709551616"], "--seed"),
                        (["-O", "/some/model/folder"], "--compilation-config (-O)"),
                        (["--uvicorn-log-level", "loud"], "--uvicorn-log-level")):
        r = subprocess.run([str(BINARY), "serve", str(MODEL), *args, "--port", "0"], capture_output=True, text=True,
                           timeout=60)
        assert r.returncode != 0 and words in r.stderr, (args, r.stderr)


def test_engine_seed_makes_unseeded_requests_repeat():
    # vLLM's --seed (default 0): requests without a seed get seeds derived from it in arrival order, so the same
    # requests to a fresh server sample the same text; another --seed samples other text.
    body = {"prompt": "Once upon a time", "max_tokens": 12, "temperature": 1.0}

    def sample(*args):
        s = Server(*args)
        try:
            return [httpx.post(s.base_url + "/v1/completions", json=body).json()["choices"][0]["text"] for _ in range(3)]
        finally:
            s.stop()

    first, again, other = sample(), sample("--seed", "0"), sample("--seed", "5")
    assert first == again, (first, again)
    # A request refused as invalid takes no seed: the next one samples what it would have.
    s = Server()
    try:
        bad = httpx.post(s.base_url + "/v1/completions", json=dict(body, logit_bias={"99999999": 1}))
        assert bad.status_code == 400
        assert httpx.post(s.base_url + "/v1/completions", json=body).json()["choices"][0]["text"] == first[0]
    finally:
        s.stop()
    assert len(set(first)) > 1, first  # one request after another: different seeds
    assert other != first, (other, first)


def _fake_hub_cache(root, repo_id, commit="0123abcd"):
    """A Hugging Face hub cache holding MODEL as `repo_id` (huggingface_hub's layout: refs/main -> snapshots/<commit>,
    files symlinked as the cache links its blobs)."""
    repo = root / ("models--" + repo_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit + "\n")
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    for f in MODEL.iterdir():
        (snap / f.name).symlink_to(f)
    return root


def test_hugging_face_ids_from_the_local_hub_cache(tmp_path):
    # vLLM takes a model as its Hugging Face id: ssmserve finds it in the local hub cache (HF_HUB_CACHE, HF_HOME/hub,
    # ~/.cache/huggingface/hub) and never downloads; an id not there is an error saying how to fetch it.
    cache = _fake_hub_cache(tmp_path / "hub", "acme/tiny-mamba")
    env = dict(os.environ, HF_HUB_CACHE=str(cache))
    gen = [str(BINARY), "generate", "--prompt", "The", "--max-tokens", "4"]
    want = subprocess.run(gen + ["--model", str(MODEL)], capture_output=True, text=True, timeout=60, env=env)
    got = subprocess.run(gen + ["--model", "acme/tiny-mamba"], capture_output=True, text=True, timeout=60, env=env)
    assert got.returncode == 0 and got.stdout == want.stdout, got.stderr
    for args, words in ((["--model", "acme/absent"], "huggingface-cli download acme/absent"),
                        (["--model", "acme/tiny-mamba", "--revision", "v9"], "no snapshot of revision \"v9\"")):
        cmd = [str(BINARY), "serve", *args, "--port", "0"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
        assert r.returncode != 0 and words in r.stderr, (args, r.stderr)
    # serve `serve ID` (HF_HOME's hub); --revision picks a snapshot by commit too.
    s = Server("--revision", "0123abcd", env={"HF_HOME": str(tmp_path)}, model="acme/tiny-mamba",
               model_name="acme/tiny-mamba", positional=True)
    try:
        models = httpx.get(s.base_url + "/v1/models").json()["data"]
        assert [(m["id"], m["root"]) for m in models] == [("acme/tiny-mamba", "acme/tiny-mamba")], models
        r = httpx.post(s.base_url + "/v1/completions", json={"model": "acme/tiny-mamba", "prompt": "hi", "max_tokens": 2})
        assert r.status_code == 200, r.text
    finally:
        s.stop()


def test_sagemaker_invocations_route(server):
    # vLLM's POST /invocations (SageMaker, beside /ping): a chat request by its messages, else a completion; streamed
    # too; a body that is neither is a 400.
    url = server.base_url
    comp = {"prompt": "Once", "max_tokens": 3, "temperature": 0}
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "temperature": 0}
    a = httpx.post(url + "/invocations", json=comp).json()
    assert a["object"] == "text_completion"
    assert a["choices"][0]["text"] == httpx.post(url + "/v1/completions", json=comp).json()["choices"][0]["text"]
    b = httpx.post(url + "/invocations", json=chat).json()
    assert b["object"] == "chat.completion"
    assert b["choices"][0]["message"] == httpx.post(url + "/v1/chat/completions", json=chat).json()["choices"][0]["message"]
    with httpx.stream("POST", url + "/invocations", json=dict(comp, stream=True)) as r:
        assert r.status_code == 200 and "data: [DONE]" in r.read().decode()
    r = httpx.post(url + "/invocations", json={"input": "x"})
    assert r.status_code == 400 and "/invocations" in r.json()["error"]["message"], r.text
    assert httpx.get(url + "/invocations").status_code == 405
    assert "x-request-id" not in httpx.get(url + "/health").headers  # only with --enable-request-id-headers


def test_request_id_headers():
    # vLLM's --enable-request-id-headers: X-Request-Id on every response, the request's own echoed; off by default.
    s = Server("--enable-request-id-headers")
    try:
        r = httpx.post(s.base_url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2},
                       headers={"X-Request-Id": "abc-1"})
        assert r.headers["x-request-id"] == "abc-1" and r.json()["id"] == "cmpl-abc-1"
        fresh = [httpx.get(s.base_url + "/health").headers["x-request-id"] for _ in range(2)]
        assert fresh[0] and fresh[0] != fresh[1], fresh
        assert httpx.get(s.base_url + "/nope").headers["x-request-id"]  # errors too
    finally:
        s.stop()


def test_per_request_histograms():
    # vLLM's per-request histograms: queue / prefill / decode / inference time and prompt / generated tokens, one
    # observation per finished request (under vllm: and ssmserve:).
    s = Server()
    try:
        r = httpx.post(s.base_url + "/v1/completions", json={"prompt": "Once upon a time", "max_tokens": 5}).json()
        text = httpx.get(s.base_url + "/metrics").text
    finally:
        s.stop()
    val = {line.split("{")[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
           if line and not line.startswith("#") and "_bucket" not in line}
    for prefix in ("vllm:", "ssmserve:"):
        assert val[prefix + "request_prompt_tokens_sum"] == r["usage"]["prompt_tokens"]
        assert val[prefix + "request_generation_tokens_sum"] == r["usage"]["completion_tokens"]
        for phase in ("queue", "prefill", "decode", "inference"):
            assert val[prefix + f"request_{phase}_time_seconds_count"] == 1
            assert 0 <= val[prefix + f"request_{phase}_time_seconds_sum"] < 60
        assert val[prefix + "request_inference_time_seconds_sum"] >= val[prefix + "request_decode_time_seconds_sum"]
