"""ssmserve: inference for recurrent-state language models (Mamba-1, Mamba-2, hybrids) with vLLM's offline and
async APIs.

    from ssmserve import LLM, SamplingParams
    llm = LLM("models/tiny-mamba")
    out = llm.generate(["In the beginning"], SamplingParams(temperature=0, max_tokens=32))
    print(out[0].outputs[0].text)

    from ssmserve import AsyncLLM, AsyncEngineArgs
    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(model="models/tiny-mamba"))
    async for out in engine.generate("In the beginning", SamplingParams(max_tokens=32), request_id="r1"):
        print(out.outputs[0].text)

The C++ engine runs with the GIL released. The `ssmserve` console command (serve / generate / bench) is the CLI
binary shipped in the package (ssmserve/bin/ssmserve).
"""
import json
import operator
import os
import threading
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, TypedDict, Union

# libgomp reads its wait policy when it is loaded (importing the extension below): the same short-spin default as
# the ssmserve binary on busy cores (src/core/openmp_env.h), unless the user chose one.
def _cores_busy() -> bool:
    try:
        return os.getloadavg()[0] >= (os.cpu_count() or 1)
    except OSError:
        return False


if not any(v in os.environ for v in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "SSMSERVE_NO_OMP_DEFAULTS")) and _cores_busy():
    os.environ["GOMP_SPINCOUNT"] = "1000"

from . import _ssmserve  # noqa: E402
from .outputs import CompletionOutput, RequestMetrics, RequestOutput
from .sampling_params import RequestOutputKind, SamplingParams, _check_bool  # noqa: E402
from .vllm_args import _MAX_LOGPROBS, _NO_EFFECT_ARGS, _check_no_effect_args, _is_bool, _is_int  # noqa: E402,F401

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "RequestMetrics", "Logprob", "SsmserveError",
           "Tokenizer", "AsyncLLM", "AsyncEngineArgs", "EngineArgs", "has_cuda", "has_structured_outputs", "TextPrompt",
           "TokensPrompt", "RequestOutputKind"]
__version__ = "0.1.0"

Logprob = _ssmserve.Logprob
SsmserveError = _ssmserve.SsmserveError
#: True when the package was built with the CUDA backend (`pip install .` with nvcc found; device="cuda").
has_cuda = bool(getattr(_ssmserve, "has_cuda", False))
#: True when the package was built with structured outputs (xgrammar: SamplingParams.structured_outputs); without them
#: a request that asks for them is refused with an SsmserveError saying so.
has_structured_outputs = bool(getattr(_ssmserve, "has_structured_outputs", False))



class TextPrompt(TypedDict):
    """vLLM's TextPrompt: {"prompt": str} (a plain dict works the same)."""
    prompt: str


class TokensPrompt(TypedDict, total=False):
    """vLLM's TokensPrompt: {"prompt_token_ids": [int], "prompt": str (optional, for echo)} (a plain dict works)."""
    prompt_token_ids: List[int]
    prompt: str


PromptType = Union[str, Sequence[int], TextPrompt, TokensPrompt, dict]

_LOG_LEVELS = ("trace", "debug", "info", "warning", "warn", "error", "critical", "off")


def _set_log_level(level, where: str) -> None:
    """Sets the engine's (process-wide) log level; TypeError / ValueError naming `where` for a bad one."""
    if not isinstance(level, str):
        raise TypeError(f"{where} must be a str (one of {', '.join(_LOG_LEVELS)}), got {type(level).__name__}")
    if level.lower() not in _LOG_LEVELS:
        raise ValueError(f"{where} must be one of {', '.join(_LOG_LEVELS)}, got {level!r}")
    _ssmserve.set_log_level(level.lower())


# The engine's log lines (state pool size, prefix caching, ...) print at "warning" and above by default, as the CLI's
# --log-level; SSMSERVE_LOG_LEVEL=info (or debug, ...) shows more, and LLM(log_level=...) sets it too.
try:
    _set_log_level(os.environ.get("SSMSERVE_LOG_LEVEL", "warning"), "SSMSERVE_LOG_LEVEL")
