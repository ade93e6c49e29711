"""vLLM's LLM(...) / EngineArgs keywords that have no effect on this engine, and the checks of their values (the
CLI's counterparts: apps/vllm_compat_flags.cpp)."""

from typing import Any, Dict


def _is_bool(v) -> bool:
    return isinstance(v, bool) or (type(v).__module__ == "numpy" and type(v).__name__ in ("bool_", "bool"))


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


#: The most logprobs per token a request may ask for (the engine's kMaxLogprobs; vLLM's default max_logprobs).
_MAX_LOGPROBS = 20

# vLLM's LLM(...) / EngineArgs keywords that have no effect on this engine: keyword -> (the values that mean "no
# effect", as text; a test of a value; why). Any other value is a ValueError naming the keyword and the value.
_NO_EFFECT_ARGS = {
    "trust_remote_code": ("a bool", _is_bool, "no checkpoint code is ever run: every architecture is built in"),
    "disable_log_stats": ("a bool", _is_bool, "the offline engine logs no periodic stats"),
    "tokenizer_mode": ('"auto", "hf" or "slow"', lambda v: isinstance(v, str) and v in ("auto", "hf", "slow"),
                       "the tokenizer is always the checkpoint's tokenizer.json / tokenizer.model / tekken.json"),
    "revision": ("None", lambda v: v is None, "models are local folders"),
    "tokenizer_revision": ("None", lambda v: v is None, "tokenizers are local folders"),
    "code_revision": ("None", lambda v: v is None, "no checkpoint code is ever run"),
    "skip_tokenizer_init": ("False", lambda v: v is False, "the engine always loads its tokenizer"),
    "task": ('"auto" or "generate"', lambda v: isinstance(v, str) and v in ("auto", "generate"),
             "the models are generative only"),
    "runner": ('"auto" or "generate"', lambda v: isinstance(v, str) and v in ("auto", "generate"),
               "the models are generative only"),
    "enable_chunked_prefill": ("None or a bool", lambda v: v is None or _is_bool(v),
                               "prefill is always chunked, with the same results"),
    "async_scheduling": ("None or a bool", lambda v: v is None or _is_bool(v), "the engine schedules its own steps"),
    "scheduling_policy": ('"fcfs"', lambda v: isinstance(v, str) and v == "fcfs", "requests are served first come, first served"),
    "disable_log_requests": ("a bool", _is_bool, "request contents are never logged"),
    "enable_log_requests": ("a bool", _is_bool, "request contents are never logged"),
    "max_logprobs": (f"an int in [0, {_MAX_LOGPROBS}]", lambda v: _is_int(v) and 0 <= v <= _MAX_LOGPROBS,
                     f"the engine's cap is {_MAX_LOGPROBS} logprobs per token"),
    "kv_cache_dtype": ('"auto"', lambda v: v == "auto" and isinstance(v, str),
                       "attention KV pages take the model's dtype (mamba_cache_dtype sets the states')"),
    "block_size": ("None", lambda v: v is None, "KV page sizes follow the model (mamba_block_size sets the states')"),
    "cpu_offload_gb": ("0", lambda v: (_is_int(v) or isinstance(v, float)) and v == 0,
                       "weights are not offloaded (swap_space keeps cached states in host memory)"),
    "pipeline_parallel_size": ("1", lambda v: _is_int(v) and v == 1,
                               "no pipeline parallelism: tensor_parallel_size splits a model"),
    "data_parallel_size": ("1", lambda v: _is_int(v) and v == 1, "one engine per LLM"),
    "distributed_executor_backend": ('None, "mp" or "uni"', lambda v: v is None or (isinstance(v, str) and v in ("mp", "uni")),
                                     "tensor-parallel ranks are the engine's own threads"),
    "download_dir": ("None", lambda v: v is None, "models are local folders"),
    "hf_overrides": ("None or {}", lambda v: v is None or (isinstance(v, dict) and not v),
                     "the checkpoint's config.json is used as it is"),
    "compilation_config": ("None, a level (int) or a dict", lambda v: v is None or _is_int(v) or isinstance(v, dict),
                           "nothing is compiled with torch.compile"),
    "max_seq_len_to_capture": ("an int", _is_int, "CUDA graphs are captured for decode steps"),
    "disable_custom_all_reduce": ("a bool", _is_bool, "the all-reduce is the engine's own"),
    "model_impl": ('"auto"', lambda v: v == "auto" and isinstance(v, str), "every architecture is ssmserve's own"),
    "disable_async_output_proc": ("a bool", _is_bool, "outputs are processed in the engine step"),
    "enable_sleep_mode": ("False", lambda v: v is False, "there is no sleep mode"),
}


def _check_no_effect_args(args: Dict[str, Any]) -> int:
    """Checks vLLM's keywords that have no effect here (_NO_EFFECT_ARGS) among `args` (keyword -> value; other
    keywords are ignored): ValueError naming the keyword, its value and that ssmserve does not support it, for a value
    that would have an effect. Returns max_logprobs (default: the engine's cap)."""
    for k, v in args.items():
        rule = _NO_EFFECT_ARGS.get(k)
        if rule is None:
            continue
        what, ok, why = rule
        try:
            good = bool(ok(v))
        except Exception:  # noqa: BLE001 (a value whose comparison fails is not one of the accepted ones)
            good = False
        if not good:
            raise ValueError(f"{k}={v!r}"[:200] + f" is not supported by ssmserve: {k} must be {what} ({why})")
    return args.get("max_logprobs", _MAX_LOGPROBS)
