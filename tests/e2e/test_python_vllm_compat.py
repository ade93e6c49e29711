# vLLM scripts run unchanged (issue pyapi46): LLM / EngineArgs take vLLM's keywords that have no effect here at their
# "no effect" values (other values are a ValueError naming them), the engine seed defaults to 0, SamplingParams has
# detokenize / output_kind (RequestOutputKind) / extra_args / from_optional, LLM.reset_prefix_cache drops the cached
# prefixes, pooling and beam search say they are not supported, and the tokenizer has Hugging Face's attributes.
import asyncio
import copy
import dataclasses
import inspect
import json
import os
import pickle

import pytest

from conftest import MODEL

import ssmserve  # installed by `pip install .` (scripts/test.sh does it)
from ssmserve import AsyncEngineArgs, AsyncLLM, EngineArgs, LLM, RequestOutputKind, SamplingParams

SHARED = "/work/shared/models"
PROMPT = "Call me Ishmael."
LONG = " ".join(["The quick brown fox jumps over the lazy dog."] * 60)  # 600 tokens: a hybrid's 512-token block too

# Every vLLM keyword with no effect here, at a value that means "no effect" (the brief's list).
NO_EFFECT = dict(trust_remote_code=True, disable_log_stats=True, tokenizer_mode="hf",
                 revision=None, tokenizer_revision=None, code_revision=None, skip_tokenizer_init=False, task="generate",
                 runner="generate", enable_chunked_prefill=True, max_logprobs=20, kv_cache_dtype="auto", block_size=None,
                 cpu_offload_gb=0, pipeline_parallel_size=1, data_parallel_size=1, distributed_executor_backend="mp",
                 download_dir=None, hf_overrides={}, compilation_config=0, max_seq_len_to_capture=4096,
                 disable_custom_all_reduce=False, model_impl="auto", disable_async_output_proc=True,
                 enable_sleep_mode=False)

# Values that would have an effect: a ValueError naming the keyword and the value.
UNSUPPORTED = [("trust_remote_code", "yes"), ("disable_log_stats", None), ("tokenizer_mode", "mistral"),
               ("scheduling_policy", "priority"), ("revision", "main"), ("tokenizer_revision", "v1"), ("code_revision", "abc"),
               ("skip_tokenizer_init", True), ("task", "embed"), ("runner", "pooling"), ("enable_chunked_prefill", "no"),
               ("max_logprobs", 21), ("max_logprobs", -1), ("max_logprobs", True), ("kv_cache_dtype", "fp8"),
               ("block_size", 16), ("cpu_offload_gb", 4), ("cpu_offload_gb", False), ("pipeline_parallel_size", 2),
               ("pipeline_parallel_size", True), ("data_parallel_size", 2), ("distributed_executor_backend", "ray"),
               ("download_dir", "/tmp"), ("hf_overrides", {"rope_theta": 1.0}), ("compilation_config", "O3"),
               ("compilation_config", False), ("async_scheduling", "yes"), ("max_seq_len_to_capture", "8192"),
               ("disable_custom_all_reduce", "no"), ("model_impl", "transformers"), ("disable_async_output_proc", 0),
               ("enable_sleep_mode", True)]


@pytest.fixture(scope="module")
def llm():
    return LLM(str(MODEL), threads=2, max_num_seqs=8, mamba_block_size=32)


def tokens(llm, params, prompt=PROMPT):
    return llm.generate(prompt, params, use_tqdm=False)[0].outputs[0].token_ids


# 1. vLLM's keywords with no effect.

