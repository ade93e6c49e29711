# LLM(...) / AsyncLLM engine arguments (issue 28): an error names the keyword argument as the caller spelt it
# (mamba_block_size, as vLLM's ValueError), never the CLI flag (--mamba-block-size), for every engine option; a bool,
# float, str or None where an int is wanted (and a bool for a float) is a TypeError naming the keyword, never taken
# silently (True is not 1).
import re

import pytest

from conftest import MODEL

import ssmserve  # installed by `pip install .` (scripts/test.sh does it)
from ssmserve import LLM

INT_ARGS = ["max_model_len", "max_num_seqs", "max_num_batched_tokens", "num_state_blocks", "threads", "num_threads",
            "tensor_parallel_size", "num_scheduler_steps", "mamba_block_size"]
FLOAT_ARGS = ["gpu_memory_utilization", "swap_space"]
STR_ARGS = ["tokenizer", "mamba_cache_dtype", "mamba_ssm_cache_dtype", "device", "mamba_cache_mode", "load_format",
            "generation_config", "quantization"]
FLAG = re.compile(r"--[a-z]")  # a CLI flag (--mamba-block-size) outside quoted command lines


def raises(exc, kw, **base):
    with pytest.raises(exc) as e:
        LLM(str(MODEL), **{"threads": 2, **base, **kw})
    return str(e.value)


# One bad value per engine option the Python LLM accepts: the ValueError names the keyword, not the flag.
BAD_VALUES = [
    (dict(max_model_len=-5), "max_model_len must be"),
    (dict(max_num_seqs=0), "max_num_seqs must be in [1, "),
    (dict(max_num_batched_tokens=0), "max_num_batched_tokens must be in [1, "),
    (dict(num_state_blocks=1), "num_state_blocks must be 0 (= max_num_seqs + 1)"),
    (dict(threads=-1), "threads must be in [0, "),
    (dict(num_threads=-1), "num_threads must be in [0, "),  # the alias as spelt
    (dict(tensor_parallel_size=0), "tensor_parallel_size must be in [1, "),
    (dict(num_scheduler_steps=0), "num_scheduler_steps must be in [1, "),
    (dict(mamba_block_size=-1), "mamba_block_size must be in [1, "),
    (dict(mamba_block_size=512, mamba_cache_mode="none"), "mamba_block_size needs prefix caching (enable_prefix_caching and a "
                                                          "mamba_cache_mode other than none)"),
    (dict(gpu_memory_utilization=1.5), "gpu_memory_utilization must be in (0, 1]"),
    (dict(swap_space=-1), "swap_space must be >= 0 GiB"),
    (dict(swap_space=float("nan")), "swap_space must be >= 0 GiB"),
    (dict(mamba_cache_dtype="int3"), "mamba_cache_dtype"),
    (dict(mamba_ssm_cache_dtype="int3"), "mamba_ssm_cache_dtype"),
    (dict(mamba_cache_mode="some"), 'mamba_cache_mode must be none, align or all (got "some")'),
    (dict(device="tpu"), "device tpu"),
    (dict(quantization="gguf"), 'quantization must be fp8, compressed-tensors, modelopt, gptq'),
    (dict(quantization="awq"), 'quantization awq: '),  # the bundled model is not quantized
    (dict(quantization="fp8"), "quantization fp8: "),  # the bundled model is not quantized
    (dict(load_format="pickle"), 'load_format must be auto, safetensors or dummy (got "pickle")'),
    (dict(speculative_config={"method": "ngram"}), "num_speculative_tokens"),
    (dict(num_state_blocks=2), "num_state_blocks 2 leaves 1 usable block"),  # raised while the engine is built
    (dict(generation_config="/nonexistent-folder"), "generation_config /nonexistent-folder: no such folder"),
    (dict(override_generation_config={"temperature": -1}),
     'override_generation_config: field "temperature" must be a number >= 0 (got -1)'),
]


@pytest.mark.parametrize("kw,needle", BAD_VALUES, ids=[next(iter(k)) + "=" + repr(next(iter(k.values()))) for k, _ in BAD_VALUES])
def test_bad_values_name_the_keyword(kw, needle):
    base = {} if "threads" in kw or "num_threads" in kw else {"threads": 2}
    with pytest.raises(ValueError) as e:
        LLM(str(MODEL), **base, **kw)
    msg = str(e.value)
    assert needle in msg, msg
    assert not FLAG.search(re.sub(r"`[^`]*`", "", msg)), f"names a CLI flag: {msg}"