except ValueError as _e:
    import warnings

    warnings.warn(f"{_e}; using warning", RuntimeWarning, stacklevel=2)
    _set_log_level("warning", "SSMSERVE_LOG_LEVEL")


def _splitmix64(x: int) -> int:
    """SplitMix64 (Steele et al., 2014): a 64-bit mix of x."""
    m = 2**64 - 1
    z = (x + 0x9E3779B97F4A7C15) & m
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    return z ^ (z >> 31)


def _is_text_part(p) -> bool:
    """Whether a content part is one vLLM reads as text (the engine's chat_part_text): a str, or a dict of type text /
    input_text / output_text ("text"), refusal ("refusal") or thinking ("thinking") holding a str."""
    if isinstance(p, str):
        return True
    if not isinstance(p, dict):
        return False
    kind = p.get("type")
    key = {"text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal",
           "thinking": "thinking"}.get(kind) if isinstance(kind, str) else None
    return key is not None and isinstance(p.get(key), str)


def _chat_message(m) -> dict:
    """One chat message as the server takes it: {"role": str, "content": str, a list of text parts or None, ...}; the
    chat template gets the content joined or as parts, as its content format wants."""
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
        raise TypeError(f"each chat message must be a dict with a str 'role', got {m!r}"[:300])
    content = m.get("content")
    if isinstance(content, (list, tuple)):
        if not all(_is_text_part(p) for p in content):
            raise ValueError('only text content parts are supported ({"type": "text", "text": ...}, input_text, '
                             'output_text, refusal, thinking, or a plain string)')
        return dict(m, content=list(content))
    if content is not None and not isinstance(content, str):
        raise TypeError(f"message content must be a str or a list of text parts, got {type(content).__name__}")
    return dict(m)


_CONTENT_FORMATS = ("auto", "string", "openai")


def _render_chats(engine, messages, chat_template, add_generation_prompt, continue_final_message, tools,
                  chat_template_kwargs, where: str, content_format: str = "auto") -> List[str]:
    """The prompt text of each conversation in `messages` (one conversation or a list of them), rendered as
    LLM.chat documents (the checks and errors of its arguments; `where` names the caller in them)."""
    add_generation_prompt = _check_bool(add_generation_prompt, f"{where} add_generation_prompt")
    continue_final_message = _check_bool(continue_final_message, f"{where} continue_final_message")
    if continue_final_message and add_generation_prompt:
        raise ValueError("cannot set both continue_final_message and add_generation_prompt to True")
    if not isinstance(messages, (list, tuple)) or not messages:
        raise TypeError(f"{where} takes a non-empty list of messages (or a list of such lists)")
    if isinstance(chat_template, os.PathLike):
        chat_template = os.fspath(chat_template)
    if chat_template is not None and not isinstance(chat_template, str):
        raise TypeError(f"chat_template must be a str (Jinja source or a file path), got {type(chat_template).__name__}")
    if chat_template is not None and not any(c in chat_template for c in "{}\n"):
        # vLLM's rule: a string without Jinja's characters is a file path, and one that cannot be read is an error
        # (not template text).
        try:
            with open(chat_template, "rb"):
                pass
        except OSError as e:
            raise ValueError(f"chat_template {chat_template!r} looks like a file path, but it failed to be "
                             f"opened: {e.strerror or e}") from None
    if content_format not in _CONTENT_FORMATS:
        raise ValueError(f"chat_template_content_format must be one of {', '.join(_CONTENT_FORMATS)}, "
                         f"got {content_format!r}")
    if chat_template_kwargs is not None and not isinstance(chat_template_kwargs, dict):
        raise TypeError("chat_template_kwargs must be a dict of template variables, got "
                        f"{type(chat_template_kwargs).__name__}")
    if tools is not None and not isinstance(tools, (list, tuple)):
        raise TypeError(f"tools must be a list of tool schemas (dicts), got {type(tools).__name__}")
    try:
        kwargs_json = json.dumps(chat_template_kwargs) if chat_template_kwargs else ""
        tools_json = json.dumps(list(tools)) if tools is not None else ""
    except (TypeError, ValueError) as e:
        raise TypeError(f"chat_template_kwargs and tools must be JSON-serializable: {e}") from None
    conversations = messages if isinstance(messages[0], (list, tuple)) else [messages]
    return [engine.render_chat(json.dumps([_chat_message(m) for m in conv]), add_generation_prompt, chat_template,
                               continue_final_message, kwargs_json, tools_json, content_format)
            for conv in conversations]