def test_no_effect_keywords_are_accepted(llm):
    greedy = SamplingParams(temperature=0, max_tokens=6)
    want = tokens(llm, greedy)
    assert tokens(LLM(str(MODEL), threads=2, **NO_EFFECT), greedy) == want
    # The other accepted values.
    other = dict(trust_remote_code=False, tokenizer_mode="auto", task="auto", runner="auto",
                 enable_chunked_prefill=None, max_logprobs=0, cpu_offload_gb=0.0, distributed_executor_backend="uni",
                 hf_overrides=None, compilation_config={}, disable_custom_all_reduce=True)
    assert tokens(LLM(str(MODEL), threads=2, **other), greedy) == want
    for backend in (None, "mp"):
        assert tokens(LLM(str(MODEL), threads=2, distributed_executor_backend=backend, compilation_config=None), greedy) == want
    # EngineArgs / AsyncEngineArgs: vLLM's defaults, and LLM(**asdict(args)) takes every field.
    args = EngineArgs(model=str(MODEL), threads=2, **NO_EFFECT)
    assert EngineArgs(model="m").trust_remote_code is False and EngineArgs(model="m").max_logprobs == 20
    assert tokens(LLM(**dataclasses.asdict(args)), greedy) == want
    assert tokens(LLM(**dataclasses.asdict(EngineArgs(model=str(MODEL), threads=2))), greedy) == want
    with AsyncLLM.from_engine_args(AsyncEngineArgs(model=str(MODEL), threads=2, **NO_EFFECT)) as e:
        assert e.is_running
    with AsyncLLM(str(MODEL), threads=2, trust_remote_code=True, enforce_eager=True) as e:
        assert e.is_running


@pytest.mark.parametrize("keyword,value", UNSUPPORTED)
def test_no_effect_keywords_refuse_values_with_an_effect(keyword, value):
    expected = f"{keyword}={value!r} is not supported by ssmserve: {keyword} must be "
    with pytest.raises(ValueError) as e:
        LLM(str(MODEL), threads=2, **{keyword: value})
    assert str(e.value).startswith(expected), str(e.value)
    with pytest.raises(ValueError) as e:
        AsyncLLM.from_engine_args(AsyncEngineArgs(model=str(MODEL), threads=2, **{keyword: value}))
    assert str(e.value).startswith(expected), str(e.value)


def test_enforce_eager_is_an_engine_argument(llm):
    # vLLM's enforce_eager: CUDA graphs off on a GPU (the same outputs), nothing to turn off on the CPU.
    greedy = SamplingParams(temperature=0, max_tokens=6)
    want = tokens(llm, greedy)
    assert tokens(LLM(str(MODEL), threads=2, enforce_eager=True), greedy) == want
    assert EngineArgs(model="m").enforce_eager is False
    assert tokens(LLM(**dataclasses.asdict(EngineArgs(model=str(MODEL), threads=2, enforce_eager=True))), greedy) == want
    with pytest.raises(TypeError, match="enforce_eager"):
        LLM(str(MODEL), threads=2, enforce_eager=1)


def test_max_logprobs():
    with pytest.raises(ValueError, match=r"max_logprobs=21 is not supported by ssmserve: .*the engine's cap is 20"):
        LLM(str(MODEL), max_logprobs=21)
    with pytest.raises(ValueError, match=r"max_logprobs=-1 is not supported by ssmserve: .*the engine's cap is 20"):
        LLM(str(MODEL), max_logprobs=-1)
    capped = LLM(str(MODEL), threads=2, max_logprobs=2)
    out = capped.generate(PROMPT, SamplingParams(max_tokens=2, logprobs=2, prompt_logprobs=2), use_tqdm=False)[0]
    assert len(out.outputs[0].logprobs) == 2
    with pytest.raises(ValueError, match="Requested sample logprobs of 3, which is greater than max allowed: 2"):
        capped.generate(PROMPT, SamplingParams(max_tokens=2, logprobs=3), use_tqdm=False)
    with pytest.raises(ValueError, match="Requested prompt logprobs of 5, which is greater than max allowed: 2"):
        list(capped.stream(PROMPT, SamplingParams(max_tokens=2, prompt_logprobs=5)))
    assert capped.get_engine_stats()["num_tracked_requests"] == 0


