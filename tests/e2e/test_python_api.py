# The Python package (pip install .): LLM(...).generate(...) equals `ssmserve generate`, the streaming iterator,
# vLLM's output names, errors, and the GIL being released while the engine runs.
import gc
import json
import os
import threading
import time

import pytest

from conftest import MODEL, cli_generate

import ssmserve  # installed by `pip install .` (scripts/test.sh does it)

PROMPTS = ["And the LORD said unto Moses,", "It is a truth universally acknowledged", "Call me Ishmael."]


@pytest.fixture(scope="module")
def llm():
    return ssmserve.LLM(str(MODEL), max_num_seqs=8, threads=2)


def test_generate_equals_cli(llm):
    expected = cli_generate(PROMPTS, 24)
    outs = llm.generate(PROMPTS, ssmserve.SamplingParams(temperature=0, max_tokens=24))
    for out, ref in zip(outs, expected):
        assert out.prompt == ref["prompt"] and out.prompt_token_ids == ref["prompt_token_ids"]
        assert out.finished
        c = out.outputs[0]
        assert c.text == ref["text"] and c.token_ids == ref["token_ids"] and c.finish_reason == ref["finish_reason"]
    ids = llm.generate({"prompt_token_ids": expected[0]["prompt_token_ids"]}, ssmserve.SamplingParams(temperature=0, max_tokens=24))
    assert ids[0].outputs[0].token_ids == expected[0]["token_ids"]


def test_logprobs_and_stop(llm):
    out = llm.generate(PROMPTS[0], ssmserve.SamplingParams(temperature=0, max_tokens=4, logprobs=2))[0].outputs[0]
    assert len(out.logprobs) == 4
    for tok, lp in zip(out.token_ids, out.logprobs):
        assert tok in lp and lp[tok].rank == 1 and lp[tok].logprob <= 0 and len(lp) == 2
    assert out.cumulative_logprob == pytest.approx(sum(lp[t].logprob for t, lp in zip(out.token_ids, out.logprobs)), abs=1e-5)
    full = llm.generate(PROMPTS[0], ssmserve.SamplingParams(temperature=0, max_tokens=24))[0].outputs[0].text
    stopped = llm.generate(PROMPTS[0], ssmserve.SamplingParams(temperature=0, max_tokens=24, stop=full[5:8]))[0].outputs[0]
    assert stopped.finish_reason == "stop" and stopped.stop_reason == full[5:8] and stopped.text == full[:full.index(full[5:8])]


def test_sampled_token_rank_is_its_vocabulary_rank(llm):
    # vLLM's Logprob.rank of a sampled token: its rank in the whole distribution, not its place among the top-k.
    params = ssmserve.SamplingParams(temperature=4.0, max_tokens=24, logprobs=1, seed=5)
    out = llm.generate(PROMPTS[1], params)[0].outputs[0]
    ranks = []
    for tok, lp in zip(out.token_ids, out.logprobs):
        top = [i for i in lp if i != tok]
        if not top:  # the sampled token is the top one
            assert lp[tok].rank == 1
            continue
        assert lp[top[0]].rank == 1 and lp[tok].rank >= 2 and lp[tok].logprob <= lp[top[0]].logprob
        ranks.append(lp[tok].rank)
    assert any(r > 2 for r in ranks), ranks  # a hot temperature samples far below the top-1
    # Prompt logprobs: the prompt token's own rank too.
    p = llm.generate(PROMPTS[1], ssmserve.SamplingParams(max_tokens=1, prompt_logprobs=1))[0].prompt_logprobs
    ids = llm.generate(PROMPTS[1], ssmserve.SamplingParams(max_tokens=1))[0].prompt_token_ids
    assert p[0] is None and any(p[t][ids[t]].rank > 2 for t in range(1, len(ids)))