# LLM(...) keyword arguments beyond the named ones that the engine takes: vLLM's EngineArgs that its LLM takes through
# **kwargs (generation_config, override_generation_config) and ssmserve's own (as the CLI's flags).
_SSMSERVE_ENGINE_ARGS = ("num_state_blocks", "threads", "num_threads", "mamba_cache_dtype", "mamba_ssm_cache_dtype",
                         "num_scheduler_steps", "mamba_cache_mode", "mamba_block_size", "swap_space", "log_level",
                         "quantization", "enforce_eager",
                         "generation_config", "override_generation_config")


def _check_no_lora(lora_request) -> None:
    """vLLM's lora_request (one, or one per prompt): None only; NotImplementedError for an adapter."""
    requests = lora_request if isinstance(lora_request, (list, tuple)) else [lora_request]
    if any(r is not None for r in requests):
        raise NotImplementedError("lora_request: LoRA adapters are not supported by ssmserve")


def _check_process(pid: int, what: str = "LLM") -> None:
    """RuntimeError when called in another process than the one (pid) that created the engine: after os.fork() the
    child has none of the engine's threads (libgomp's pool, the AsyncLLM loop), so using it would hang."""
    if os.getpid() != pid:
        raise RuntimeError(f"this {what} was created in process {pid}; an LLM cannot be used across fork(): create it "
                           "in the child, or use the 'spawn' start method (multiprocessing.set_start_method('spawn'))")


def _check_seed(seed) -> Optional[int]:
    if seed is None:
        return None
    if isinstance(seed, bool):  # an int subclass: True is not a seed (vLLM's strict int)
        raise TypeError("seed must be None or an int, got bool")
    try:
        seed = operator.index(seed)
    except TypeError:
        raise TypeError(f"seed must be None or an int, got {type(seed).__name__}") from None
    if not 0 <= seed < 2**64:
        raise ValueError(f"seed must be None or an integer in [0, 2**64), got {seed}")
    return seed


def _dtype_name(dtype):
    """vLLM's dtype argument as the engine's name: a torch.dtype becomes its name (torch.float32 / torch.float ->
    "float32", torch.bfloat16 -> "bfloat16", torch.float16 / torch.half -> "float16", which the engine refuses as it
    refuses the str); anything else is returned as given (the engine checks it: a str, else a TypeError naming
    dtype). Recognised by type (torch.dtype) and its str "torch.<name>", so torch is never imported here."""
    t = type(dtype)
    if t.__module__ == "torch" and t.__name__ == "dtype":
        name = str(dtype)
        return name[len("torch."):] if name.startswith("torch.") else name
    return dtype