def test_unknown_keywords_stay_a_type_error():
    with pytest.raises(TypeError, match="unexpected keyword argument 'trust_remote_codes'"):
        LLM(str(MODEL), trust_remote_codes=True)
    with pytest.raises(TypeError):
        EngineArgs(model=str(MODEL), enforce_eagerly=True)


# 2. The engine seed defaults to 0 (vLLM's ModelConfig.seed).

def test_engine_seed_defaults_to_zero():
    assert inspect.signature(LLM.__init__).parameters["seed"].default == 0
    assert EngineArgs(model="m").seed == 0 and AsyncEngineArgs(model="m").seed == 0
    sampled = SamplingParams(temperature=1.5, max_tokens=24)
    runs = [tokens(LLM(str(MODEL), threads=2), sampled) for _ in range(2)]
    assert runs[0] == runs[1] == tokens(LLM(str(MODEL), threads=2, seed=0), sampled)
    unseeded = [tokens(LLM(str(MODEL), threads=2, seed=None), sampled) for _ in range(3)]
    assert len({tuple(t) for t in unseeded}) > 1  # seed=None: today's unseeded requests

    async def one():
        with AsyncLLM(str(MODEL), threads=2) as e:
            return [o async for o in e.generate(PROMPT, sampled, request_id="r")][-1].outputs[0].token_ids

    assert asyncio.run(one()) == asyncio.run(one())


# 3. SamplingParams: detokenize, output_kind, extra_args, from_optional.

def test_detokenize_false_gives_token_ids_only(llm):
    base = dict(temperature=0, max_tokens=8, logprobs=2, prompt_logprobs=1)
    full = llm.generate(PROMPT, SamplingParams(**base), use_tqdm=False)[0]
    bare = llm.generate(PROMPT, SamplingParams(**base, detokenize=False), use_tqdm=False)[0]
    c, b = full.outputs[0], bare.outputs[0]
    assert b.token_ids == c.token_ids and c.text and b.text == "" and b.finish_reason == c.finish_reason
    assert b.cumulative_logprob == c.cumulative_logprob
    for got, want in zip(b.logprobs, c.logprobs):
        assert got.keys() == want.keys()
        assert all(got[t].decoded_token is None and got[t].logprob == want[t].logprob and got[t].rank == want[t].rank
                   for t in got)
    assert bare.prompt_logprobs[0] is None
    assert all(lp.decoded_token is None for entry in bare.prompt_logprobs[1:] for lp in entry.values())
    assert all(o.outputs[0].text == "" and o.delta_text == "" for o in llm.stream(PROMPT, SamplingParams(**base, detokenize=False)))
    # vLLM: stop strings need the text.
    with pytest.raises(ValueError, match="stop strings are only supported when detokenize is True"):
        SamplingParams(stop=["x"], detokenize=False)
    p = SamplingParams(stop=["x"])
    p.detokenize = False  # checked when the request is added
    with pytest.raises(ValueError, match="stop strings are only supported when detokenize is True"):
        llm.generate(PROMPT, p, use_tqdm=False)
    with pytest.raises(TypeError, match="detokenize must be a bool"):
        SamplingParams(detokenize="no")
    assert SamplingParams().detokenize is True and llm.get_engine_stats()["num_tracked_requests"] == 0