def test_negated_flag_and_quoted_command_lines():
    """--no-enable-prefix-caching reads enable_prefix_caching=False; a quoted command line keeps its flags."""
    msg = raises(ValueError, dict(num_state_blocks=2))
    assert "raise num_state_blocks, or pass enable_prefix_caching=False" in msg, msg
    msg = raises(ValueError, dict(speculative_config={"method": "replay", "num_speculative_tokens": 2}))
    assert msg.startswith("speculative_config: method") and "`ssmserve bench latency --speculative-config" in msg, msg


@pytest.mark.parametrize("name", INT_ARGS + FLOAT_ARGS)
def test_bools_are_not_numbers(name):
    for v in (True, False):
        base = {} if name in ("threads", "num_threads") else {"threads": 2}
        with pytest.raises(TypeError, match=f"engine argument '{name}' cannot be {v} \\(bool\\): it must be an? (int|float)"):
            LLM(str(MODEL), **base, **{name: v})


@pytest.mark.parametrize("name", INT_ARGS)
def test_int_arguments_take_ints_only(name):
    base = {} if name in ("threads", "num_threads") else {"threads": 2}
    for v in (2.0, 1.5, "8", b"8", [8], object()):
        with pytest.raises(TypeError, match=f"engine argument '{name}' cannot be .*: it must be an int"):
            LLM(str(MODEL), **base, **{name: v})
    with pytest.raises(ValueError, match=f"engine argument '{name}' is out of range: 1099511627776 does not fit in a 32-bit int"):
        LLM(str(MODEL), **base, **{name: 2**40})


@pytest.mark.parametrize("name", FLOAT_ARGS)
def test_float_arguments_take_numbers_only(name):
    for v in ("0.5", b"1", [0.5], None.__class__):
        with pytest.raises(TypeError, match=f"engine argument '{name}' cannot be .*: it must be a float"):
            LLM(str(MODEL), threads=2, **{name: v})
    with pytest.raises(ValueError, match=f"engine argument '{name}' is out of range"):
        LLM(str(MODEL), threads=2, **{name: 10**400})


@pytest.mark.parametrize("name", STR_ARGS)
def test_str_arguments_take_strs_only(name):
    for v in (5, True, 1.5):
        with pytest.raises(TypeError, match=f"{name}"):
            LLM(str(MODEL), threads=2, **{name: v})


def test_enable_prefix_caching_takes_a_bool_only():
    for v in (1, 0, "yes", 1.0):
        with pytest.raises(TypeError, match="engine argument 'enable_prefix_caching' cannot be .*: it must be a bool"):
            LLM(str(MODEL), threads=2, enable_prefix_caching=v)


def test_seed_takes_an_int_not_a_bool():
    with pytest.raises(TypeError, match="seed must be None or an int, got bool"):
        LLM(str(MODEL), threads=2, seed=True)


def test_good_values_still_work():
    """Ints (also numpy-style __index__ objects), ints for floats, bools and None (the default) are accepted."""
    class Index:
        def __index__(self):
            return 2

    llm = LLM(str(MODEL), threads=Index(), max_num_seqs=4, gpu_memory_utilization=1, swap_space=0,
              enable_prefix_caching=True, mamba_block_size=None, max_model_len=None)
    out = llm.generate("Hello", ssmserve.SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)[0]
    assert out.finished and len(out.outputs[0].token_ids) == 2


def test_async_engine_args_name_the_keyword():
    from ssmserve import AsyncLLM

    with pytest.raises(TypeError, match="engine argument 'mamba_block_size' cannot be True"):
        AsyncLLM(str(MODEL), threads=2, mamba_block_size=True)
    with pytest.raises(ValueError) as e:
        AsyncLLM(str(MODEL), threads=2, mamba_block_size=-1)
    assert str(e.value).startswith("mamba_block_size must be in [1, "), str(e.value)