def test_logit_bias(llm):
    out = llm.generate(PROMPTS[0], ssmserve.SamplingParams(temperature=0, max_tokens=3, logit_bias={1000: 100}))[0]
    assert out.outputs[0].token_ids == [1000] * 3
    with pytest.raises(ValueError, match="logit_bias"):
        llm.generate(PROMPTS[0], ssmserve.SamplingParams(max_tokens=3, logit_bias={10 ** 7: 1.0}))


def test_n_choices(llm):
    out = llm.generate(PROMPTS[0], ssmserve.SamplingParams(temperature=0.9, max_tokens=8, n=3, seed=11))[0]
    assert [c.index for c in out.outputs] == [0, 1, 2]
    again = llm.generate(PROMPTS[0], ssmserve.SamplingParams(temperature=0.9, max_tokens=8, n=3, seed=11))[0]
    assert [c.token_ids for c in out.outputs] == [c.token_ids for c in again.outputs]
    one = llm.generate(PROMPTS[0], ssmserve.SamplingParams(temperature=0.9, max_tokens=8, seed=12))[0]
    assert one.outputs[0].token_ids == out.outputs[1].token_ids  # choice i uses seed + i


def test_stream_iterator(llm):
    params = ssmserve.SamplingParams(temperature=0, max_tokens=20)
    ref = llm.generate(PROMPTS[1], params)[0].outputs[0].text
    outs = list(llm.stream(PROMPTS[1], params))
    assert outs[-1].finished and not any(o.finished for o in outs[:-1])
    assert "".join(o.delta_text for o in outs) == ref == outs[-1].outputs[0].text
    it = llm.stream(PROMPTS[2], ssmserve.SamplingParams(temperature=0, max_tokens=1000, ignore_eos=True))
    next(it)
    it.close()  # aborts the request
    assert llm.generate(PROMPTS[2], params)[0].finished