def test_new_fields_pickle_clone_compare_and_repr():
    extra = {"plugin": {"k": [1, 2]}}
    p = SamplingParams(max_tokens=4, detokenize=False, output_kind=RequestOutputKind.DELTA, extra_args=extra)
    assert p.extra_args is extra and p.output_kind is RequestOutputKind.DELTA and p.detokenize is False
    for q in (pickle.loads(pickle.dumps(p)), copy.deepcopy(p), p.clone()):
        assert q == p and type(q) is SamplingParams
        assert q.output_kind is RequestOutputKind.DELTA and q.extra_args == extra and q.extra_args is not extra
    assert p != SamplingParams(max_tokens=4, detokenize=False, output_kind=RequestOutputKind.DELTA)
    assert p != SamplingParams(max_tokens=4, detokenize=False, extra_args=extra)
    assert p != SamplingParams(max_tokens=4, output_kind=RequestOutputKind.DELTA, extra_args=extra)
    assert repr(p).endswith("extra_args={'plugin': {'k': [1, 2]}})")
    d = SamplingParams()
    assert d.output_kind is RequestOutputKind.CUMULATIVE and d.extra_args is None
    d.extra_args = {"a": 1}
    d.extra_args["b"] = 2  # the dict itself, as vLLM's attribute
    assert d.extra_args == {"a": 1, "b": 2}
    with pytest.raises(TypeError, match="output_kind must be a RequestOutputKind"):
        SamplingParams(output_kind=1)
    with pytest.raises(TypeError, match="extra_args must be None or a dict"):
        SamplingParams(extra_args=[1])
    assert [k.value for k in RequestOutputKind] == [0, 1, 2]
    assert ssmserve.sampling_params.RequestOutputKind is RequestOutputKind
    assert [k.name for k in RequestOutputKind] == ["CUMULATIVE", "DELTA", "FINAL_ONLY"]


def test_from_optional():
    p = SamplingParams.from_optional(n=None, temperature=None, top_p=None, top_k=None, min_p=None, presence_penalty=None,
                                     frequency_penalty=None, repetition_penalty=None, min_tokens=None, ignore_eos=None,
                                     detokenize=None, output_kind=None, seed=None, stop=None, logprobs=None)
    assert p == SamplingParams()
    q = SamplingParams.from_optional(max_tokens=None, temperature=0.5, logit_bias={"5": 500, 6: -1000.0, 7: 3},
                                     stop="x", extra_args={"a": 1})
    assert q.max_tokens == SamplingParams(max_tokens=None).max_tokens  # None keeps its meaning: no limit
    assert q.logit_bias == {5: 100.0, 6: -100.0, 7: 3.0} and q.temperature == 0.5 and q.stop == ["x"]
    assert q.extra_args == {"a": 1}

    class Mine(SamplingParams):
        __slots__ = ()

    assert type(Mine.from_optional(n=2)) is Mine
    with pytest.raises(TypeError, match="unexpected keyword argument 'best_of'"):
        SamplingParams.from_optional(best_of=None)
    with pytest.raises(ValueError, match="logit_bias contains a key"):
        SamplingParams.from_optional(logit_bias={"x": 1.0})
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams.from_optional(temperature=-1.0)


def test_llm_generate_ignores_output_kind(llm):
    base = dict(temperature=0.8, seed=4, max_tokens=10)
    want = llm.generate(PROMPT, SamplingParams(**base), use_tqdm=False)[0].outputs[0]
    for kind in RequestOutputKind:
        got = llm.generate(PROMPT, SamplingParams(**base, output_kind=kind), use_tqdm=False)[0].outputs[0]
        assert got.token_ids == want.token_ids and got.text == want.text


