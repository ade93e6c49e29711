"""ssmserve: inference for recurrent-state language models (Mamba-1, Mamba-2) with vLLM's offline API.

    from ssmserve import LLM, SamplingParams
    llm = LLM("models/tiny-mamba")
    out = llm.generate(["In the beginning"], SamplingParams(temperature=0, max_tokens=32))
    print(out[0].outputs[0].text)

The C++ engine runs with the GIL released.
"""
import json
import operator
import os
import threading
from typing import Iterable, Iterator, List, Optional, Sequence, Union

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
from .outputs import CompletionOutput, RequestOutput

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "Logprob", "SsmserveError", "Tokenizer"]
__version__ = "0.1.0"

Logprob = _ssmserve.Logprob
SsmserveError = _ssmserve.SsmserveError
#: True when the module was built with the CUDA backend (pip install . -C cmake.define.SSMSERVE_PYTHON_CUDA=ON).
has_cuda = bool(getattr(_ssmserve, "has_cuda", False))

PromptType = Union[str, Sequence[int], dict]


# The settable fields (the binding's properties; methods such as clone are not keyword arguments).
_SAMPLING_FIELDS = frozenset(n for n, v in vars(_ssmserve.SamplingParams).items() if isinstance(v, property))
_INT_FIELDS = frozenset({"n", "top_k", "max_tokens", "min_tokens", "logprobs", "prompt_logprobs"})


def SamplingParams(**kwargs) -> "_ssmserve.SamplingParams":  # noqa: N802 (vLLM's class name)
    """vLLM's SamplingParams: n, temperature (1.0), top_p, top_k, min_p, seed, presence_penalty,
    frequency_penalty, repetition_penalty, max_tokens (16; None: up to max_model_len), min_tokens, stop,
    stop_token_ids, ignore_eos, logprobs, prompt_logprobs, include_stop_str_in_output, skip_special_tokens,
    logit_bias ({token_id: bias}), allowed_token_ids (only these ids can be sampled).
    Unknown names raise TypeError; values are checked here, as vLLM does (ValueError naming the field), and token
    ids against the model's vocabulary when a request is added."""
    p = _ssmserve.SamplingParams()
    for k, v in kwargs.items():
        if k == "stop" and isinstance(v, str):
            v = [v]
        if k not in _SAMPLING_FIELDS:
            raise TypeError(f"SamplingParams() got an unexpected keyword argument '{k}'")
        if v is None and k in ("stop", "stop_token_ids", "logit_bias", "allowed_token_ids"):
            continue  # vLLM's None: the default (none)
        if v is None and k == "max_tokens":
            v = 2**31 - 1  # vLLM's None: no limit but the request's max_model_len (finish_reason "length")
        if k == "seed" and isinstance(v, int) and not 0 <= v < 2**64:
            raise ValueError(f"SamplingParams.seed must be None or an integer in [0, 2**64), got {v}")
        if k in _INT_FIELDS and isinstance(v, int) and not isinstance(v, bool) and not -2**31 <= v < 2**31:
            raise ValueError(f"SamplingParams.{k} must fit in 32 bits, got {v}")
        try:
            if k == "logit_bias":
                v = {int(t): float(b) for t, b in dict(v).items()}
            setattr(p, k, list(v) if k in ("stop", "stop_token_ids", "allowed_token_ids") else v)
        except (TypeError, ValueError) as e:
            why = "" if "incompatible function arguments" in str(e) else ": " + str(e).splitlines()[0]
            raise TypeError(f"SamplingParams.{k} cannot be {v!r} ({type(v).__name__}){why}") from None
    p.validate(2**31 - 1)  # every range but the vocabulary's (SsmserveError is a ValueError)
    return p


def _splitmix64(x: int) -> int:
    """SplitMix64 (Steele et al., 2014): a 64-bit mix of x."""
    m = 2**64 - 1
    z = (x + 0x9E3779B97F4A7C15) & m
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    return z ^ (z >> 31)


def _chat_message(m) -> dict:
    """One chat message as the server takes it: {"role": str, "content": str, ...}; text parts are joined."""
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
        raise TypeError(f"each chat message must be a dict with a str 'role', got {m!r}"[:300])
    content = m.get("content")
    if content is None:
        content = ""
    elif isinstance(content, (list, tuple)):
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
            raise ValueError('only text content parts ({"type": "text", "text": ...}) are supported')
        content = "\n".join(p["text"] for p in content)
    elif not isinstance(content, str):
        raise TypeError(f"message content must be a str or a list of text parts, got {type(content).__name__}")
    return dict(m, content=content)


class Tokenizer:
    """The engine's byte-level BPE tokenizer (LLM.get_tokenizer), with the Hugging Face names users call:
    encode(text) -> token ids (no special tokens added, as prompts are encoded), decode(ids,
    skip_special_tokens=False) -> str, vocab_size, eos_token_id (the first of the model's EOS ids, or None)."""

    def __init__(self, engine):
        self._engine = engine

    def encode(self, text: str) -> List[int]:
        if not isinstance(text, str):
            raise TypeError(f"encode() takes a str, got {type(text).__name__}")
        return self._engine.encode(text)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self._engine.decode(list(ids), skip_special_tokens)

    @property
    def vocab_size(self) -> int:
        return self._engine.vocab_size()

    @property
    def eos_token_id(self) -> Optional[int]:
        ids = self._engine.eos_token_ids()
        return ids[0] if ids else None

    def __len__(self) -> int:
        return self.vocab_size