def _make_engine(model, tokenizer, dtype, max_model_len, max_num_seqs, max_num_batched_tokens, gpu_memory_utilization,
                 tensor_parallel_size, enable_prefix_caching, speculative_config, device, load_format, extra):
    """The C++ engine of LLM / AsyncLLM: vLLM's named arguments (None = the engine's default) plus ssmserve's own
    (extra). TypeError for an unknown name or a wrong type (a bool, float or str for an int option, ...), ValueError
    for a bad value or a missing model folder; either names the keyword argument (the engine's checks name its options
    as the CLI flags, respelt by the module as keywords: "mamba_block_size must be ...")."""
    if speculative_config is not None and not isinstance(speculative_config, dict):
        raise TypeError("speculative_config must be None or a dict such as {'method': 'ngram', "
                        f"'num_speculative_tokens': 4}}, got {type(speculative_config).__name__}")
    if not isinstance(model, (str, os.PathLike)):
        raise TypeError(f"model must be a str (a checkpoint folder), got {type(model).__name__}")
    if tokenizer is not None and not isinstance(tokenizer, (str, os.PathLike)):
        raise TypeError(f"tokenizer must be None or a str (a folder with tokenizer.json), got {type(tokenizer).__name__}")
    model = _ssmserve.resolve_model_path(os.fspath(model))  # a Hugging Face id: its snapshot in the hub cache
    if not os.path.isdir(model):
        raise ValueError(f"model folder {model!r} does not exist (LLM(model=...) takes a local checkpoint folder "
                         "with config.json, or a Hugging Face id already in the local hub cache)")
    for k in extra:
        if k not in _SSMSERVE_ENGINE_ARGS:
            raise TypeError(f"LLM() got an unexpected keyword argument '{k}'")
    extra = dict(extra)
    if isinstance(extra.get("generation_config"), os.PathLike):
        extra["generation_config"] = os.fspath(extra["generation_config"])
    override = extra.get("override_generation_config")
    if override is not None:  # vLLM's dict, e.g. {"temperature": 0.5}; the engine takes its JSON text
        if not isinstance(override, dict):
            raise TypeError("override_generation_config must be None or a dict such as {'temperature': 0.5}, got "
                            f"{type(override).__name__}")
        try:
            extra["override_generation_config"] = json.dumps(override)
        except (TypeError, ValueError) as e:
            raise TypeError(f"override_generation_config must be JSON-serializable: {e}") from None
    named = dict(tokenizer=None if tokenizer is None else os.fspath(tokenizer), dtype=_dtype_name(dtype), max_model_len=max_model_len,
                 max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                 gpu_memory_utilization=gpu_memory_utilization, tensor_parallel_size=tensor_parallel_size,
                 enable_prefix_caching=enable_prefix_caching, device=device, load_format=load_format,
                 speculative_config=None if speculative_config is None else json.dumps(speculative_config))
    args = {k: v for k, v in named.items() if v is not None}
    args.update((k, v) for k, v in extra.items() if v is not None)  # None: the engine's default, as for vLLM's names
    if "log_level" in args:  # process-wide (spdlog's level), set before the engine logs its setup
        _set_log_level(args.pop("log_level"), "log_level")
    return _ssmserve.Engine(model, **args)


class _Seeder:
    """vLLM's engine seed and max_logprobs, applied to each request's SamplingParams: requests without a seed get
    seeds derived from the engine seed and a running count (splitmix64, so they do not coincide with small explicit
    seeds); a request asking for more logprobs than max_logprobs is refused. Thread-safe."""

    def __init__(self, seed: Optional[int], max_logprobs: int = _MAX_LOGPROBS):
        self.seed = seed
        self.max_logprobs = max_logprobs
        self._count = 0
        self._lock = threading.Lock()

    def __call__(self, p):
        """p, or a copy seeded from the engine seed when p has none. ValueError (vLLM's message) when p.logprobs or
        p.prompt_logprobs exceeds max_logprobs."""
        for name, what in (("logprobs", "sample"), ("prompt_logprobs", "prompt")):
            n = getattr(p, name)
            if n is not None and n > self.max_logprobs:
                raise ValueError(f"Requested {what} logprobs of {n}, which is greater than max allowed: "
                                 f"{self.max_logprobs} (LLM(max_logprobs=...))")
        if self.seed is None or p.seed is not None:
            return p
        with self._lock:
            i = self._count
            self._count += 1
        q = p.clone()
        q.seed = _splitmix64(_splitmix64(self.seed) + i)  # choices of n > 1 use seed + c (the engine)
        return q


def _progress_bar(use_tqdm, total: int):
    """The tqdm bar of generate(use_tqdm=...): None when off, tqdm is not installed, or there is nothing to do."""
    if not use_tqdm or total == 0:
        return None
    if callable(use_tqdm):  # vLLM: a tqdm-like class to use instead
        return use_tqdm(total=total, desc="Processed prompts", dynamic_ncols=True)
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pip install tqdm (a dependency of the package; absent only in hand-made installs)
        return None
    return tqdm(total=total, desc="Processed prompts", dynamic_ncols=True)


