# The Python package as vLLM users use it (issue 33): vLLM's LLM / generate / chat names and defaults, the fields of
# RequestOutput / CompletionOutput, the tqdm bar, AsyncLLM (64 concurrent streams == offline results, abort frees the
# request's state), clear exceptions for bad input, and the `ssmserve` console command of the pip install.
import asyncio
import dataclasses
import inspect
import os
import subprocess
import sys

import pytest

from conftest import MODEL

import ssmserve  # installed by `pip install .` (scripts/test.sh does it)
from ssmserve import AsyncEngineArgs, AsyncLLM, LLM, SamplingParams

PROMPTS = ["And the LORD said unto Moses,", "It is a truth universally acknowledged", "Call me Ishmael.", "a"]
GREEDY = SamplingParams(temperature=0, max_tokens=6)


@pytest.fixture(scope="module")
def llm():
    return LLM(str(MODEL), max_num_seqs=8, threads=2)


def idle(stats):
    """True when the engine holds no request: nothing running, waiting or tracked, every block free."""
    return (stats["num_running_requests"] == 0 and stats["num_waiting_requests"] == 0 and stats["num_tracked_requests"] == 0
            and stats["num_timed_requests"] == 0 and stats["num_free_blocks"] == stats["num_state_blocks"] - 1)


def test_vllm_names_and_defaults(llm):
    sig = inspect.signature(LLM.__init__).parameters
    want = {"tokenizer": None, "dtype": "auto", "seed": 0, "max_model_len": None, "max_num_seqs": None,
            "max_num_batched_tokens": None, "gpu_memory_utilization": 0.9, "tensor_parallel_size": 1,
            "enable_prefix_caching": None, "speculative_config": None, "device": "auto", "load_format": "auto"}
    for name, default in want.items():
        assert sig[name].default == default, name
    assert inspect.signature(LLM.generate).parameters["use_tqdm"].default is True
    chat = inspect.signature(LLM.chat).parameters
    assert chat["chat_template"].default is None and chat["add_generation_prompt"].default is True
    assert chat["chat_template_kwargs"].default is None and chat["use_tqdm"].default is True
    out = llm.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=5, logprobs=1), use_tqdm=False)[0]
    for f in ("request_id", "prompt", "prompt_token_ids", "prompt_logprobs", "outputs", "finished", "num_cached_tokens",
              "metrics", "lora_request", "encoder_prompt", "encoder_prompt_token_ids"):
        assert hasattr(out, f), f
    c = out.outputs[0]
    for f in ("index", "text", "token_ids", "cumulative_logprob", "logprobs", "finish_reason", "stop_reason"):
        assert hasattr(c, f), f
    assert isinstance(out.request_id, str) and out.finished and out.prompt == PROMPTS[0] and out.prompt_logprobs is None
    assert c.index == 0 and len(c.token_ids) == 5 and c.finish_reason == "length" and c.stop_reason is None
    assert c.finished()
    m = out.metrics
    assert m.arrival_time <= m.first_token_time <= m.last_token_time <= m.finished_time and m.num_generation_tokens == 5
    assert 0 <= m.first_token_latency < 60


def test_cumulative_logprob(llm):
    # cumulative_logprob == the sum of the sampled tokens' logprobs (every choice of n), None without logprobs.
    out = llm.generate(PROMPTS[1], SamplingParams(temperature=0.8, seed=3, n=2, max_tokens=8, logprobs=3), use_tqdm=False)[0]
    assert len(out.outputs) == 2
    for c in out.outputs:
        assert c.cumulative_logprob == pytest.approx(sum(lp[t].logprob for t, lp in zip(c.token_ids, c.logprobs)), abs=1e-4)
        assert c.cumulative_logprob < 0
    assert llm.generate(PROMPTS[1], GREEDY, use_tqdm=False)[0].outputs[0].cumulative_logprob is None