class LLM:
    """vLLM's offline LLM: LLM(model, **engine_args). Engine args: tokenizer, max_num_seqs,
    max_num_batched_tokens, num_state_blocks, threads, tensor_parallel_size, mamba_cache_dtype,
    mamba_ssm_cache_dtype, load_format, device ("cpu", "cuda" or "auto", as `--device`; "cuda" needs a module built
    with the CUDA backend, pip install . -C cmake.define.SSMSERVE_PYTHON_CUDA=ON (ssmserve.has_cuda), else it says
    it is not available in this build), gpu_memory_utilization, max_model_len (most prompt +
    generated tokens per request; default the model's max_position_embeddings; generation stops there with
    finish_reason "length", a longer prompt is a ValueError), num_scheduler_steps (multi-step decode, as
    `--num-scheduler-steps`), enable_prefix_caching (default True, as vLLM: a prompt that starts with a cached prefix
    continues from its cached state; RequestOutput.num_cached_tokens says how many tokens it saved), mamba_cache_mode
    ("all", "align" or "none") and mamba_block_size (tokens per cached state), as `--mamba-cache-mode` /
    `--mamba-block-size`."""

    def __init__(self, model: str, seed: Optional[int] = None, **engine_args):
        """seed: the engine seed (vLLM's): requests whose SamplingParams have no seed get seeds derived from it and
        a running count (splitmix64, so they do not coincide with small explicit seeds), and a script's sampled
        outputs repeat from run to run; None (the default here): unseeded requests differ every run."""
        if seed is not None:
            try:
                seed = operator.index(seed)
            except TypeError:
                raise TypeError(f"seed must be None or an int, got {type(seed).__name__}") from None
            if not 0 <= seed < 2**64:
                raise ValueError(f"seed must be None or an integer in [0, 2**64), got {seed}")
        self._engine = _ssmserve.Engine(str(model), **engine_args)
        self._seed = seed
        self._seeded = 0  # requests seeded from `seed` so far
        self._seed_lock = threading.Lock()  # one LLM may be used from several threads

    def _with_seed(self, p):
        """p, or a copy seeded from the engine seed when p has none."""
        if self._seed is None or p.seed is not None:
            return p
        with self._seed_lock:
            i = self._seeded
            self._seeded += 1
        q = p.clone()
        q.seed = _splitmix64(_splitmix64(self._seed) + i)  # choices of n > 1 use seed + c (the engine)
        return q

    def get_tokenizer(self) -> "Tokenizer":
        """The engine's tokenizer (vLLM's LLM.get_tokenizer): encode / decode / vocab_size / eos_token_id."""
        return Tokenizer(self._engine)

    def generate(self, prompts: Union[PromptType, Sequence[PromptType]],
                 sampling_params=None, use_tqdm: bool = False) -> List[RequestOutput]:
        """Runs every prompt (str, token ids, or {"prompt"} / {"prompt_token_ids"} dicts) through the engine with
        continuous batching; returns one finished RequestOutput per prompt, in input order."""
        if isinstance(prompts, (str, dict)) or (isinstance(prompts, (list, tuple)) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None:
            sampling_params = SamplingParams()
        params = list(sampling_params) if isinstance(sampling_params, (list, tuple)) else [sampling_params] * len(prompts)
        for p in params:
            if not isinstance(p, _ssmserve.SamplingParams):
                raise TypeError(f"sampling_params must be a SamplingParams or a list of them, got {type(p).__name__}")
        return self._engine.generate(prompts, [self._with_seed(p) for p in params])

    def chat(self, messages, sampling_params=None, use_tqdm: bool = False, chat_template: Optional[str] = None,
             add_generation_prompt: bool = True, continue_final_message: bool = False) -> List[RequestOutput]:
        """vLLM's LLM.chat: one conversation (a list of {"role", "content"} dicts) or a list of conversations,
        rendered with the checkpoint's chat template (tokenizer_config.json; without one ssmserve's plain default,
        as `ssmserve serve` does) or with `chat_template` (Jinja source or a file path), then generated as
        generate() does; one RequestOutput per conversation. content may be a string or a list of
        {"type": "text", "text"} parts (joined with newlines). continue_final_message: the prompt ends inside the
        final message, which the model continues (needs add_generation_prompt=False). Malformed messages raise
        ValueError / TypeError."""
        if continue_final_message and add_generation_prompt:
            raise ValueError("cannot set both continue_final_message and add_generation_prompt to True")
        if not isinstance(messages, (list, tuple)) or not messages:
            raise TypeError("chat() takes a non-empty list of messages (or a list of such lists)")
        conversations = messages if isinstance(messages[0], (list, tuple)) else [messages]
        prompts = [self._engine.render_chat(json.dumps([_chat_message(m) for m in conv]), add_generation_prompt,
                                            chat_template, continue_final_message) for conv in conversations]
        # The template writes its own special tokens (BOS): encoded without adding them again (vLLM's chat default).
        prompts = [{"prompt": p, "prompt_token_ids": self._engine.encode(p, False)} for p in prompts]
        return self.generate(prompts, sampling_params)

    def stream(self, prompt: PromptType, sampling_params=None) -> Iterator[RequestOutput]:
        """Yields the request's RequestOutput after every engine step that produced a token (cumulative text plus
        delta_text), the last one with finished=True. Closing the iterator early aborts the request."""
        if sampling_params is not None and not isinstance(sampling_params, _ssmserve.SamplingParams):
            raise TypeError(f"sampling_params must be a SamplingParams, got {type(sampling_params).__name__}")
        rid = self._engine.add(prompt, self._with_seed(sampling_params if sampling_params is not None else SamplingParams()))
        finished = False
        try:
            while True:
                out = self._engine.next_output(rid)
                if out is None:
                    return
                finished = out.finished
                yield out
                if finished:
                    return
        finally:
            if not finished:
                self._engine.abort(rid)