def _as_prompt_list(prompts) -> list:
    """generate()'s prompts as a list: one prompt (str, dict, list of int) becomes a list of one."""
    if isinstance(prompts, (str, dict)):
        return [prompts]
    if isinstance(prompts, (list, tuple)):
        if prompts and isinstance(prompts[0], int) and not isinstance(prompts[0], bool):
            return [list(prompts)]
        return list(prompts)
    return [prompts]  # anything else: the engine's TypeError names what a prompt may be


def _is_text_prompt(p) -> bool:
    """True when the prompt carries its text (a str, or a dict with "prompt"): RequestOutput.prompt is that text;
    for token ids alone it is None (vLLM)."""
    return isinstance(p, str) or (isinstance(p, dict) and p.get("prompt") is not None)


def _check_params(p):
    if not isinstance(p, _ssmserve.SamplingParams):
        raise TypeError(f"sampling_params must be a SamplingParams or a list of them, got {type(p).__name__}")
    return p


class LLM:
    """vLLM's offline LLM: loads a checkpoint folder and runs batches of prompts with continuous batching.

    vLLM's arguments (None = the engine's default):
      model: the checkpoint folder (config.json, *.safetensors, tokenizer.json), or a Hugging Face id ("org/name")
        already in the local hub cache (HF_HUB_CACHE / HF_HOME; never downloaded); a missing folder is a ValueError.
      tokenizer: a folder with tokenizer.json (default: the model folder).
      dtype: the weights' dtype: "auto" (the GPU: bfloat16; the CPU: as stored), "bfloat16", "float32" or "float",
        or (as vLLM) a torch.dtype (torch.bfloat16, torch.float32); the CPU computes in fp32 whatever it is. "half" /
        "float16" / torch.float16 (no fp16 kernels) and other names are a ValueError, other types a TypeError.
      seed: the engine seed (0 by default, as vLLM's ModelConfig.seed): requests without their own
        SamplingParams.seed get seeds derived from it, so a script's sampled outputs repeat from run to run; None:
        unseeded requests differ every run.
      max_model_len: most prompt + generated tokens per request (default: the model's max_position_embeddings, or
        8192 as `serve` for models without a limit); generation stops there with finish_reason "length", a prompt of
        max_model_len tokens or more is a ValueError.
      max_num_seqs: most requests in one batch. max_num_batched_tokens: most tokens one engine step computes.
      gpu_memory_utilization: share of GPU memory the engine may take (0.9).
      tensor_parallel_size: ranks the model is split over (in-process threads on the CPU, GPUs with NCCL).
      enable_prefix_caching: reuse the state of a cached prompt prefix (default True, as vLLM);
        RequestOutput.num_cached_tokens says how many tokens it saved.
      speculative_config: vLLM's speculative decoding config, e.g. {"method": "ngram", "num_speculative_tokens": 4,
        "prompt_lookup_max": 4} or {"method": "draft_model", "model": DIR, "num_speculative_tokens": 4} (CPU);
        None = off. The outputs equal those without it; a bad config raises ValueError naming the field.
      device: "auto" (the GPU when the package has the CUDA backend and a GPU is present, else the CPU), "cuda" or
        "cpu". load_format: "auto", "safetensors" or "dummy" (random weights from config.json).
      generation_config: where the default sampling params come from (get_default_sampling_params, used by
        generate / chat / stream without sampling_params): "auto" (the default: the model folder's
        generation_config.json, its temperature, top_p, top_k, min_p, repetition_penalty and max_new_tokens ->
        max_tokens), "vllm" (none: SamplingParams()'s) or a folder holding generation_config.json.
        override_generation_config: a dict merged over it, e.g. {"temperature": 0.5} (with "vllm" only these).
        A malformed value in either is a ValueError naming the file (or override_generation_config) and the field.
      enforce_eager: no CUDA graphs (vLLM's): every GPU step's kernels launched one by one (the same results, slower
        decode); no effect on the CPU.
      max_logprobs: the most logprobs / prompt_logprobs a request may ask for (20, the engine's cap, and the
        default; more, or -1, is a ValueError saying the cap); a request asking for more is a ValueError.
    vLLM's keywords that have no effect here are taken at values that mean "no effect" (any other value is a
    ValueError naming the keyword, the value and that ssmserve does not support it): trust_remote_code,
    disable_log_stats,
    disable_custom_all_reduce, disable_async_output_proc, disable_log_requests, enable_log_requests (bools);
    tokenizer_mode ("auto" / "hf" / "slow"); revision, tokenizer_revision, code_revision, download_dir, block_size
    (None); skip_tokenizer_init, enable_sleep_mode (False); task, runner ("auto" / "generate"); enable_chunked_prefill
    (None or a bool: prefill is always chunked, with the same results), async_scheduling (None or a bool);
    scheduling_policy ("fcfs");
    kv_cache_dtype, model_impl ("auto"); cpu_offload_gb (0); pipeline_parallel_size, data_parallel_size (1);
    distributed_executor_backend (None, "mp", "uni"); hf_overrides (None / {}); compilation_config (None, a level or a
    dict: nothing is compiled); max_seq_len_to_capture (an int).
    ssmserve's own (the CLI's flags): threads (CPU threads, default all cores), num_state_blocks,
    mamba_cache_dtype, mamba_ssm_cache_dtype, num_scheduler_steps (multi-step decode), mamba_cache_mode ("all",
    "align" or "none"), mamba_block_size (tokens per cached state) and swap_space (GiB of host memory for cached
    states); None for any of them is the engine's default. log_level: the engine's log level for the whole process
    ("trace", "debug", "info", "warning", "error", "critical" or "off"; default "warning", or the
    SSMSERVE_LOG_LEVEL environment variable read at import). Unknown keyword arguments are a TypeError; so is a value of
    the wrong type, naming the keyword (int options take an int, not a bool, float or str; float options an int or a
    float, not a bool; enable_prefix_caching a bool). Bad values are a ValueError naming the keyword.
    One LLM may be used from several threads: their requests batch together in the one engine."""

    def __init__(self, model: str, *, tokenizer: Optional[str] = None, dtype: str = "auto", seed: Optional[int] = 0,
                 max_model_len: Optional[int] = None, max_num_seqs: Optional[int] = None,
                 max_num_batched_tokens: Optional[int] = None, gpu_memory_utilization: float = 0.9,
                 tensor_parallel_size: int = 1, enable_prefix_caching: Optional[bool] = None,
                 speculative_config: Optional[dict] = None, device: str = "auto", load_format: str = "auto",
                 **kwargs):
        seed = _check_seed(seed)
        max_logprobs = _check_no_effect_args(kwargs)
        kwargs = {k: v for k, v in kwargs.items() if k not in _NO_EFFECT_ARGS}
        self._pid = os.getpid()  # an LLM is used only in this process (not in a fork()ed child: _check_process)
        self._engine = _make_engine(model, tokenizer, dtype, max_model_len, max_num_seqs, max_num_batched_tokens,
                                    gpu_memory_utilization, tensor_parallel_size, enable_prefix_caching,
                                    speculative_config, device, load_format, kwargs)
        self._with_seed = _Seeder(seed, max_logprobs)

    def get_tokenizer(self) -> "Tokenizer":
        """The engine's tokenizer (vLLM's LLM.get_tokenizer): encode / decode / vocab_size, the special tokens,
        get_vocab, chat_template, ... as a Hugging Face tokenizer (see Tokenizer)."""
        _check_process(self._pid)
        return Tokenizer(self._engine, self._pid)

    def __reduce__(self):
        raise TypeError("ssmserve.LLM objects cannot be pickled or copied (they own a loaded engine); pass the model "
                        "folder and arguments instead and create the LLM where it is used")

    def get_engine_stats(self) -> Dict[str, int]:
        """The engine's counters: num_running_requests, num_waiting_requests, num_free_blocks (state blocks a new
        request could get), num_state_blocks (the pool, incl. the null block), num_cached_blocks, and
        num_tracked_requests / num_timed_requests (requests the binding still holds outputs or times for). Once every
        request finished or was aborted: no running, waiting or tracked requests and num_free_blocks ==
        num_state_blocks - 1."""
        _check_process(self._pid)
        return self._engine.stats()

    def reset_prefix_cache(self) -> bool:
        """vLLM's LLM.reset_prefix_cache: drops every cached prefix state (and a hybrid's cached KV pages, and the
        host copies of swap_space), so later requests prefill from scratch (num_cached_tokens 0). Returns True once
        nothing is cached (also with prefix caching off); False, dropping nothing, while a request of this LLM (from
        another thread) is still running."""
        _check_process(self._pid)
        return self._engine.reset_prefix_cache()

    def _generative_only(self, name: str):
        raise NotImplementedError(f"LLM.{name}: pooling (embedding, scoring, classification, reward) is not "
                                  "supported by ssmserve: its models are generative only (use generate or chat)")

    def encode(self, *args: Any, **kwargs: Any):
        """vLLM's pooling call: NotImplementedError (ssmserve's models are generative only)."""
        self._generative_only("encode")

    def embed(self, *args: Any, **kwargs: Any):
        """vLLM's pooling call: NotImplementedError (ssmserve's models are generative only)."""
        self._generative_only("embed")

    def score(self, *args: Any, **kwargs: Any):
        """vLLM's pooling call: NotImplementedError (ssmserve's models are generative only)."""
        self._generative_only("score")

    def classify(self, *args: Any, **kwargs: Any):
        """vLLM's pooling call: NotImplementedError (ssmserve's models are generative only)."""
        self._generative_only("classify")

    def reward(self, *args: Any, **kwargs: Any):
        """vLLM's pooling call: NotImplementedError (ssmserve's models are generative only)."""
        self._generative_only("reward")

    def beam_search(self, *args: Any, **kwargs: Any):
        """vLLM's LLM.beam_search: NotImplementedError (beam search is not supported; generate samples, n > 1 gives
        several independent choices)."""
        raise NotImplementedError("LLM.beam_search: beam search is not supported by ssmserve (generate samples; "
                                  "SamplingParams(n=...) gives several independent choices)")

    def get_default_sampling_params(self) -> SamplingParams:
        """vLLM's LLM.get_default_sampling_params: a new SamplingParams holding the model's default sampling params
        (generation_config / override_generation_config: temperature, top_p, top_k, min_p, repetition_penalty,
        max_tokens from max_new_tokens), the other fields SamplingParams()'s; SamplingParams() when the model sets
        none or generation_config="vllm". generate / chat / stream use it when sampling_params is None."""
        _check_process(self._pid)
        return SamplingParams(**self._engine.default_sampling_params())

    def generate(self, prompts: Union[PromptType, Sequence[PromptType]],
                 sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
                 use_tqdm: Union[bool, Callable[..., Any]] = True, lora_request: Any = None) -> List[RequestOutput]:
        """Runs every prompt through the engine with continuous batching; returns one finished RequestOutput per
        prompt, in input order (vLLM's LLM.generate). lora_request must be None (no LoRA adapters).

        prompts: one prompt or a list; a prompt is a str, a list of int token ids, {"prompt": str} or
        {"prompt_token_ids": [int], optionally "prompt": str}. sampling_params: one SamplingParams for all, a list
        with one per prompt, or None (get_default_sampling_params(): the model's defaults, as vLLM). use_tqdm: a
        "Processed prompts" progress bar (tqdm) on stderr while the batch runs (True, the default), none (False), or
        a tqdm-like class to use. SamplingParams.output_kind is ignored: the outputs are the finished ones (as vLLM's
        LLM). RuntimeError in a fork()ed child of the process that created the LLM."""
        _check_no_lora(lora_request)
        _check_process(self._pid)
        prompts = _as_prompt_list(prompts)
        if sampling_params is None:
            sampling_params = self.get_default_sampling_params()
        if isinstance(sampling_params, (list, tuple)):
            params = [_check_params(p) for p in sampling_params]
            if len(params) != len(prompts):
                raise ValueError(f"the lengths of prompts ({len(prompts)}) and sampling_params ({len(params)}) "
                                 "must be the same")
        else:
            params = [_check_params(sampling_params)] * len(prompts)
        bar = _progress_bar(use_tqdm, sum(p.n for p in params))
        try:
            outs = self._engine.generate(prompts, [self._with_seed(p) for p in params],
                                         None if bar is None else bar.update)
        finally:
            if bar is not None:
                bar.close()
        for p, o in zip(prompts, outs):
            if not _is_text_prompt(p):
                o.prompt = None
        return outs

    def chat(self, messages, sampling_params=None, use_tqdm: Union[bool, Callable[..., Any]] = True,
             chat_template: Optional[str] = None, chat_template_content_format: str = "auto",
             add_generation_prompt: bool = True,
             continue_final_message: bool = False, tools: Optional[List[dict]] = None,
             chat_template_kwargs: Optional[Dict[str, Any]] = None, lora_request: Any = None) -> List[RequestOutput]:
        """vLLM's LLM.chat: one conversation (a list of {"role", "content"} dicts) or a list of conversations,
        rendered with the checkpoint's chat template (chat_template.jinja or tokenizer_config.json; without one
        ssmserve's plain default, as `ssmserve serve` does) or with `chat_template` (Jinja source, or a file path: as
        vLLM, a string without "{", "}" or a newline is a path, and a ValueError names it when it cannot be opened),
        then generated as generate() does; one RequestOutput per conversation. content may be a string or a list of
        {"type": "text", "text"} parts. chat_template_content_format (vLLM's): how the template gets each content:
        "string" (parts joined with newlines), "openai" (a list of text parts) or "auto" (the default: "openai" when
        the template loops over a message's content, as vLLM detects it). add_generation_prompt: end the prompt with the
        assistant turn's header. continue_final_message: the prompt ends inside the final message, which the model
        continues (needs add_generation_prompt=False). tools: a list of tool schemas the template sees as `tools`.
        chat_template_kwargs: extra template variables (a dict, e.g. {"enable_thinking": False}). Malformed messages
        raise ValueError / TypeError; a template that fails raises ValueError naming its line."""
        _check_no_lora(lora_request)
        _check_process(self._pid)
        prompts = _render_chats(self._engine, messages, chat_template, add_generation_prompt, continue_final_message,
                                tools, chat_template_kwargs, "chat()", chat_template_content_format)
        # The template writes its own special tokens (BOS): encoded without adding them again (vLLM's chat default).
        prompts = [{"prompt": p, "prompt_token_ids": self._engine.encode(p, False)} for p in prompts]
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    def stream(self, prompt: PromptType, sampling_params=None) -> Iterator[RequestOutput]:
        """Yields the request's RequestOutput after every engine step that produced a token (cumulative text plus
        delta_text), the last one with finished=True, whatever SamplingParams.output_kind says. Closing the iterator
        early aborts the request. sampling_params None: get_default_sampling_params(). (ssmserve's own;
        AsyncLLM.generate is the asyncio form, and honours output_kind.)"""
        _check_process(self._pid)
        if sampling_params is not None and not isinstance(sampling_params, _ssmserve.SamplingParams):
            raise TypeError(f"sampling_params must be a SamplingParams, got {type(sampling_params).__name__}")
        if sampling_params is None:
            sampling_params = self.get_default_sampling_params()
        rid = self._engine.add(prompt, self._with_seed(sampling_params))
        finished = False
        try:
            while True:
                out = self._engine.next_output(rid)
                if out is None:
                    return
                if not _is_text_prompt(prompt):
                    out.prompt = None
                finished = out.finished
                yield out
                if finished:
                    return
        finally:
            if not finished:
                self._engine.abort(rid)


from .tokenizer import BatchEncoding, Tokenizer  # noqa: E402  (uses the names above)
from .async_llm import AsyncEngineArgs, AsyncLLM, EngineArgs  # noqa: E402  (uses the names above)