def test_errors(llm):
    with pytest.raises(ValueError, match="top_p"):
        llm.generate("hi", ssmserve.SamplingParams(top_p=1.5))
    with pytest.raises(TypeError):
        ssmserve.SamplingParams(bogus=1)
    with pytest.raises(TypeError, match="unexpected keyword argument 'clone'"):  # methods are not fields
        ssmserve.SamplingParams(clone=1)
    # Checked at construction, as vLLM's SamplingParams.__post_init__ does.
    for bad in ({"temperature": -1}, {"top_p": 0}, {"n": 0}, {"logprobs": 21}, {"max_tokens": 0}, {"max_tokens": 2**40}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            ssmserve.SamplingParams(**bad)
    with pytest.raises(TypeError):
        ssmserve.LLM(str(MODEL), not_an_arg=3)
    with pytest.raises(ValueError):
        ssmserve.LLM("/nonexistent/model")
    assert llm.generate("hi", ssmserve.SamplingParams(max_tokens=2))[0].finished  # still usable


def test_gil_released_while_generating(llm):
    ticks = 0
    done = threading.Event()

    def work():
        llm.generate(PROMPTS * 4, ssmserve.SamplingParams(temperature=0, max_tokens=64, ignore_eos=True))
        done.set()

    t = threading.Thread(target=work)
    start = time.time()
    t.start()
    while not done.is_set():
        ticks += 1
        time.sleep(0.001)
    t.join()
    assert time.time() - start > 0.05 and ticks >= 10, ticks


def test_tensor_parallel_size(llm):
    # LLM(..., tensor_parallel_size=2): two in-process CPU ranks give TP 1's greedy tokens (issue 9).
    params = ssmserve.SamplingParams(temperature=0, max_tokens=8)
    tp2 = ssmserve.LLM(str(MODEL), max_num_seqs=8, threads=2, tensor_parallel_size=2)
    for a, b in zip(llm.generate(PROMPTS, params), tp2.generate(PROMPTS, params)):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
    with pytest.raises(ValueError, match="tensor_parallel_size 3"):
        ssmserve.LLM(str(MODEL), tensor_parallel_size=3)


def test_num_scheduler_steps(llm):
    # LLM(..., num_scheduler_steps=4): multi-step decode gives the single-step tokens and logprobs; a bad count is
    # a ValueError naming the flag.
    def flat(lps):  # Logprob has no __eq__
        return [[(i, lp.logprob, lp.rank) for i, lp in d.items()] for d in lps]

    params = ssmserve.SamplingParams(temperature=0, max_tokens=10, logprobs=1)
    multi = ssmserve.LLM(str(MODEL), max_num_seqs=8, threads=2, num_scheduler_steps=4)
    for a, b in zip(llm.generate(PROMPTS, params), multi.generate(PROMPTS, params)):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert a.outputs[0].text == b.outputs[0].text
        assert flat(a.outputs[0].logprobs) == flat(b.outputs[0].logprobs)
    with pytest.raises(ValueError, match="num_scheduler_steps"):
        ssmserve.LLM(str(MODEL), num_scheduler_steps=0)


def test_threads_share_one_llm(llm):
    # generate() and stream() from several threads at once batch in the one engine; each gets its own results,
    # equal to a solo run (this crashed with munmap_chunk(): invalid pointer before the engine had a lock).
    params = ssmserve.SamplingParams(temperature=0, max_tokens=16)
    solo = [o.outputs[0].text for o in llm.generate(PROMPTS, params)]
    results, errors = {}, []

    def gen(i):
        try:
            results[i] = [o.outputs[0].text for o in llm.generate(PROMPTS, params)]
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(repr(e))

    def stream():
        try:
            results["stream"] = ["".join(o.delta_text for o in llm.stream(p, params)) for p in PROMPTS]
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    threads = [threading.Thread(target=gen, args=(i,)) for i in range(4)] + [threading.Thread(target=stream)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == 5
    assert all(v == solo for v in results.values()), results


def test_prompt_logprobs(llm):
    out = llm.generate(PROMPTS[0], ssmserve.SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=2))[0]
    assert len(out.prompt_logprobs) == len(out.prompt_token_ids) and out.prompt_logprobs[0] is None
    for tok, lp in zip(out.prompt_token_ids[1:], out.prompt_logprobs[1:]):
        assert tok in lp and 2 <= len(lp) <= 3 and lp[tok].logprob <= 0
        assert list(lp)[0] == tok  # the prompt token first, then the top-2
    assert llm.generate(PROMPTS[0], ssmserve.SamplingParams(max_tokens=2))[0].prompt_logprobs is None


def test_bad_types_name_the_field(llm):
    for kw, field in [({"max_tokens": "5"}, "max_tokens"), ({"temperature": "hot"}, "temperature"),
                      ({"stop": 5}, "stop"), ({"logit_bias": {"x": 1}}, "logit_bias")]:
        with pytest.raises(TypeError, match=f"SamplingParams.{field} cannot be"):
            ssmserve.SamplingParams(**kw)
    # vLLM's __post_init__ conversions: seed -1 is no seed, logprobs True is 1; other negative seeds are int64 bits.
    assert ssmserve.SamplingParams(seed=-1).seed is None and ssmserve.SamplingParams(seed=-2).seed == 2 ** 64 - 2
    assert ssmserve.SamplingParams(logprobs=True).logprobs == 1 and ssmserve.SamplingParams(prompt_logprobs=False).prompt_logprobs == 0
    with pytest.raises(ValueError, match="seed"):
        ssmserve.SamplingParams(seed=-2 ** 64)
    assert ssmserve.SamplingParams(stop=None, stop_token_ids=None, logit_bias=None).stop == []
    for prompt in ([2 ** 40], [1.5], b"abc", {"prompt_token_ids": ["a"]}):
        with pytest.raises(TypeError, match="a prompt must be"):
            llm.generate(prompt, ssmserve.SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match="device tpu"):  # the keyword, not the CLI flag
        ssmserve.LLM(str(MODEL), device="tpu")
    assert ssmserve.LLM(str(MODEL), threads=2, device="cpu").generate("hi", ssmserve.SamplingParams(max_tokens=2))[0].finished
    # device="cuda": "has no CUDA backend" without the CUDA backend (the default pip build); with it
    # (SSMSERVE_PYTHON_CUDA=ON) it loads on a GPU or names the missing device.
    assert isinstance(ssmserve.has_cuda, bool)
    if not ssmserve.has_cuda:
        with pytest.raises(ValueError, match="device cuda: this build of ssmserve has no CUDA backend"):
            ssmserve.LLM(str(MODEL), device="cuda")
    with pytest.raises(TypeError, match="engine argument 'threads' cannot be '2'"):
        ssmserve.LLM(str(MODEL), threads="2")
    with pytest.raises(TypeError, match="sampling_params must be a SamplingParams"):
        llm.generate("hi", {"max_tokens": 2})
    with pytest.raises(TypeError, match="sampling_params must be a SamplingParams"):
        next(llm.stream("hi", {"max_tokens": 2}))
    with pytest.raises(ValueError, match="not valid Unicode"):
        llm.generate("ab\udc80", ssmserve.SamplingParams(max_tokens=2))


def test_tokenizer_clone_and_engine_seed(llm):
    # vLLM's LLM.get_tokenizer (the engine's BPE: the prompt ids the engine reports), SamplingParams.clone / repr,
    # and LLM(seed=...): unseeded requests get seed, seed + 1, ... so sampled outputs repeat across runs.
    tok = llm.get_tokenizer()
    out = llm.generate(PROMPTS[0], ssmserve.SamplingParams(temperature=0, max_tokens=4))[0]
    assert tok.encode(PROMPTS[0]) == out.prompt_token_ids
    assert tok.decode(out.prompt_token_ids) == PROMPTS[0] and tok.decode(out.outputs[0].token_ids) == out.outputs[0].text
    assert tok.vocab_size == len(tok) > 50000 and tok.eos_token_id == 0
    # Ids it does not know (the padded embedding rows sampling may pick) decode to nothing, as Hugging Face's.
    assert tok.decode([10 ** 7]) == "" and tok.decode(out.prompt_token_ids + [10 ** 7]) == PROMPTS[0]
    # The Hugging Face calls vLLM scripts make on it.
    assert tok(PROMPTS[0])["input_ids"] == tok(PROMPTS[0]).input_ids == out.prompt_token_ids
    assert tok([PROMPTS[0], "a"])["attention_mask"][1] == [1] * len(tok.encode("a"))
    assert tok.encode(PROMPTS[0], add_special_tokens=False) == out.prompt_token_ids  # GPT-NeoX adds none
    assert tok.batch_decode([out.prompt_token_ids, out.outputs[0].token_ids]) == [PROMPTS[0], out.outputs[0].text]
    assert tok.convert_ids_to_tokens(out.prompt_token_ids[1]).startswith("\u0120")  # byte-level BPE's leading space
    assert tok.convert_ids_to_tokens([10 ** 7]) == [None]
    msgs = [{"role": "user", "content": "Hi"}]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text == llm.chat(msgs, ssmserve.SamplingParams(max_tokens=1), use_tqdm=False)[0].prompt
    assert tok.apply_chat_template(msgs, add_generation_prompt=True) == tok.encode(text, add_special_tokens=False)
    assert tok.apply_chat_template([msgs, msgs], tokenize=False) == [tok.apply_chat_template(msgs, tokenize=False)] * 2
    enc = tok.apply_chat_template(msgs, add_generation_prompt=True, return_dict=True)
    assert enc.input_ids == tok.encode(text, add_special_tokens=False) and set(enc) == {"input_ids", "attention_mask"}
    with pytest.raises(ValueError, match="return_tensors"):
        tok.apply_chat_template(msgs, return_tensors="pt")
    # vLLM's prompt types and generate(lora_request=None).
    from ssmserve import TextPrompt, TokensPrompt
    p1 = ssmserve.SamplingParams(temperature=0, max_tokens=4)
    a = llm.generate(TokensPrompt(prompt_token_ids=out.prompt_token_ids), p1, use_tqdm=False, lora_request=None)[0]
    b = llm.generate(TextPrompt(prompt=PROMPTS[0]), p1, use_tqdm=False)[0]
    assert a.outputs[0].token_ids == b.outputs[0].token_ids == out.outputs[0].token_ids
    assert llm.generate([PROMPTS[0]] * 2, p1, use_tqdm=False, lora_request=[None, None])[1].outputs[0].token_ids == \
        out.outputs[0].token_ids
    with pytest.raises(NotImplementedError, match="LoRA"):
        llm.generate(PROMPTS[0], p1, lora_request=object())
    p = ssmserve.SamplingParams(temperature=0.9, max_tokens=8)
    q = p.clone()
    q.max_tokens = 3
    assert p.max_tokens == 8 and q.max_tokens == 3 and "temperature=0.9" in repr(p)
    runs = [ssmserve.LLM(str(MODEL), threads=2, seed=np_like(5)) for _ in range(2)]
    got = [[o.outputs[0].token_ids for o in r.generate(PROMPTS, p)] for r in runs]
    assert got[0] == got[1] and p.seed is None  # the caller's params are not modified
    with pytest.raises(ValueError, match="seed"):
        ssmserve.LLM(str(MODEL), seed=-1)
    with pytest.raises(TypeError, match="seed"):
        ssmserve.LLM(str(MODEL), seed="5")


class np_like:
    """An integer type that is not int (numpy.int64-like: only __index__)."""

    def __init__(self, v):
        self.v = v

    def __index__(self):
        return self.v


def test_chat_template_source_despite_a_broken_checkpoint_template(tmp_path):
    # LLM.chat(chat_template=...) only reads the checkpoint's bos / eos, so a checkpoint whose own template does not
    # parse can still be chatted with through the caller's template.
    for f in ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json"):
        (tmp_path / f).symlink_to(MODEL / f)
    cfg = json.loads((MODEL / "tokenizer_config.json").read_text())
    cfg["chat_template"] = "{% if %}"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    llm = ssmserve.LLM(str(tmp_path), threads=2)
    params = ssmserve.SamplingParams(temperature=0, max_tokens=2)
    msgs = [{"role": "user", "content": "Hi"}]
    assert llm.chat(msgs, params, chat_template="{{ bos_token }}{{ messages[0].content }}")[0].prompt == "<|endoftext|>Hi"
    with pytest.raises(ValueError, match="chat template"):
        llm.chat(msgs, params)


def test_chat_template_content_format(llm):
    # vLLM's chat_template_content_format: "auto" detects a template that loops over a message's content and gives it
    # the OpenAI list of text parts (a string content too); "string" joins parts with newlines. MiniMax-Text-01's
    # published template indexes content parts: it renders string content as jinja2 renders the parts.
    params = ssmserve.SamplingParams(temperature=0, max_tokens=1)
    minimax = open(os.path.join(os.path.dirname(__file__), "..", "data", "tokenizers", "chat", "minimax_text_01.jinja")).read()
    want = ("<beginning_of_sentence>system ai_setting=assistant\nS<end_of_sentence>\n<beginning_of_sentence>user "
            "name=user\nHi<end_of_sentence>\n<beginning_of_sentence>ai name=assistant\n")
    plain = [{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"}]
    parts = [{"role": m["role"], "content": [{"type": "text", "text": m["content"]}]} for m in plain]
    for msgs in (plain, parts):
        assert llm.chat(msgs, params, chat_template=minimax, use_tqdm=False)[0].prompt == want
        assert llm.get_tokenizer().apply_chat_template(msgs, chat_template=minimax, tokenize=False,
                                                       add_generation_prompt=True) == want
    looping = ("{% for m in messages %}{% if m.content is string %}S:{{ m.content }}{% else %}L:"
               "{% for p in m.content %}{{ p.text }};{% endfor %}{% endif %}|{% endfor %}")
    two = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    for fmt, want in (("auto", "L:a;b;|"), ("openai", "L:a;b;|"), ("string", "S:a\nb|")):
        assert llm.chat(two, params, chat_template=looping, chat_template_content_format=fmt,
                        add_generation_prompt=False, use_tqdm=False)[0].prompt == want, fmt
    with pytest.raises(ValueError, match="chat_template_content_format"):
        llm.chat(two, params, chat_template_content_format="parts")
    # vLLM's other text parts: plain strings, input_text / output_text, refusal, thinking.
    other = [{"role": "user", "content": ["a", {"type": "input_text", "text": "b"}, {"type": "thinking", "thinking": "c"}]}]
    assert llm.chat(other, params, chat_template=looping, add_generation_prompt=False,
                    use_tqdm=False)[0].prompt == "L:a;b;c;|"
    with pytest.raises(ValueError, match="only text content parts"):
        llm.chat([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], params)


def test_chat(llm, tmp_path):
    # vLLM's LLM.chat: the checkpoint's template (the bundled model has none: ssmserve's plain default, as serve).
    params = ssmserve.SamplingParams(temperature=0, max_tokens=8)
    out = llm.chat([{"role": "user", "content": "Hello"}], params)[0]
    assert out.prompt == "User: Hello\nAssistant:"
    assert out.outputs[0].token_ids == llm.generate("User: Hello\nAssistant:", params)[0].outputs[0].token_ids
    batch = llm.chat([[{"role": "user", "content": "Hello"}],
                      [{"role": "system", "content": "x"}, {"role": "user", "content": [{"type": "text", "text": "a"},
                                                                                        {"type": "text", "text": "b"}]}]],
                     params)
    assert [o.prompt for o in batch] == ["User: Hello\nAssistant:", "System: x\nUser: a\nb\nAssistant:"]
    assert batch[0].outputs[0].token_ids == out.outputs[0].token_ids
    src = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
    assert llm.chat([{"role": "user", "content": "Hi"}], params, chat_template=src)[0].prompt == "<user>Hi"
    (tmp_path / "t.jinja").write_text(src + "!")
    assert llm.chat([{"role": "user", "content": "Hi"}], params, chat_template=str(tmp_path / "t.jinja"))[0].prompt == "<user>Hi!"
    # continue_final_message: the prompt ends inside the final message (not with add_generation_prompt).
    prefill = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Well, "}]
    assert llm.chat(prefill, params, add_generation_prompt=False, continue_final_message=True)[0].prompt == \
        "User: Hello\nAssistant: Well, "
    with pytest.raises(ValueError, match="continue_final_message"):
        llm.chat(prefill, params, continue_final_message=True)
    # As transformers: the stripped content's last occurrence; a template that trims content drops the trailing
    # space (and an earlier message with the same text does not match).
    trim = "{% for m in messages %}<{{ m.role }}>{{ m.content | trim }}{% endfor %}"
    same = [{"role": "user", "content": "Sure, go"}, {"role": "assistant", "content": "Sure, "}]
    assert llm.chat(same, params, chat_template=trim, add_generation_prompt=False, continue_final_message=True)[0].prompt == \
        "<user>Sure, go<assistant>Sure,"
    # Template source sees the checkpoint's bos / eos strings, as the file form and `serve --chat-template` do.
    special = "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}{{ eos_token }}"
    assert llm.chat([{"role": "user", "content": "Hi"}], params, chat_template=special)[0].prompt == "<|endoftext|>Hi<|endoftext|>"
    (tmp_path / "s.jinja").write_text(special)
    assert llm.chat([{"role": "user", "content": "Hi"}], params, chat_template=str(tmp_path / "s.jinja"))[0].prompt == "<|endoftext|>Hi<|endoftext|>"
    with pytest.raises(TypeError, match="role"):
        llm.chat([{"content": "x"}], params)
    with pytest.raises(ValueError, match="not valid JSON"):
        llm.chat([{"role": "user", "content": "\udc80"}], params)
    with pytest.raises(ValueError, match="template line 1"):
        llm.chat([{"role": "user", "content": "x"}], params, chat_template="{% if %}")


def test_ctrl_c_interrupts_generate_and_stream(llm):
    # Python's signal handlers run between engine steps: Ctrl-C (here SIGALRM raising KeyboardInterrupt) stops a
    # long generate() / stream() at once and aborts its requests; the LLM stays usable.
    import signal

    def interrupt(*_):
        raise KeyboardInterrupt

    params = ssmserve.SamplingParams(temperature=0, max_tokens=100000, ignore_eos=True)
    ref = llm.generate(PROMPTS[0], ssmserve.SamplingParams(temperature=0, max_tokens=8))[0].outputs[0].text
    old = signal.signal(signal.SIGALRM, interrupt)
    try:
        for call in (lambda: llm.generate(PROMPTS, params), lambda: list(llm.stream(PROMPTS[0], params))):
            # A KeyboardInterrupt raised while a finalizer runs is swallowed by Python (an earlier test's client was
            # collected at that moment: CI, stop 64): collect first, and repeat the alarm until one lands.
            gc.collect()
            start = time.time()
            signal.setitimer(signal.ITIMER_REAL, 0.2, 0.2)
            with pytest.raises(KeyboardInterrupt):
                call()
            signal.setitimer(signal.ITIMER_REAL, 0)
            assert time.time() - start < 10
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert llm.generate(PROMPTS[0], ssmserve.SamplingParams(temperature=0, max_tokens=8))[0].outputs[0].text == ref


def test_max_model_len(llm, tmp_path):
    # LLM(max_model_len=N) as vLLM: prompt + generated tokens stop at N (finish_reason "length"), a prompt of N tokens
    # or more is a ValueError, and N above the model's context (max_position_embeddings) is refused.
    short = ssmserve.LLM(str(MODEL), max_num_seqs=2, threads=2, max_model_len=12)
    out = short.generate("Hello there", ssmserve.SamplingParams(temperature=0, max_tokens=50, ignore_eos=True))[0]
    assert len(out.prompt_token_ids) + len(out.outputs[0].token_ids) == 12 and out.outputs[0].finish_reason == "length"
    full = llm.generate("Hello there", ssmserve.SamplingParams(temperature=0, max_tokens=50, ignore_eos=True))[0]
    assert full.outputs[0].token_ids[:len(out.outputs[0].token_ids)] == out.outputs[0].token_ids
    # max_tokens=None (vLLM): no limit but max_model_len.
    unl = short.generate("Hello there", ssmserve.SamplingParams(temperature=0, max_tokens=None, ignore_eos=True))[0]
    assert unl.outputs[0].token_ids == out.outputs[0].token_ids and unl.outputs[0].finish_reason == "length"
    with pytest.raises(ValueError, match="max_model_len"):
        short.generate("word " * 20)
    with pytest.raises(ValueError, match="max_model_len"):
        ssmserve.LLM(str(MODEL), max_model_len=-1)
    ctx = tmp_path / "ctx16"
    ctx.mkdir()
    for f in MODEL.iterdir():
        if f.name != "config.json":
            (ctx / f.name).symlink_to(f)
    cfg = json.loads((MODEL / "config.json").read_text())
    cfg["max_position_embeddings"] = 16
    (ctx / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="max_model_len 20 is larger than the model's context of 16"):
        ssmserve.LLM(str(ctx), max_model_len=20)
    assert ssmserve.LLM(str(ctx), threads=2, max_model_len=16) is not None
    # A model without a context limit (tiny-mamba has no max_position_embeddings) gets serve's 8192, so that
    # max_tokens=None ends: an 8192-token prompt is refused, an 8191-token one leaves room for one token.
    with pytest.raises(ValueError, match="the context \\(max_model_len\\) is 8192"):
        llm.generate({"prompt_token_ids": [1] * 8192}, ssmserve.SamplingParams(max_tokens=None))
    out = llm.generate({"prompt_token_ids": [1] * 8191}, ssmserve.SamplingParams(max_tokens=None, ignore_eos=True))[0]
    assert len(out.outputs[0].token_ids) == 1 and out.outputs[0].finish_reason == "length"
    big = ssmserve.LLM(str(MODEL), max_num_seqs=1, threads=2, max_model_len=9000)
    assert big.generate({"prompt_token_ids": [1] * 8192}, ssmserve.SamplingParams(max_tokens=1))[0].finished


def test_sampling_params_types_as_vllm():
    """A bool is not an int and None is not a bool (a break test found skip_special_tokens=None read False and
    max_tokens=True read 1); token ids out of 32 bits are ValueErrors naming the field."""
    from ssmserve import SamplingParams

    for kw in (dict(skip_special_tokens=None), dict(ignore_eos=1), dict(include_stop_str_in_output="yes")):
        with pytest.raises(TypeError, match=f"SamplingParams.{next(iter(kw))} must be a bool"):
            SamplingParams(**kw)
    for name in ("n", "max_tokens", "min_tokens", "top_k", "seed"):  # logprobs True is 1 (vLLM)
        with pytest.raises(TypeError, match=f"SamplingParams.{name} must be an int, got True"):
            SamplingParams(**{name: True})
    with pytest.raises(TypeError, match="stop_token_ids must hold token ids"):
        SamplingParams(stop_token_ids=[True])
    for name in ("stop_token_ids", "allowed_token_ids"):
        with pytest.raises(ValueError, match=f"SamplingParams.{name}: token id {2**40} is out of the vocabulary range"):
            SamplingParams(**{name: [2**40]})
    p = SamplingParams(skip_special_tokens=False, ignore_eos=True, max_tokens=5, stop_token_ids=[1, 2])
    assert (p.skip_special_tokens, p.ignore_eos, p.max_tokens, p.stop_token_ids) == (False, True, 5, [1, 2])
    assert SamplingParams().skip_special_tokens is True
    # Assigning a field checks it as the constructor does (an empty allowed_token_ids was taken as "every token").
    p = SamplingParams()
    with pytest.raises(ValueError, match="allowed_token_ids must not be empty"):
        p.allowed_token_ids = []
    with pytest.raises(TypeError, match="SamplingParams.max_tokens must be an int, got True"):
        p.max_tokens = True
    with pytest.raises(TypeError, match="SamplingParams.ignore_eos must be a bool"):
        p.ignore_eos = "yes"
    with pytest.raises(AttributeError, match="no attribute 'max_token'"):
        p.max_token = 3
    p.stop, p.max_tokens, p.allowed_token_ids = "x", None, (3, 4)
    assert (p.stop, p.max_tokens, p.allowed_token_ids) == (["x"], 2**31 - 1, [3, 4])
    p.logit_bias, p.bad_words, p.stop_token_ids, p.allowed_token_ids = None, None, None, None
    assert (p.logit_bias, p.bad_words, p.stop_token_ids, p.allowed_token_ids) == ({}, [], [], [])

    class Tagged(SamplingParams):  # a subclass keeps its own attributes
        pass

    t = Tagged(max_tokens=3)
    t.tag = "mine"
    assert t.tag == "mine" and t.max_tokens == 3
    with pytest.raises(ValueError, match="allowed_token_ids must not be empty"):
        t.allowed_token_ids = []
