# The Python package's remaining vLLM behaviours and robustness (issue 33): a daemon thread inside LLM.generate when
# Python exits, AsyncLLM with n > 1, pickling / deep-copying SamplingParams and Logprob, the pip-installed CLI with no
# baked-in model, and small vLLM differences (empty allowed_token_ids, prompt None for token ids, unknown prompt keys).
import asyncio
import copy
import os
import pickle
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import MODEL, ROOT

import ssmserve  # installed by `pip install .` (scripts/test.sh does it)
from ssmserve import AsyncEngineArgs, AsyncLLM, LLM, SamplingParams

PROMPT = "It is a truth universally acknowledged"


@pytest.fixture(scope="module")
def llm():
    return LLM(str(MODEL), max_num_seqs=8, threads=2)


@pytest.fixture(scope="module")
def engine():
    e = AsyncLLM.from_engine_args(AsyncEngineArgs(model=str(MODEL), max_num_seqs=16, threads=2))
    yield e
    e.shutdown()


def idle(stats):
    """True when the engine holds no request: nothing running, waiting or tracked, every block free."""
    return (stats["num_running_requests"] == 0 and stats["num_waiting_requests"] == 0 and stats["num_tracked_requests"] == 0
            and stats["num_timed_requests"] == 0 and stats["num_free_blocks"] == stats["num_state_blocks"] - 1)


def wait_idle(engine):
    for _ in range(200):
        if idle(engine.get_engine_stats()):
            return True
        time.sleep(0.02)
    return idle(engine.get_engine_stats())


@pytest.mark.parametrize("call", ["llm.generate([PROMPT], params, use_tqdm=False)",
                                  "list(llm.stream(PROMPT, params))"])
def test_python_exits_cleanly_with_a_daemon_thread_in_the_engine(call):
    """Python ends daemon threads that take the GIL back while it exits (pthread_exit): the forced unwind must pass
    through the binding, never abort the interpreter ("terminate called without an active exception")."""
    code = textwrap.dedent(f"""
        import threading, time, ssmserve
        llm = ssmserve.LLM({str(MODEL)!r}, threads=1)
        params = ssmserve.SamplingParams(temperature=0, max_tokens=100000, ignore_eos=True)
        PROMPT = {PROMPT!r}
        started = threading.Event()
        def run():
            started.set()
            {call}
        threading.Thread(target=run, daemon=True).start()
        started.wait()
        time.sleep(0.5)
        print("bye", flush=True)
    """)
    for _ in range(3):  # the thread may be inside an engine step or between steps when Python exits
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                           env=dict(os.environ, OMP_WAIT_POLICY="passive"))
        assert p.returncode == 0 and "bye" in p.stdout, p.stderr[-2000:]
        assert "terminate" not in p.stderr and "Fatal Python error" not in p.stderr, p.stderr[-2000:]


def test_async_n_choices_equal_offline(engine, llm):
    """AsyncLLM.generate with n > 1 (as vLLM and LLM.generate): outputs[c] for c < n, each choice its own engine
    request seeded seed + c, so the results equal LLM.generate's for the same params."""
    params = SamplingParams(n=3, temperature=1.0, seed=1234, max_tokens=12, logprobs=1)
    want = llm.generate(PROMPT, params, use_tqdm=False)[0]

    async def main():
        outs = []
        async for out in engine.generate(PROMPT, params, request_id="multi"):
            assert out.request_id == "multi" and len(out.outputs) == 3
            assert [c.index for c in out.outputs] == [0, 1, 2]
            outs.append(out)
        return outs

    outs = asyncio.run(main())
    last = outs[-1]
    assert last.finished and all(not o.finished for o in outs[:-1]) and len(outs) > 1
    assert last.prompt == PROMPT and last.prompt_token_ids == want.prompt_token_ids
    for got, w in zip(last.outputs, want.outputs):
        assert (got.index, got.token_ids, got.text, got.finish_reason) == (w.index, w.token_ids, w.text, w.finish_reason)
        assert got.cumulative_logprob == pytest.approx(w.cumulative_logprob)
    assert len({tuple(c.token_ids) for c in last.outputs}) > 1  # distinct seeds: the choices differ
    assert wait_idle(engine)
    # Unseeded n > 1 and greedy n > 1 work too (greedy choices are equal).
    async def one(p, rid):
        last = None
        async for last in engine.generate(PROMPT, p, request_id=rid):
            pass
        return last

    greedy = asyncio.run(one(SamplingParams(n=2, temperature=0, max_tokens=5), "g"))
    assert greedy.outputs[0].token_ids == greedy.outputs[1].token_ids and len(greedy.outputs[0].token_ids) == 5
    assert len(asyncio.run(one(SamplingParams(n=4, max_tokens=3), "u")).outputs) == 4


