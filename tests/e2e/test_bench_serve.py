# `ssmserve bench serve` against the test server: Poisson arrivals, every request answered, sane statistics.
import json
import subprocess

from conftest import BINARY


def test_bench_serve_random_prompts(server, tmp_path):
    out = tmp_path / "bench.json"
    r = subprocess.run([str(BINARY), "bench", "serve", "--base-url", server.base_url, "--num-prompts", "12",
                        "--request-rate", "40", "--input-len", "16", "--output-len", "8", "--output-json", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "Serving Benchmark Result" in r.stdout
    res = json.loads(out.read_text())
    assert res["completed"] == 12 and res["failed"] == 0
    assert res["total_input_tokens"] == 12 * 16 and res["total_output_tokens"] == 12 * 8
    assert 0 < res["median_ttft_ms"] <= res["p99_ttft_ms"] and res["mean_itl_ms"] > 0 and res["output_throughput"] > 0


def test_bench_serve_takes_an_openai_base_url(server):
    # The OpenAI client's base_url (".../v1") works too (it asked for /v1/v1/models before).
    r = subprocess.run([str(BINARY), "bench", "serve", "--base-url", server.base_url + "/v1/", "--num-prompts", "2",
                        "--input-len", "4", "--output-len", "2"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_bench_serve_chat_endpoint(server, tmp_path):
    # vLLM's openai-chat backend: each prompt one user message (random ids as text through /detokenize), the tokens
    # counted from content deltas; the endpoint's leading slash may be left out.
    out = tmp_path / "chat.json"
    r = subprocess.run([str(BINARY), "bench", "serve", "--base-url", server.base_url, "--endpoint", "v1/chat/completions",
                        "--num-prompts", "4", "--input-len", "8", "--output-len", "6", "--output-json", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert server.base_url + "/v1/chat/completions" in r.stderr
    res = json.loads(out.read_text())
    assert res["completed"] == 4 and res["total_output_tokens"] == 4 * 6 and res["median_ttft_ms"] > 0
    assert res["endpoint"] == "/v1/chat/completions" and res["errors"] == [""] * 4
    r = subprocess.run([str(BINARY), "bench", "serve", "--base-url", server.base_url, "--endpoint", "/v1/embeddings"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "--endpoint must be a completions or chat completions path" in r.stderr


def test_bench_serve_reports_failures(tmp_path):
    out = tmp_path / "failed.json"
    r = subprocess.run([str(BINARY), "bench", "serve", "--base-url", "http://127.0.0.1:1", "--model", "m", "--num-prompts", "2",
                        "--output-json", str(out)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "requests failed" in r.stderr
    res = json.loads(out.read_text())  # each request's error, as vLLM's "errors"
    assert res["failed"] == 2 and len(res["errors"]) == 2 and all("connection failed" in e for e in res["errors"])


def test_bench_serve_reports_the_prefix_cache_hit_rate(server, tmp_path):
    # Prompts sharing a long prefix, one at a time: every one after the first is served partly from the prefix cache
    # (usage.prompt_tokens_details.cached_tokens), and bench serve reports the share.
    shared = " ".join(f"word{i} and more text" for i in range(150))
    data = tmp_path / "shared.jsonl"
    data.write_text("".join(json.dumps({"prompt": shared + f" question {i}?"}) + "\n" for i in range(4)))
    out = tmp_path / "bench.json"
    r = subprocess.run([str(BINARY), "bench", "serve", "--base-url", server.base_url, "--dataset", str(data), "--num-prompts", "4",
                        "--max-concurrency", "1", "--output-len", "2", "--output-json", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "Prefix cache hit rate (%):" in r.stdout
    res = json.loads(out.read_text())
    assert res["total_cached_tokens"] > 0 and 0 < res["prefix_cache_hit_rate"] < 1
    assert res["total_cached_tokens"] <= res["total_input_tokens"]


def test_bench_serve_takes_vllms_spellings(server, tmp_path):
    # vllm bench serve's flags: --host / --port, --random-input-len / --random-output-len, --dataset-name random or
    # custom with --dataset-path, --ignore-eos (already every request's).
    host, port = server.base_url.removeprefix("http://").rsplit(":", 1)
    out = tmp_path / "v.json"
    r = subprocess.run([str(BINARY), "bench", "serve", "--host", host, "--port", port, "--dataset-name", "random",
                        "--random-input-len", "6", "--random-output-len", "3", "--num-prompts", "3", "--ignore-eos",
                        "--output-json", str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert res["completed"] == 3 and res["total_input_tokens"] == 3 * 6 and res["total_output_tokens"] == 3 * 3
    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"prompt": "Hello there"}) + "\n")
    r = subprocess.run([str(BINARY), "bench", "serve", "--host", host, "--port", port, "--dataset-name", "custom",
                        "--dataset-path", str(data), "--num-prompts", "2", "--random-output-len", "2",
                        "--output-json", str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and json.loads(out.read_text())["completed"] == 2, r.stderr
    r = subprocess.run([str(BINARY), "bench", "serve", "--dataset-name", "sharegpt"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "--dataset-name sharegpt is not supported" in r.stderr


def test_bench_serve_vllm_result_fields_and_flags(server, tmp_path):
    # vLLM's --percentile-metrics / --metric-percentiles choose the table's rows and the JSON's keys; the result JSON
    # carries vLLM's fields (duration, std_*, per-request lists); --save-result names the file as vLLM does, in a
    # --result-dir it creates; --backend openai-chat picks the chat endpoint; --num-warmups requests are not counted.
    rdir = tmp_path / "results" / "deep"
    r = subprocess.run([str(BINARY), "bench", "serve", "--base-url", server.base_url, "--num-prompts", "5",
                        "--input-len", "8", "--output-len", "4", "--max-concurrency", "2",
                        "--percentile-metrics", "ttft,e2el", "--metric-percentiles", "50,90,99.9", "--save-result",
                        "--result-dir", str(rdir), "--backend", "openai-chat", "--num-warmups", "2", "--disable-tqdm",
                        "--tokenizer", "tok"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "P90 TTFT (ms):" in r.stdout and "P99.9 E2EL (ms):" in r.stdout and "ITL" not in r.stdout, r.stdout
    files = list(rdir.glob("openai-chat-infqps-concurrency2-*.json"))
    assert len(files) == 1, list(rdir.iterdir())
    res = json.loads(files[0].read_text())
    assert res["completed"] == 5 and res["endpoint"] == "/v1/chat/completions" and res["backend"] == "openai-chat"
    assert res["duration"] == res["duration_s"] > 0 and res["max_concurrency"] == 2 and res["tokenizer_id"] == "tok"
    assert res["output_lens"] == [4] * 5 and len(res["input_lens"]) == 5 and len(res["ttfts"]) == 5
    # the gaps between a request's content chunks: at most 3 for 4 tokens (text a detokenizer holds back merges chunks)
    assert all(len(i) <= 3 and all(g >= 0 for g in i) for i in res["itls"]), res["itls"]
    assert res["p50_ttft_ms"] == res["median_ttft_ms"] and res["p50_ttft_ms"] <= res["p90_ttft_ms"] <= res["p99.9_ttft_ms"]
    assert res["std_e2el_ms"] >= 0 and "mean_itl_ms" not in res and "p99_ttft_ms" not in res
    for bad, word in ((["--percentile-metrics", "ttft,bogus"], "bogus"), (["--metric-percentiles", "0"], "\"0\""),
                      (["--metric-percentiles", "101"], "101"), (["--backend", "tgi"], "--backend tgi"),
                      (["--result-dir", str(tmp_path)], "--save-result"), (["--num-warmups", "-1"], "--num-warmups")):
        r = subprocess.run([str(BINARY), "bench", "serve", "--base-url", server.base_url, "--num-prompts", "1", *bad],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 1 and word in r.stderr, (bad, r.stderr)