def test_prompt_forms_and_lists_of_params(llm):
    ref = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    ids = [r.prompt_token_ids for r in ref]
    forms = [PROMPTS[0], ids[1], {"prompt": PROMPTS[2]}, {"prompt_token_ids": ids[3]}]
    mixed = llm.generate(forms, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in mixed] == [o.outputs[0].token_ids for o in ref]
    assert [o.prompt_token_ids for o in mixed] == ids
    # One prompt of each form alone (a list of ints is one prompt, not a batch).
    assert llm.generate(ids[0], GREEDY, use_tqdm=False)[0].outputs[0].token_ids == ref[0].outputs[0].token_ids
    assert llm.generate(tuple(ids[0]), GREEDY, use_tqdm=False)[0].outputs[0].token_ids == ref[0].outputs[0].token_ids
    assert llm.generate({"prompt": PROMPTS[1]}, GREEDY, use_tqdm=False)[0].outputs[0].text == ref[1].outputs[0].text
    # A list of SamplingParams: one per prompt, in order.
    params = [SamplingParams(temperature=0, max_tokens=k) for k in (1, 2, 3, 4)]
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outs] == [1, 2, 3, 4]
    for o, r in zip(outs, ref):
        assert r.outputs[0].token_ids[:len(o.outputs[0].token_ids)] == o.outputs[0].token_ids
    with pytest.raises(ValueError, match="lengths of prompts"):
        llm.generate(PROMPTS, params[:2], use_tqdm=False)


def test_use_tqdm(llm, capsys):
    llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert "Processed prompts" not in capsys.readouterr().err
    llm.generate(PROMPTS, GREEDY)  # vLLM's default: a progress bar
    err = capsys.readouterr().err
    assert "Processed prompts" in err and "4/4" in err
    seen = []

    class Bar:  # use_tqdm may be a tqdm-like class (vLLM)
        def __init__(self, total, **kw):
            seen.append(("total", total))

        def update(self, n):
            seen.append(("update", n))

        def close(self):
            seen.append(("close",))

    llm.generate(PROMPTS, GREEDY, use_tqdm=Bar)
    assert seen[0] == ("total", 4) and seen[-1] == ("close",) and sum(e[1] for e in seen if e[0] == "update") == 4


def test_chat_template_kwargs(llm):
    src = ("{% if enable_thinking %}<think>{% else %}<nothink>{% endif %}{% for m in messages %}{{ m.content }}"
           "{% endfor %}{% if tools %}[{{ tools[0].name }}]{% endif %}{% if add_generation_prompt %}|A:{% endif %}")
    msgs = [{"role": "user", "content": "Hi"}]
    p = SamplingParams(temperature=0, max_tokens=3)
    assert llm.chat(msgs, p, chat_template=src, use_tqdm=False)[0].prompt == "<nothink>Hi|A:"
    on = llm.chat(msgs, p, chat_template=src, chat_template_kwargs={"enable_thinking": True}, use_tqdm=False)[0]
    assert on.prompt == "<think>Hi|A:"
    assert on.outputs[0].token_ids == llm.generate("<think>Hi|A:", p, use_tqdm=False)[0].outputs[0].token_ids
    off = llm.chat(msgs, p, chat_template=src, add_generation_prompt=False, tools=[{"name": "f"}],
                   chat_template_kwargs={"enable_thinking": False}, use_tqdm=False)[0]
    assert off.prompt == "<nothink>Hi[f]"
    with pytest.raises(TypeError, match="chat_template_kwargs must be a dict"):
        llm.chat(msgs, p, chat_template_kwargs="enable_thinking", use_tqdm=False)
    with pytest.raises(TypeError, match="JSON-serializable"):
        llm.chat(msgs, p, chat_template_kwargs={"x": object()}, use_tqdm=False)


def test_chat_tool_call_arguments_reach_the_template_as_objects(llm):
    # As the server's chat (and vLLM): an assistant's function.arguments JSON text is an object in the template.
    src = ("{% for m in messages %}{% for c in m.tool_calls or [] %}{{ c.function.name }}("
           "{% for k, v in c.function.arguments | items %}{{ k }}={{ v }}{% endfor %}){% endfor %}{% endfor %}")
    calls = [{"id": "1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}},
             {"id": "2", "type": "function", "function": {"name": "g", "arguments": ""}}]
    msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "", "tool_calls": calls}]
    p = SamplingParams(temperature=0, max_tokens=1)
    out = llm.chat(msgs, p, chat_template=src, add_generation_prompt=False, use_tqdm=False)[0]
    assert out.prompt == "f(x=1)g()"
    calls[0]["function"]["arguments"] = "{not json"
    with pytest.raises(ValueError, match="not valid JSON"):
        llm.chat(msgs, p, chat_template=src, add_generation_prompt=False, use_tqdm=False)