def test_async_n_choices_abort_and_leaving_early_free_every_choice(engine):
    long = SamplingParams(n=3, temperature=0.5, seed=1, max_tokens=100000, ignore_eos=True)

    async def main():
        outs = []
        async for out in engine.generate(PROMPT, long, request_id="multi-abort"):
            outs.append(out)
            if len(outs) == 3:
                await engine.abort("multi-abort")
        assert outs[-1].finished and [c.finish_reason for c in outs[-1].outputs] == ["abort"] * 3
        assert wait_idle(engine)
        async for out in engine.generate(PROMPT, long, request_id="multi-break"):
            break

    asyncio.run(main())
    assert wait_idle(engine)


def test_sampling_params_and_logprobs_pickle_and_deepcopy(llm):
    p = SamplingParams(n=2, temperature=0.7, top_p=0.9, top_k=5, min_p=0.01, seed=2**63 + 5, presence_penalty=0.5,
                       frequency_penalty=-0.5, repetition_penalty=1.1, max_tokens=33, min_tokens=2, stop=["\n", "x"],
                       stop_token_ids=[3, 4], ignore_eos=True, logprobs=2, prompt_logprobs=1,
                       include_stop_str_in_output=True, skip_special_tokens=False, logit_bias={5: -1.5},
                       allowed_token_ids=[1, 2, 3])
    for q in (pickle.loads(pickle.dumps(p)), copy.deepcopy(p), copy.copy(p), p.clone()):
        assert q == p and q is not p and repr(q) == repr(p)
        assert q.allowed_token_ids == [1, 2, 3] and q.logit_bias == {5: -1.5} and q.seed == 2**63 + 5
    assert SamplingParams() == pickle.loads(pickle.dumps(SamplingParams())) and SamplingParams() != p and p != "p"
    q = copy.deepcopy(p)
    q.stop.append("y")  # a deep copy: the original keeps its list
    q.max_tokens = 1
    assert p.stop == ["\n", "x"] and p.max_tokens == 33 and q != p

    out = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=4, logprobs=2, prompt_logprobs=1),
                       use_tqdm=False)[0]
    lp = out.outputs[0].logprobs[0][out.outputs[0].token_ids[0]]
    for q in (pickle.loads(pickle.dumps(lp)), copy.deepcopy(lp), copy.copy(lp)):
        assert q == lp and (q.logprob, q.rank, q.decoded_token) == (lp.logprob, lp.rank, lp.decoded_token)
    assert ssmserve.Logprob(-0.5, 1, "a") == ssmserve.Logprob(-0.5, 1, "a") != ssmserve.Logprob(-0.5, 2, "a")
    # Whole outputs (dataclasses holding Logprob dicts) round-trip too, e.g. across multiprocessing.
    again = pickle.loads(pickle.dumps(out))
    assert again.outputs[0].logprobs == out.outputs[0].logprobs and again.prompt_logprobs == out.prompt_logprobs
    assert copy.deepcopy(out) == out

    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(llm)
    with pytest.raises(TypeError, match="cannot be pickled"):
        copy.deepcopy(llm)