def test_async_output_kinds():
    async def run(engine, params, rid):
        return [o async for o in engine.generate(LONG, params, request_id=rid)]

    async def main():
        with AsyncLLM(str(MODEL), threads=2) as e:
            base = dict(temperature=0.8, seed=3, max_tokens=24, logprobs=1, prompt_logprobs=1, stop=[" the"])
            cumulative = await run(e, SamplingParams(**base), "c")
            delta = await run(e, SamplingParams(**base, output_kind=RequestOutputKind.DELTA), "d")
            final = await run(e, SamplingParams(**base, output_kind=RequestOutputKind.FINAL_ONLY), "f")
            n2 = dict(temperature=0.8, seed=5, max_tokens=16, n=2)
            cumulative2 = await run(e, SamplingParams(**n2), "c2")
            delta2 = await run(e, SamplingParams(**n2, output_kind=RequestOutputKind.DELTA), "d2")
            final2 = await run(e, SamplingParams(**n2, output_kind=RequestOutputKind.FINAL_ONLY), "f2")
            return cumulative, delta, final, cumulative2, delta2, final2

    cumulative, delta, final, cumulative2, delta2, final2 = asyncio.run(main())
    last = cumulative[-1].outputs[0]
    # DELTA: each output only what is new; together the cumulative output.
    assert delta[-1].finished and not any(o.finished for o in delta[:-1])
    assert sum((o.outputs[0].token_ids for o in delta), []) == last.token_ids
    assert "".join(o.outputs[0].text for o in delta) == last.text
    assert sum((o.outputs[0].logprobs for o in delta), []) == last.logprobs
    assert delta[0].prompt_logprobs == cumulative[-1].prompt_logprobs and all(o.prompt_logprobs is None for o in delta[1:])
    assert delta[-1].outputs[0].finish_reason == last.finish_reason
    # FINAL_ONLY: the finished output alone.
    assert len(final) == 1 and final[0].finished and final[0].outputs[0] == last
    for c in range(2):
        assert sum((o.outputs[c].token_ids for o in delta2), []) == cumulative2[-1].outputs[c].token_ids
        assert "".join(o.outputs[c].text for o in delta2) == cumulative2[-1].outputs[c].text
    assert len(final2) == 1 and final2[0].outputs == cumulative2[-1].outputs


# 4. reset_prefix_cache, and the calls ssmserve does not support.

@pytest.mark.parametrize("model,kwargs", [(str(MODEL), dict(mamba_block_size=32)),
                                          (f"{SHARED}/tiny-qwen3_5_moe", dict(mamba_cache_mode="all"))])
def test_reset_prefix_cache(model, kwargs):
    if not os.path.isdir(model):
        pytest.skip(f"{model} is not here")
    llm = LLM(model, threads=2, **kwargs)  # a hybrid (gated delta rule + attention) caches KV pages too
    greedy = SamplingParams(temperature=0, max_tokens=6)
    first, second = (llm.generate(LONG, greedy, use_tqdm=False)[0] for _ in range(2))
    assert first.num_cached_tokens == 0 < second.num_cached_tokens and llm.get_engine_stats()["num_cached_blocks"] > 0
    assert llm.reset_prefix_cache() is True
    stats = llm.get_engine_stats()
    assert stats["num_cached_blocks"] == 0 and stats["num_free_blocks"] == stats["num_state_blocks"] - 1
    third, fourth = (llm.generate(LONG, greedy, use_tqdm=False)[0] for _ in range(2))
    assert third.num_cached_tokens == 0 and fourth.num_cached_tokens == second.num_cached_tokens
    assert first.outputs[0].token_ids == second.outputs[0].token_ids == third.outputs[0].token_ids == fourth.outputs[0].token_ids
    # While a request runs nothing is dropped (vLLM's False).
    stream = llm.stream(LONG, SamplingParams(temperature=0, max_tokens=50, ignore_eos=True))
    next(stream)
    assert llm.reset_prefix_cache() is False and llm.get_engine_stats()["num_cached_blocks"] > 0
    stream.close()
    assert llm.reset_prefix_cache() is True
    assert LLM(str(MODEL), threads=2, enable_prefix_caching=False).reset_prefix_cache() is True

    async def via_async():
        with AsyncLLM(str(MODEL), threads=2, mamba_block_size=32) as e:
            async for _ in e.generate(LONG, greedy, request_id="a"):
                pass
            cached = e.get_engine_stats()["num_cached_blocks"]
            return cached, await e.reset_prefix_cache(), e.get_engine_stats()["num_cached_blocks"]

    if model == str(MODEL):
        cached, done, after = asyncio.run(via_async())
        assert cached > 0 and done is True and after == 0