def test_first_chats_from_several_threads_at_once():
    # The default chat template is loaded by the first chat(), which runs without the GIL: several threads' first
    # calls on a new LLM raced on it (a segfault in a break test). They must all render the same prompt.
    import json
    import threading
    msgs = [{"role": "user", "content": "hello"}]
    for _ in range(20):
        fresh = LLM(str(MODEL), threads=1)
        barrier, got = threading.Barrier(4), []

        def render():
            barrier.wait()
            got.append(fresh._engine.render_chat(json.dumps(msgs), True, None, False, "", ""))

        threads = [threading.Thread(target=render) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(got) == 4 and len(set(got)) == 1


def test_bad_input_raises_clear_exceptions(llm, tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        LLM(str(tmp_path / "missing"))
    with pytest.raises(TypeError, match="model must be a str"):
        LLM(123)
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        LLM(str(MODEL), bogus=1)
    with pytest.raises(TypeError, match="max_num_seqs"):
        LLM(str(MODEL), max_num_seqs="8")
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        LLM(str(MODEL), speculative_config={"method": "ngram"})
    with pytest.raises(ValueError, match="method \"replay\" is a benchmark-only drafter"):
        LLM(str(MODEL), speculative_config={"method": "replay", "num_speculative_tokens": 2})
    with pytest.raises(TypeError, match="speculative_config"):
        LLM(str(MODEL), speculative_config="ngram")
    with pytest.raises(ValueError, match="dtype"):
        LLM(str(MODEL), dtype="float16")
    with pytest.raises(TypeError, match="a prompt must be"):
        llm.generate(5)
    with pytest.raises(TypeError, match="a prompt must be"):
        llm.generate([1.5], use_tqdm=False)
    with pytest.raises(TypeError, match="sampling_params"):
        llm.generate(PROMPTS, [GREEDY, "x", GREEDY, GREEDY])
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        SamplingParams(max_token=3)
    with pytest.raises(TypeError):
        AsyncEngineArgs(model=str(MODEL), bogus=1)
    with pytest.raises(TypeError, match="AsyncEngineArgs"):
        AsyncLLM.from_engine_args({"model": str(MODEL)})
    with pytest.raises(ValueError, match="does not exist"):
        AsyncLLM.from_engine_args(AsyncEngineArgs(model=str(tmp_path / "missing")))


def run(coro):
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def engine():
    e = AsyncLLM.from_engine_args(AsyncEngineArgs(model=str(MODEL), max_num_seqs=64, threads=2))
    yield e
    e.shutdown()


def test_async_64_concurrent_streams_equal_offline(engine):
    prompts = [PROMPTS[i % 4] + " " * (i // 4 % 3) for i in range(64)]
    params = [SamplingParams(temperature=0, max_tokens=2 + i % 5) for i in range(64)]
    want = LLM(str(MODEL), max_num_seqs=64, threads=2).generate(prompts, params, use_tqdm=False)

    async def one(i):
        deltas, last, n = [], None, 0
        async for out in engine.generate(prompts[i], params[i], request_id=f"req-{i}"):
            assert out.request_id == f"req-{i}" and not (last and last.finished)
            deltas.append(out.delta_text)
            last, n = out, n + 1
        return last, "".join(deltas), n

    async def main():
        return await asyncio.gather(*(one(i) for i in range(64)))

    got = run(main())
    assert sum(n for _, _, n in got) > 64  # streamed: more than one output per request
    for (last, joined, _), w in zip(got, want):
        assert last.finished and last.outputs[0].finish_reason == w.outputs[0].finish_reason
        assert last.outputs[0].token_ids == w.outputs[0].token_ids
        assert last.outputs[0].text == w.outputs[0].text == joined
        assert last.prompt_token_ids == w.prompt_token_ids and last.metrics.finished_time is not None
    assert idle(engine.get_engine_stats())


def test_async_abort_frees_state(engine):
    long = SamplingParams(temperature=0, max_tokens=100000, ignore_eos=True)

    async def main():
        outs = []

        async def consume():
            async for out in engine.generate(PROMPTS[0], long, request_id="long"):
                outs.append(out)
                if len(outs) == 3:
                    await engine.abort("long")

        await asyncio.wait_for(consume(), 60)
        assert outs[-1].finished and outs[-1].outputs[0].finish_reason == "abort"
        assert len(outs[-1].outputs[0].token_ids) >= 3
        assert idle(engine.get_engine_stats())
        # Leaving the loop early (break) aborts too; so does cancelling the task.
        async for out in engine.generate(PROMPTS[1], long, request_id="brk"):
            break
        task = asyncio.ensure_future(consume_forever())
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(200):
            if idle(engine.get_engine_stats()):
                break
            await asyncio.sleep(0.05)
        assert idle(engine.get_engine_stats())
        # A reused request id and the engine still work.
        last = None
        async for last in engine.generate(PROMPTS[0], GREEDY, request_id="long"):
            pass
        return last

    async def consume_forever():
        async for _ in engine.generate(PROMPTS[2], long, request_id="cancel"):
            pass

    assert run(main()).finished


def test_async_request_id_reused_after_leaving_early(engine):
    """A request_id may be reused as soon as its stream ended (the caller left early): the old request's late outputs
    and abort never reach the new stream, and nothing keeps running."""
    want = None

    async def main():
        nonlocal want
        async for o in engine.generate(PROMPTS[1], SamplingParams(temperature=0, max_tokens=8), "ref-reuse"):
            want = o
        for _ in range(3):
            g = engine.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=50), "reuse")
            async for _o in g:
                break
            await g.aclose()
            last = None
            async for o in engine.generate(PROMPTS[1], SamplingParams(temperature=0, max_tokens=8), "reuse"):
                last = o
            assert last.request_id == "reuse" and last.outputs[0].finish_reason == want.outputs[0].finish_reason
            assert last.outputs[0].text == want.outputs[0].text
        for _ in range(100):
            if idle(engine.get_engine_stats()):
                break
            await asyncio.sleep(0.02)

    run(main())
    assert idle(engine.get_engine_stats())


def test_async_bad_input(engine):
    async def first(*args, **kw):
        async for out in engine.generate(*args, **kw):
            return out

    with pytest.raises(TypeError, match="request_id"):
        run(first(PROMPTS[0], GREEDY, 5))
    with pytest.raises(TypeError, match="sampling_params"):
        run(first(PROMPTS[0], {"max_tokens": 2}, "x"))
    with pytest.raises(TypeError, match="a prompt must be"):
        run(first(3.5, GREEDY, "x"))
    with pytest.raises(ValueError, match="top_p"):
        run(first(PROMPTS[0], SamplingParams(top_p=1.5), "x"))
    # tiny-mamba has no context limit: AsyncLLM's is serve's 8192, as LLM's.
    with pytest.raises(ValueError, match="the context \\(max_model_len\\) is 8192"):
        run(first({"prompt_token_ids": [1] * 8192}, SamplingParams(max_tokens=None), "long"))

    async def dup():
        gen = engine.generate(PROMPTS[0], SamplingParams(max_tokens=1000, ignore_eos=True), request_id="dup")
        await gen.__anext__()
        try:
            with pytest.raises(ValueError, match="already running"):
                await first(PROMPTS[0], GREEDY, "dup")
        finally:
            await gen.aclose()

    run(dup())
    assert engine.is_running and not engine.errored


def test_async_tokenizer_and_context_manager():
    with AsyncLLM(str(MODEL), threads=2) as e:
        tok = run(e.get_tokenizer())
        assert tok.decode(tok.encode("Hello")) == "Hello"
    assert not e.is_running


def test_console_command():
    # `pip install .` installs the `ssmserve` command: the CLI binary shipped in the package.
    from ssmserve import _cli

    if not _cli.binary_path().exists():
        pytest.skip("package not installed from a wheel (no ssmserve/bin/ssmserve)")
    script = os.path.join(os.path.dirname(sys.executable), "ssmserve")  # pip's console script next to python
    cmd = [script] if os.path.exists(script) else [sys.executable, "-m", "ssmserve"]
    help_text = subprocess.run(cmd + ["--help"], capture_output=True, text=True, timeout=60).stdout
    assert "serve" in help_text and "generate" in help_text and "bench" in help_text
    out = subprocess.run(cmd + ["generate", "--model", str(MODEL), "--prompt", PROMPTS[0], "--max-tokens", "8",
                                "--threads", "2"], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, OMP_WAIT_POLICY="passive"))
    assert out.returncode == 0, out.stderr
    want = LLM(str(MODEL), threads=2).generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
    assert want[0].outputs[0].text.strip() in out.stdout


def test_speculative_config_gives_the_same_outputs(llm):
    """LLM(speculative_config=...) (vLLM's dict): n-gram drafts verified with one state per draft position; the
    outputs equal those without speculation."""
    quote = "The cat sat on the mat. The cat sat on the mat. The cat sat on the mat. The cat"
    spec = LLM(str(MODEL), max_num_seqs=8, threads=2,
               speculative_config={"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3,
                                               "prompt_lookup_min": 1})
    params = SamplingParams(temperature=0, max_tokens=16, logprobs=1)
    a = llm.generate([quote], params, use_tqdm=False)[0].outputs[0]
    b = spec.generate([quote], params, use_tqdm=False)[0].outputs[0]
    assert (a.token_ids, a.text) == (b.token_ids, b.text)
    assert [lp[t].logprob for lp, t in zip(a.logprobs, a.token_ids)] == [lp[t].logprob for lp, t in zip(b.logprobs, b.token_ids)]


def test_dtype(llm):
    """LLM(dtype=...) (vLLM's names): the CPU computes in fp32 whatever it says, so "float32", vLLM's alias "float",
    "bfloat16" (on the bf16 tiny-mamba checkpoint) and "auto" / None give the default engine's ids and logprobs;
    "half" / "float16" (no fp16 kernels) and names vLLM does not take are a ValueError naming dtype, a non-str a
    TypeError; AsyncLLM takes it too."""
    params = SamplingParams(temperature=0, max_tokens=8, logprobs=1, ignore_eos=True)

    def ids_and_logprobs(engine):
        outs = [o.outputs[0] for o in engine.generate(PROMPTS, params, use_tqdm=False)]
        return [(c.token_ids, [lp[t].logprob for lp, t in zip(c.logprobs, c.token_ids)]) for c in outs]

    want = ids_and_logprobs(llm)
    assert all(len(ids) == 8 for ids, _ in want)
    for d in ("float32", "float", "bfloat16", "auto", None):
        assert ids_and_logprobs(LLM(str(MODEL), max_num_seqs=8, threads=2, dtype=d)) == want, d
    with pytest.raises(ValueError, match=r"dtype half: fp16 weights are not supported .*use one of: auto, bfloat16, "
                                         r"float32, float"):
        LLM(str(MODEL), dtype="half")
    with pytest.raises(ValueError, match=r"dtype must be one of: auto, bfloat16, float32, float \(got \"bf16\"\)"):
        LLM(str(MODEL), dtype="bf16")
    with pytest.raises(ValueError, match="dtype must be one of") as err:
        LLM(str(MODEL), dtype="fp32")
    assert "--dtype" not in str(err.value)  # the keyword, not the CLI's flag
    with pytest.raises(TypeError, match="'dtype'.*must be a str"):
        LLM(str(MODEL), dtype=32)
    with AsyncLLM(str(MODEL), threads=2, dtype="float32") as e:
        assert e.is_running
    with pytest.raises(ValueError, match="dtype"):
        AsyncLLM(str(MODEL), threads=2, dtype="float16")


def _fake_torch_dtype(name):
    """An object shaped as a torch.dtype (type torch.dtype, str "torch.<name>"), for machines without torch."""
    cls = type("dtype", (), {"__str__": lambda self: "torch." + name, "__repr__": lambda self: "torch." + name})
    cls.__module__ = "torch"
    return cls()


def test_dtype_takes_torch_dtypes():
    """vLLM's LLM(dtype=...) also takes a torch.dtype: torch.float32 / torch.float and torch.bfloat16 select those
    weights, torch.float16 / torch.half is refused as "float16" is, any other torch dtype names itself in the
    ValueError; other objects stay a TypeError."""
    try:
        import torch
        dtypes = {n: getattr(torch, n) for n in ("float32", "bfloat16", "float16", "int8")}
    except ImportError:
        dtypes = {n: _fake_torch_dtype(n) for n in ("float32", "bfloat16", "float16", "int8")}
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    want = LLM(str(MODEL), threads=2, dtype="float32").generate(PROMPTS[:1], params, use_tqdm=False)[0].outputs[0].token_ids
    for n in ("float32", "bfloat16"):
        got = LLM(str(MODEL), threads=2, dtype=dtypes[n]).generate(PROMPTS[:1], params, use_tqdm=False)[0].outputs[0]
        assert got.token_ids == want, n
    with pytest.raises(ValueError, match="dtype float16: fp16 weights are not supported"):
        LLM(str(MODEL), dtype=dtypes["float16"])
    with pytest.raises(ValueError, match=r"dtype must be one of: auto, bfloat16, float32, float \(got \"int8\"\)"):
        LLM(str(MODEL), dtype=dtypes["int8"])
    with AsyncLLM(str(MODEL), threads=2, dtype=dtypes["float32"]) as e:
        assert e.is_running
    with pytest.raises(TypeError, match="'dtype'.*must be a str"):
        LLM(str(MODEL), dtype=object())