def test_pip_cli_has_no_baked_in_model():
    """The pip package's `ssmserve` binary has no default --model (the build tree's models/tiny-mamba is no default
    for an installed tool): without --model it says so and exits 1."""
    from ssmserve import _cli

    if not _cli.binary_path().exists():
        pytest.skip("package not installed from a wheel (no ssmserve/bin/ssmserve)")
    exe = str(_cli.binary_path())
    assert str(ROOT / "models" / "tiny-mamba").encode() not in _cli.binary_path().read_bytes()
    env = dict(os.environ, OMP_WAIT_POLICY="passive")
    for args in (["generate", "--prompt", "Hi", "--max-tokens", "2"], ["bench", "latency", "--batch-size", "1"]):
        p = subprocess.run([exe, *args], capture_output=True, text=True, timeout=120, env=env)
        assert p.returncode == 1 and "error: --model is required" in p.stderr, (args, p.stdout, p.stderr)
    p = subprocess.run([exe, "generate", "--model", str(MODEL), "--prompt", "Hi", "--max-tokens", "2", "--threads", "2"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr


def test_empty_allowed_token_ids_is_refused():
    with pytest.raises(ValueError, match="allowed_token_ids"):
        SamplingParams(allowed_token_ids=[])
    assert SamplingParams(allowed_token_ids=None).allowed_token_ids == []  # None: every token


def test_prompt_is_none_for_token_id_prompts(llm, engine):
    ids = llm.get_tokenizer().encode(PROMPT)
    params = SamplingParams(temperature=0, max_tokens=3)
    a, b, c, d = llm.generate([ids, {"prompt_token_ids": ids}, {"prompt_token_ids": ids, "prompt": "given"}, PROMPT],
                              params, use_tqdm=False)
    assert a.prompt is None and b.prompt is None and c.prompt == "given" and d.prompt == PROMPT
    assert a.outputs[0].token_ids == d.outputs[0].token_ids
    assert all(o.prompt is None for o in llm.stream(ids, params))

    async def stream(prompt, p):
        return [o async for o in engine.generate(prompt, p, request_id="tok")]

    assert all(o.prompt is None for o in asyncio.run(stream(ids, params)))
    assert all(o.prompt is None for o in asyncio.run(stream({"prompt_token_ids": ids}, SamplingParams(n=2, max_tokens=2))))
    assert asyncio.run(stream({"prompt_token_ids": ids, "prompt": "given"}, params))[-1].prompt == "given"


def test_unknown_prompt_keys_are_refused(llm, engine):
    with pytest.raises(ValueError, match="'foo'"):
        llm.generate({"prompt": "x", "foo": 1}, SamplingParams(max_tokens=1), use_tqdm=False)
    with pytest.raises(ValueError, match="'multi_modal_data' is not supported"):
        llm.generate({"prompt": "x", "multi_modal_data": {"image": 1}}, SamplingParams(max_tokens=1), use_tqdm=False)
    with pytest.raises(ValueError, match="'foo'"):
        list(llm.stream({"prompt_token_ids": [1, 2], "foo": None}))
    # vLLM's optional keys given as None are "not given".
    assert llm.generate({"prompt": "x", "multi_modal_data": None}, SamplingParams(max_tokens=1), use_tqdm=False)[0].finished

    async def first():
        async for out in engine.generate({"prompt": "x", "foo": 1}, SamplingParams(max_tokens=1), request_id="bad"):
            return out

    with pytest.raises(ValueError, match="'foo'"):
        asyncio.run(first())
    assert idle(llm.get_engine_stats()) and wait_idle(engine)


@pytest.mark.parametrize("used_first", [False, True])
def test_llm_used_in_a_forked_child_is_a_clear_error(used_first):
    """An LLM / AsyncLLM created in a parent is not usable in an os.fork()ed child (libgomp's thread pool and the
    AsyncLLM loop thread do not survive fork): every entry point raises RuntimeError naming the creating process and
    the 'spawn' start method, instead of hanging; the child exits normally, and the parent's engine still works."""
    code = textwrap.dedent(f"""
        import asyncio, os, sys, ssmserve
        from ssmserve import LLM, AsyncLLM, SamplingParams
        llm = LLM({str(MODEL)!r}, threads=2)
        engine = AsyncLLM({str(MODEL)!r}, threads=2)
        p = SamplingParams(temperature=0, max_tokens=4)
        if {used_first}:
            want = llm.generate("Hi", p, use_tqdm=False)[0].outputs[0].text
        calls = {{
            "generate": lambda: llm.generate("Hi", p, use_tqdm=False),
            "chat": lambda: llm.chat([{{"role": "user", "content": "Hi"}}], p, use_tqdm=False),
            "stream": lambda: list(llm.stream("Hi", p)),
            "get_tokenizer": lambda: llm.get_tokenizer(),
            "get_engine_stats": lambda: llm.get_engine_stats(),
            "async generate": lambda: asyncio.run(engine.generate("Hi", p, request_id="r").__anext__()),
            "async stats": lambda: engine.get_engine_stats(),
        }}
        tok = llm.get_tokenizer()
        pid = os.fork()
        if pid == 0:
            import signal
            signal.alarm(20)  # a hung child ends itself (the old behaviour)
            bad = []
            for name, call in list(calls.items()) + [("encode", lambda: tok.encode("Hi"))]:
                try:
                    call()
                    bad.append(name + ": no error")
                except RuntimeError as e:
                    if "created in process " + str(os.getppid()) not in str(e) or "spawn" not in str(e):
                        bad.append(name + ": " + str(e))
            print("child", bad, flush=True)
            sys.exit(0)  # a normal exit: the finalizers must not touch the parent's engine
        _, status = os.waitpid(pid, 0)
        print("child status", status, flush=True)
        print("parent", len(llm.generate("Hi", p, use_tqdm=False)[0].outputs[0].token_ids), flush=True)
        engine.shutdown()
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, OMP_WAIT_POLICY="passive"))
    assert p.returncode == 0, p.stderr[-2000:]
    assert "child []" in p.stdout and "child status 0" in p.stdout and "parent 4" in p.stdout, (p.stdout, p.stderr[-2000:])


def test_sampling_params_is_a_class():
    """ssmserve.SamplingParams is a class, as vLLM's: isinstance, subclassing and PEP 604 / typing annotations work;
    clone, pickle and deepcopy keep the class; fields stay the only attributes."""
    from typing import List, Optional

    p = SamplingParams(temperature=0.5, max_tokens=4, stop="x")
    assert isinstance(SamplingParams, type) and isinstance(p, SamplingParams) and type(p) is SamplingParams
    assert Optional[SamplingParams] and List[SamplingParams] and (SamplingParams | None)
    for q in (p.clone(), copy.deepcopy(p), copy.copy(p), pickle.loads(pickle.dumps(p))):
        assert type(q) is SamplingParams and q == p and q is not p

    class Mine(SamplingParams):
        pass

    m = Mine(max_tokens=4, temperature=0.5, stop=["x"])
    assert isinstance(m, SamplingParams) and m == p and type(m.clone()) is Mine
    with pytest.raises(AttributeError):
        p.max_token = 3  # a misspelt field
    with pytest.raises(TypeError, match="unexpected keyword argument 'foo'"):
        SamplingParams(foo=1)
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)


def test_none_engine_arguments_are_the_defaults():
    """None for any LLM / AsyncLLM keyword argument (vLLM's and ssmserve's own) is the engine's default."""
    nones = dict(threads=None, num_state_blocks=None, mamba_cache_dtype=None, mamba_ssm_cache_dtype=None,
                 num_scheduler_steps=None, mamba_cache_mode=None, mamba_block_size=None, swap_space=None,
                 gpu_memory_utilization=None, tensor_parallel_size=None, device=None, load_format=None, dtype=None)
    params = SamplingParams(temperature=0, max_tokens=3)
    want = LLM(str(MODEL), threads=2).generate(PROMPT, params, use_tqdm=False)[0].outputs[0].token_ids
    assert LLM(str(MODEL), **nones).generate(PROMPT, params, use_tqdm=False)[0].outputs[0].token_ids == want
    with AsyncLLM(str(MODEL), **nones) as e:
        assert e.is_running
    with AsyncLLM(str(MODEL), threads=2, swap_space=1) as e:  # swap_space is an EngineArgs field too
        assert e.is_running


def test_async_stream_on_a_closed_event_loop_is_aborted(engine):
    """A generate() stream whose event loop was closed without shutdown_asyncgens (its generator never runs its
    cleanup) is aborted at its next output: the engine frees it and its request_id can be used again."""
    async def first():
        g = engine.generate(PROMPT, SamplingParams(max_tokens=100000, ignore_eos=True), request_id="orphan")
        await g.__anext__()
        return g

    loop = asyncio.new_event_loop()
    g = loop.run_until_complete(first())
    loop.close()
    assert wait_idle(engine), engine.get_engine_stats()

    async def again():
        return [o async for o in engine.generate(PROMPT, SamplingParams(max_tokens=2), request_id="orphan")]

    assert asyncio.run(again())[-1].finished
    del g


def test_chat_template_path_that_cannot_be_opened_is_an_error(llm, tmp_path):
    """vLLM's rule for chat(chat_template=...): a string without "{", "}" or a newline is a file path; one that does
    not exist or is a folder is a ValueError naming it (not literal template text); a readable file (str or Path)
    gives its contents."""
    msgs = [{"role": "user", "content": "Hi"}]
    params = SamplingParams(temperature=0, max_tokens=1)
    for bad in (str(tmp_path / "missing.jinja"), "templates/chatml.jinja", str(tmp_path)):
        with pytest.raises(ValueError, match="looks like a file path"):
            llm.chat(msgs, params, chat_template=bad, use_tqdm=False)
    (tmp_path / "t.jinja").write_text("<u>{{ messages[0].content }}")
    assert llm.chat(msgs, params, chat_template=tmp_path / "t.jinja", use_tqdm=False)[0].prompt == "<u>Hi"
    assert llm.chat(msgs, params, chat_template=str(tmp_path / "t.jinja"), use_tqdm=False)[0].prompt == "<u>Hi"


def test_wrong_argument_types_name_the_argument(llm):
    """Wrong types for chat's flags, the tokenizer's decode and Logprob(...) raise TypeError / ValueError naming the
    argument and the type it takes, never pybind11's "incompatible function arguments" dump of internal signatures."""
    msgs = [{"role": "user", "content": "Hi"}]
    tok = llm.get_tokenizer()
    cases = [
        (lambda: llm.chat(msgs, add_generation_prompt="no", use_tqdm=False), TypeError, "add_generation_prompt must be a bool"),
        (lambda: llm.chat(msgs, add_generation_prompt=False, continue_final_message="y", use_tqdm=False), TypeError,
         "continue_final_message must be a bool"),
        (lambda: tok.decode([2**40]), ValueError, "not in the vocabulary"),
        (lambda: tok.decode([-1]), ValueError, "not in the vocabulary"),
        (lambda: tok.decode(["a"]), TypeError, "int token ids"),
        (lambda: tok.decode("ab"), TypeError, "list of int token ids"),
        (lambda: tok.decode([1], skip_special_tokens="x"), TypeError, "skip_special_tokens must be a bool"),
        (lambda: ssmserve.Logprob("x"), TypeError, "logprob must be a float"),
        (lambda: ssmserve.Logprob(-1.0, rank="1"), TypeError, "rank must be an int"),
        (lambda: ssmserve.Logprob(-1.0, rank=2**40), TypeError, "rank must be an int"),
        (lambda: ssmserve.Logprob(-1.0, 1, 5), TypeError, "decoded_token must be a str"),
    ]
    for call, exc, match in cases:
        with pytest.raises(exc, match=match) as e:
            call()
        assert "incompatible function arguments" not in str(e.value)
    ids = tok.encode("Hi there")
    assert tok.decode(ids) == "Hi there" and tok.decode(ids[0]) == tok.decode(ids[:1])
    assert ssmserve.Logprob(-1, 2, "a") == ssmserve.Logprob(logprob=-1.0, rank=2, decoded_token="a")


def test_engine_log_level_defaults_to_warning():
    """The engine's info lines (state pool, prefix caching) are off by default, as the CLI's --log-level warn;
    SSMSERVE_LOG_LEVEL or LLM(log_level=...) turns them on; a bad level is a ValueError naming the argument."""
    def run(env=None, kwargs=""):
        code = f"import ssmserve; ssmserve.LLM({str(MODEL)!r}, threads=1{kwargs})"
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                           env=dict(os.environ, OMP_WAIT_POLICY="passive", **(env or {})))
        assert p.returncode == 0, p.stderr[-2000:]
        return p.stdout + p.stderr

    env = {k: v for k, v in os.environ.items() if k != "SSMSERVE_LOG_LEVEL"}
    p = subprocess.run([sys.executable, "-c", f"import ssmserve; ssmserve.LLM({str(MODEL)!r}, threads=1)"],
                       capture_output=True, text=True, timeout=120, env=dict(env, OMP_WAIT_POLICY="passive"))
    assert p.returncode == 0 and "[info]" not in p.stdout + p.stderr, p.stdout + p.stderr
    assert "[info] engine:" in run({"SSMSERVE_LOG_LEVEL": "info"})
    assert "[info] engine:" in run(kwargs=", log_level='INFO'")
    assert "[info]" not in run({"SSMSERVE_LOG_LEVEL": "info"}, kwargs=", log_level='error'")
    assert "SSMSERVE_LOG_LEVEL" in run({"SSMSERVE_LOG_LEVEL": "loud"})  # a warning, then the default
    with pytest.raises(ValueError, match="log_level must be one of"):
        LLM(str(MODEL), threads=1, log_level="loud")
    ssmserve._set_log_level("warning", "log_level")