def test_pooling_and_beam_search_are_not_supported(llm):
    for name in ("encode", "embed", "score", "classify", "reward"):
        with pytest.raises(NotImplementedError, match="generative only"):
            getattr(llm, name)(PROMPT)
    with pytest.raises(NotImplementedError, match="beam search is not supported"):
        llm.beam_search([{"prompt": PROMPT}], None)


# 5. The tokenizer's Hugging Face attributes (transformers 5's AutoTokenizer on the same folders: tokenizer_config.json
#    and the tokenizer class's defaults).

@pytest.mark.parametrize("model,pad,max_length", [("tiny-mamba2", None, 1000000), ("tiny-qwen3_5_moe", "<|endoftext|>", 8192)])
def test_tokenizer_hugging_face_attributes(model, pad, max_length):
    folder = f"{SHARED}/{model}"
    if not os.path.isdir(folder):
        pytest.skip(f"{folder} is not here")
    tok = LLM(folder, threads=2).get_tokenizer()
    with open(f"{folder}/tokenizer.json") as f:
        spec = json.load(f)
    vocab = dict(spec["model"]["vocab"], **{a["content"]: a["id"] for a in spec["added_tokens"]})
    # tokenizer_config.json names bos / eos / unk <|endoftext|> (id 0); Qwen3_5Tokenizer's default pad is <|endoftext|>,
    # the GPT-NeoX tokenizer.json of tiny-mamba2 (TokenizersBackend) has none.
    assert tok.bos_token == tok.eos_token == tok.unk_token == "<|endoftext|>"
    assert tok.bos_token_id == tok.eos_token_id == tok.unk_token_id == 0
    assert tok.pad_token == pad and tok.pad_token_id == (None if pad is None else 0)
    assert tok.all_special_tokens == ["<|endoftext|>"] and tok.all_special_ids == [0]
    assert tok.get_vocab() == vocab and tok.get_vocab() is not tok.get_vocab()
    assert tok.max_token_id == max(vocab.values()) == 50276
    assert tok.model_max_length == max_length and tok.name_or_path == folder and tok.chat_template is None
    text = "Hello world, héllo\nagain"
    pieces = tok.tokenize(text)
    ids = tok.encode(text, add_special_tokens=False)
    assert pieces == tok.convert_ids_to_tokens(ids) and pieces[:2] == ["Hello", "Ġworld"]
    assert tok.convert_tokens_to_ids(pieces) == ids and tok.convert_tokens_to_ids("Ġworld") == vocab["Ġworld"]
    assert tok.convert_tokens_to_ids(["<|padding|>", "not-a-token"]) == [1, 0]  # unknown: unk_token's id
    assert tok.convert_tokens_to_ids(None) is None
    assert tok.convert_tokens_to_string(pieces) == text == tok.decode(ids)
    assert tok.convert_tokens_to_string(["<|endoftext|>", "Hi"]) == "<|endoftext|>Hi"
    with pytest.raises(TypeError, match="convert_tokens_to_ids"):
        tok.convert_tokens_to_ids(5)
    with pytest.raises(TypeError, match="convert_tokens_to_string"):
        tok.convert_tokens_to_string("Hi")


def test_tokenizer_folder_config(tmp_path):
    # A tokenizer folder with its own tokenizer_config.json: a pad token, an additional special token, a chat template
    # and no model_max_length (transformers' int(1e30)).
    os.symlink(f"{MODEL}/tokenizer.json", tmp_path / "tokenizer.json")
    template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": None, "eos_token": {"content": "<|endoftext|>", "special": True}, "pad_token": "<|padding|>",
        "additional_special_tokens": ["<|padding|>", "Ġworld"], "chat_template": template}))
    llm = LLM(str(MODEL), threads=2, tokenizer=str(tmp_path))
    tok = llm.get_tokenizer()
    assert tok.bos_token is None and tok.bos_token_id is None and tok.unk_token is None
    assert tok.eos_token == "<|endoftext|>" and tok.eos_token_id == 0
    assert tok.pad_token == "<|padding|>" and tok.pad_token_id == 1
    assert tok.all_special_tokens == ["<|endoftext|>", "<|padding|>", "Ġworld"] and tok.all_special_ids == [0, 1, 1533]
    assert tok.convert_tokens_to_ids("not-a-token") is None  # no unk_token
    assert tok.model_max_length == int(1e30) and tok.name_or_path == str(tmp_path)
    assert tok.chat_template == template
    assert llm.chat([{"role": "user", "content": "hi"}], SamplingParams(max_tokens=1), use_tqdm=False)[0].prompt == "<user>hi"


