# The model's default sampling params in the Python API (vLLM's LLM.get_default_sampling_params, generation_config /
# override_generation_config): a SamplingParams with the checkpoint's generation_config.json values, used by
# generate / chat / stream / AsyncLLM.generate when no sampling_params is given; "vllm" turns them off; malformed
# values are a ValueError at LLM(...) naming the file and the field.
import asyncio
import json
import shutil

import pytest

from conftest import MODEL

import ssmserve  # installed by `pip install .` (scripts/test.sh does it)
from ssmserve import LLM, SamplingParams

PROMPT = "And the LORD said unto Moses,"
SAMPLING = dict(temperature=0.0, top_p=0.9, top_k=5, min_p=None, repetition_penalty=1.1, max_new_tokens=7)


def model_with(path, **sampling):
    """A copy of the bundled checkpoint whose generation_config.json also holds `sampling`."""
    d = path / "model"
    shutil.copytree(MODEL, d)
    cfg = json.loads((d / "generation_config.json").read_text())
    cfg.update(sampling)
    (d / "generation_config.json").write_text(json.dumps(cfg))
    return d


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return model_with(tmp_path_factory.mktemp("gen"), **SAMPLING)


@pytest.fixture(scope="module")
def llm(model_dir):
    return LLM(str(model_dir), threads=2)


def test_get_default_sampling_params(llm):
    p = llm.get_default_sampling_params()
    assert isinstance(p, SamplingParams)
    assert (p.temperature, p.top_p, p.top_k, p.repetition_penalty, p.max_tokens) == (0.0, 0.9, 5, 1.1, 7)
    assert p.min_p == SamplingParams().min_p  # null in the file: SamplingParams' default
    assert p == SamplingParams(temperature=0.0, top_p=0.9, top_k=5, repetition_penalty=1.1, max_tokens=7)
    assert llm.get_default_sampling_params() is not p  # a new one every call (callers may change it)


def test_generate_chat_and_stream_use_the_defaults(llm):
    p = llm.get_default_sampling_params()
    ref = llm.generate(PROMPT, p, use_tqdm=False)[0].outputs[0]
    assert 1 <= len(ref.token_ids) <= 7
    assert llm.generate(PROMPT, use_tqdm=False)[0].outputs[0].token_ids == ref.token_ids
    assert llm.generate([PROMPT, PROMPT], None, use_tqdm=False)[1].outputs[0].token_ids == ref.token_ids
    assert list(llm.stream(PROMPT))[-1].outputs[0].token_ids == ref.token_ids
    messages = [{"role": "user", "content": "Hello"}]
    assert (llm.chat(messages, use_tqdm=False)[0].outputs[0].token_ids ==
            llm.chat(messages, p, use_tqdm=False)[0].outputs[0].token_ids)
    # Explicit params are used as given (here: more tokens than the default 7).
    long = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True), use_tqdm=False)[0]
    assert len(long.outputs[0].token_ids) == 12


def test_async_llm_generate_uses_the_defaults(llm, model_dir):
    ref = llm.generate(PROMPT, use_tqdm=False)[0].outputs[0].token_ids

    async def run():
        with ssmserve.AsyncLLM(str(model_dir), threads=2) as engine:
            last = None
            async for out in engine.generate(PROMPT, request_id="r"):
                last = out
            return last.outputs[0].token_ids

    assert asyncio.run(run()) == ref


def test_vllm_mode_override_and_folder(model_dir, tmp_path):
    assert LLM(str(model_dir), threads=2, generation_config="vllm").get_default_sampling_params() == SamplingParams()
    p = LLM(str(model_dir), threads=2, override_generation_config={"temperature": 0.5, "top_k": None}).get_default_sampling_params()
    assert (p.temperature, p.top_k, p.top_p, p.max_tokens) == (0.5, SamplingParams().top_k, 0.9, 7)
    p = LLM(str(model_dir), threads=2, generation_config="vllm",
            override_generation_config={"max_new_tokens": 3}).get_default_sampling_params()
    assert p == SamplingParams(max_tokens=3)
    other = tmp_path / "cfg"
    other.mkdir()
    (other / "generation_config.json").write_text(json.dumps({"temperature": 0.25}))
    assert LLM(str(model_dir), threads=2, generation_config=other).get_default_sampling_params() == SamplingParams(temperature=0.25)
    args = ssmserve.EngineArgs(str(model_dir), threads=2, generation_config=str(other))
    assert args.generation_config == str(other)


def test_bundled_model_has_no_defaults():
    assert LLM(str(MODEL), threads=2).get_default_sampling_params() == SamplingParams()


def test_malformed_values_are_value_errors_naming_the_field(tmp_path):
    d = model_with(tmp_path, temperature="hot")
    with pytest.raises(ValueError) as e:
        LLM(str(d), threads=2)
    msg = str(e.value)
    assert f'{d / "generation_config.json"}: field "temperature" must be a number >= 0 (got "hot")' in msg, msg
    assert 'generation_config="vllm"' in msg and "--" not in msg, msg
    LLM(str(d), threads=2, generation_config="vllm")  # ignored: no error
    with pytest.raises(ValueError, match='override_generation_config: field "top_p" must be a number in \\(0, 1\\]'):
        LLM(str(MODEL), threads=2, override_generation_config={"top_p": 2})
    with pytest.raises(ValueError, match="generation_config .*: no such folder"):
        LLM(str(MODEL), threads=2, generation_config=str(tmp_path / "absent"))
    with pytest.raises(TypeError, match="override_generation_config must be None or a dict"):
        LLM(str(MODEL), threads=2, override_generation_config='{"top_p": 0.5}')
    with pytest.raises(TypeError, match="engine argument 'generation_config' cannot be 5"):
        LLM(str(MODEL), threads=2, generation_config=5)