def test_errors_while_generating_name_keywords_too():
    """Errors raised after construction (here: a hybrid's prompt beyond the block pool) are SsmserveError (a ValueError)
    naming the keyword that fixes them."""
    import os
    from pathlib import Path

    hybrid = Path(os.environ.get("SSMSERVE_MODELS_DIR", MODEL.parents[2] / "shared" / "models")) / "tiny-minimax"
    if not (hybrid / "config.json").exists():
        pytest.skip(f"no {hybrid}")
    llm = LLM(str(hybrid), threads=1, num_state_blocks=4, enable_prefix_caching=False)
    with pytest.raises(ssmserve.SsmserveError, match="raise num_state_blocks$"):
        llm.generate("word " * 2000, ssmserve.SamplingParams(max_tokens=2), use_tqdm=False)


def test_hybrid_pool_bounds_are_checked_when_the_engine_is_built():
    """As `ssmserve generate` / `serve`: a max_model_len one request's KV blocks cannot hold, and a hybrid pool without
    room for one request, are ValueErrors naming the keywords when LLM(...) is built (a break test found both accepted,
    the first silently cut every request short)."""
    hybrid = MODEL.parents[1] / "tests" / "data" / "tiny-hybrids" / "tiny-bamba"  # dummy weights, KV blocks of 128
    base = dict(load_format="dummy", threads=2, enable_prefix_caching=False)
    with pytest.raises(ValueError) as e:
        LLM(str(hybrid), **base, num_state_blocks=4, max_model_len=257)
    msg = str(e.value)
    assert "max_model_len 257 does not fit in the block pool" in msg and "raise num_state_blocks or lower max_model_len" in msg, msg
    assert not FLAG.search(msg), msg
    LLM(str(hybrid), **base, num_state_blocks=4, max_model_len=256)  # exactly the pool
    with pytest.raises(ValueError) as e:
        LLM(str(hybrid), **base, num_state_blocks=2)
    assert "num_state_blocks 2 leaves 1 usable block" in str(e.value) and "hybrid" in str(e.value), str(e.value)


def test_numpy_bools_are_bools():
    np = pytest.importorskip("numpy")
    LLM(str(MODEL), threads=2, enable_prefix_caching=np.bool_(False))
    assert ssmserve.SamplingParams(ignore_eos=np.bool_(True)).ignore_eos is True


def test_two_spellings_of_one_option_are_refused():
    with pytest.raises(TypeError, match="LLM\\(\\) got both 'threads' and 'num_threads', which set the same engine option"):
        LLM(str(MODEL), threads=1, num_threads=2)


def test_errors_quoting_non_utf8_bytes_are_ssmserve_errors(tmp_path):
    """A broken checkpoint whose error message quotes bytes that are not UTF-8 (a config.json saved as UTF-16, a
    safetensors header with an ill-formed key) is an SsmserveError, not a UnicodeDecodeError (break test)."""
    import struct

    utf16 = tmp_path / "utf16"
    utf16.mkdir()
    for f in MODEL.iterdir():
        (utf16 / f.name).symlink_to(f)
    (utf16 / "config.json").unlink()
    (utf16 / "config.json").write_bytes((MODEL / "config.json").read_text().encode("utf-16"))
    with pytest.raises(ssmserve.SsmserveError, match=r"config.json: invalid JSON at byte 0 .*\\xFF"):
        LLM(str(utf16), threads=2)

    bad_key = tmp_path / "bad_key"
    bad_key.mkdir()
    for f in MODEL.iterdir():
        if f.name != "model.safetensors":
            (bad_key / f.name).symlink_to(f)
    raw = (MODEL / "model.safetensors").read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = raw[8:8 + n]
    name = next(k for k in __import__("json").loads(header) if k != "__metadata__").encode()
    header = header.replace(b'"' + name + b'"', b'"' + name[:-1] + b'\xc3"', 1)
    (bad_key / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + raw[8 + n:])
    with pytest.raises(ssmserve.SsmserveError, match="safetensors header is not valid JSON"):
        LLM(str(bad_key), threads=2)


def test_log_lines_name_keywords_not_flags(capfd):
    """The engine's log lines name LLM(...) keywords as its errors do (swap_space, not --swap-space)."""
    try:
        LLM(str(MODEL), threads=2, swap_space=1, log_level="info")
        err = capfd.readouterr().err
    finally:
        ssmserve._ssmserve.set_log_level("warning")
    assert "swap_space: no effect" in err, err  # without prefix caching, or on the CPU's host-memory pool
    assert "--swap-space" not in err, err