def test_hugging_face_id_from_the_local_hub_cache(tmp_path):
    # LLM("org/name") as vLLM takes it: the snapshot in the local hub cache (HF_HUB_CACHE; read once per process, so
    # in a fresh one); an id not there is a ValueError saying how to fetch it.
    import subprocess
    import sys
    repo = tmp_path / "hub" / "models--acme--tiny-mamba"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("c0ffee\n")
    (repo / "snapshots" / "c0ffee").mkdir(parents=True)
    for f in MODEL.iterdir():
        (repo / "snapshots" / "c0ffee" / f.name).symlink_to(f)
    script = (
        "import ssmserve\n"
        "p = ssmserve.SamplingParams(temperature=0, max_tokens=4)\n"
        f"want = ssmserve.LLM({str(MODEL)!r}, threads=1).generate('The', p, use_tqdm=False)[0].outputs[0].token_ids\n"
        "got = ssmserve.LLM('acme/tiny-mamba', threads=1).generate('The', p, use_tqdm=False)[0].outputs[0].token_ids\n"
        "assert got == want, (got, want)\n"
        "try:\n"
        "    ssmserve.LLM('acme/absent')\n"
        "    raise SystemExit('no error')\n"
        "except ValueError as e:\n"
        "    assert 'huggingface-cli download acme/absent' in str(e), e\n"
        "print('ok')\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, HF_HUB_CACHE=str(tmp_path / "hub")))
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr


def test_no_effect_keywords_as_the_cli_takes_them():
    # The values `serve` accepts for the same vLLM flags (tokenizer mode slow, any compilation level or dict, chunked
    # prefill off, async scheduling, fcfs, request logging) are accepted by LLM / EngineArgs too.
    args = dict(tokenizer_mode="slow", compilation_config={"level": 3}, enable_chunked_prefill=False,
                async_scheduling=True, scheduling_policy="fcfs", disable_log_requests=True, enable_log_requests=False)
    ssmserve._check_no_effect_args(args)
    assert all(getattr(AsyncEngineArgs(model=str(MODEL), **args), k) == v for k, v in args.items())
    with pytest.raises(ValueError, match="scheduling_policy"):
        ssmserve._check_no_effect_args({"scheduling_policy": "priority"})
    with pytest.raises(ValueError, match="compilation_config"):
        ssmserve._check_no_effect_args({"compilation_config": "O3"})


def test_tokenizer_sep_cls_mask_and_special_tokens_map(tmp_path):
    import shutil
    d = tmp_path / "m"
    shutil.copytree(MODEL, d)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg.update(sep_token="<|endoftext|>", cls_token={"content": "<|padding|>"}, mask_token=None, padding_side="left")
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    tok = LLM(str(d), threads=1).get_tokenizer()
    assert tok.sep_token == "<|endoftext|>" and tok.sep_token_id == tok.convert_tokens_to_ids("<|endoftext|>")
    assert tok.cls_token == "<|padding|>" and tok.cls_token_id == tok.convert_tokens_to_ids("<|padding|>")
    assert tok.mask_token is None and tok.mask_token_id is None
    assert tok.special_tokens_map["sep_token"] == "<|endoftext|>" and "mask_token" not in tok.special_tokens_map
    assert tok.padding_side == "left" and tok.is_fast is True
