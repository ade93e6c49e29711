# Type stubs of the ssmserve package (the extension module's classes are declared here, so editors complete them).
import os
from typing import Any, AsyncGenerator, Callable, Dict, Iterable, Iterator, List, Literal, Optional, Sequence, Union

from .async_llm import AsyncEngineArgs as AsyncEngineArgs, AsyncLLM as AsyncLLM, EngineArgs as EngineArgs
from .outputs import CompletionOutput as CompletionOutput, RequestMetrics as RequestMetrics, RequestOutput as RequestOutput
from .sampling_params import RequestOutputKind as RequestOutputKind, SamplingParams as SamplingParams

__version__: str
#: True when the package was built with the CUDA backend (device="cuda").
has_cuda: bool
#: True when the package was built with structured outputs (xgrammar; SamplingParams.structured_outputs).
has_structured_outputs: bool

class SsmserveError(ValueError):
    """An engine error (bad config, checkpoint, request): a ValueError."""

class Logprob:
    """vLLM's Logprob: a candidate token's natural-log probability, its rank (1 = most likely) and its text (None
    when the request's SamplingParams.detokenize is False). Compares by value; picklable and deep-copyable."""
    def __init__(self, logprob: float, rank: int = 0, decoded_token: Optional[str] = "") -> None: ...
    @property
    def logprob(self) -> float: ...
    @property
    def rank(self) -> int: ...
    @property
    def decoded_token(self) -> Optional[str]: ...

PromptType = Union[str, Sequence[int], Dict[str, Any]]

class BatchEncoding(Dict[str, Any]):
    """Hugging Face's BatchEncoding (lists only): "input_ids" and "attention_mask", also as attributes."""
    input_ids: Any
    attention_mask: Any

class Tokenizer:
    """The engine's tokenizer with Hugging Face's names: encode(text) -> ids, decode(ids) -> text, the special tokens,
    the vocabulary and the chat template as transformers' AutoTokenizer reports them for the same folder."""
    def encode(self, text: str, add_special_tokens: bool = True) -> List[int]: ...
    def __call__(self, text: Union[str, Sequence[str]], add_special_tokens: bool = True,
                 return_tensors: None = None) -> BatchEncoding: ...
    def decode(self, ids: Union[int, Sequence[int]], skip_special_tokens: bool = ...) -> str: ...
    def batch_decode(self, sequences: Sequence[Sequence[int]], skip_special_tokens: bool = False) -> List[str]: ...
    def convert_ids_to_tokens(self, ids: Union[int, Sequence[int]]) -> Union[Optional[str], List[Optional[str]]]: ...
    def convert_tokens_to_ids(self, tokens: Union[str, Sequence[str], None]) -> Union[Optional[int], List[Optional[int]]]: ...
    def convert_tokens_to_string(self, tokens: Sequence[str]) -> str: ...
    def tokenize(self, text: str, add_special_tokens: bool = False) -> List[str]: ...
    def get_vocab(self) -> Dict[str, int]: ...
    def apply_chat_template(self, conversation: Any, tools: Optional[List[dict]] = None, chat_template: Optional[str] = None,
                            add_generation_prompt: bool = False, continue_final_message: bool = False,
                            tokenize: bool = True, **kwargs: Any) -> Any: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def max_token_id(self) -> int: ...
    @property
    def bos_token(self) -> Optional[str]: ...
    @property
    def eos_token(self) -> Optional[str]: ...
    @property
    def unk_token(self) -> Optional[str]: ...
    @property
    def pad_token(self) -> Optional[str]: ...
    @property
    def bos_token_id(self) -> Optional[int]: ...
    @property
    def eos_token_id(self) -> Optional[int]: ...
    @property
    def unk_token_id(self) -> Optional[int]: ...
    @property
    def pad_token_id(self) -> Optional[int]: ...
    @property
    def all_special_tokens(self) -> List[str]: ...
    @property
    def all_special_ids(self) -> List[int]: ...
    @property
    def chat_template(self) -> Optional[str]: ...
    @property
    def name_or_path(self) -> str: ...
    @property
    def model_max_length(self) -> int: ...
    def __len__(self) -> int: ...

class LLM:
    """vLLM's offline LLM (see the class docstring for every argument)."""
    def __init__(
        self,
        model: str,
        *,
        tokenizer: Optional[str] = None,
        dtype: Union[str, Any] = "auto",  # "auto" / "bfloat16" / "float32" / "float", or a torch.dtype
        seed: Optional[int] = 0,  # vLLM's default; None: unseeded
        max_model_len: Optional[int] = None,
        max_num_seqs: Optional[int] = None,
        max_num_batched_tokens: Optional[int] = None,
        gpu_memory_utilization: float = 0.9,
        tensor_parallel_size: int = 1,
        enable_prefix_caching: Optional[bool] = None,
        speculative_config: Optional[dict] = None,
        device: str = "auto",
        load_format: str = "auto",
        threads: Optional[int] = None,
        num_state_blocks: Optional[int] = None,
        mamba_cache_dtype: Optional[str] = None,
        mamba_ssm_cache_dtype: Optional[str] = None,
        num_scheduler_steps: Optional[int] = None,
        mamba_cache_mode: Optional[str] = None,
        mamba_block_size: Optional[int] = None,
        swap_space: Optional[float] = None,
        quantization: Optional[str] = None,
        log_level: Optional[str] = None,
        generation_config: Optional[Union[str, os.PathLike]] = None,  # "auto" / "vllm" / a folder
        override_generation_config: Optional[Dict[str, Any]] = None,
        max_logprobs: int = 20,  # at most the engine's cap, 20
        # vLLM's arguments that have no effect here, at the values they take (others are a ValueError).
        trust_remote_code: bool = False,
        enforce_eager: bool = False,
        disable_log_stats: bool = False,
        tokenizer_mode: Literal["auto", "hf", "slow"] = "auto",
        revision: None = None,
        tokenizer_revision: None = None,
        code_revision: None = None,
        skip_tokenizer_init: Literal[False] = False,
        task: Literal["auto", "generate"] = "auto",
        runner: Literal["auto", "generate"] = "auto",
        enable_chunked_prefill: Optional[bool] = None,  # prefill is always chunked
        kv_cache_dtype: Literal["auto"] = "auto",
        block_size: None = None,
        cpu_offload_gb: float = 0,  # 0 only
        pipeline_parallel_size: Literal[1] = 1,
        data_parallel_size: Literal[1] = 1,
        distributed_executor_backend: Optional[Literal["mp", "uni"]] = None,
        download_dir: None = None,
        hf_overrides: Optional[Dict[str, Any]] = None,  # None or {}
        compilation_config: Optional[Union[int, Dict[str, Any]]] = None,  # nothing is compiled
        max_seq_len_to_capture: int = 8192,
        disable_custom_all_reduce: bool = False,
        model_impl: Literal["auto"] = "auto",
        disable_async_output_proc: bool = False,
        enable_sleep_mode: Literal[False] = False,
        async_scheduling: Optional[bool] = None,
        scheduling_policy: Literal["fcfs"] = "fcfs",
        disable_log_requests: bool = False,
        enable_log_requests: bool = False,
    ) -> None: ...
    def get_tokenizer(self) -> Tokenizer: ...
    def reset_prefix_cache(self) -> bool: ...
    def encode(self, *args: Any, **kwargs: Any) -> Any: ...  # NotImplementedError: generative models only
    def embed(self, *args: Any, **kwargs: Any) -> Any: ...
    def score(self, *args: Any, **kwargs: Any) -> Any: ...
    def classify(self, *args: Any, **kwargs: Any) -> Any: ...
    def reward(self, *args: Any, **kwargs: Any) -> Any: ...
    def beam_search(self, *args: Any, **kwargs: Any) -> Any: ...  # NotImplementedError: no beam search
    def get_default_sampling_params(self) -> SamplingParams: ...
    def get_engine_stats(self) -> Dict[str, int]: ...
    def generate(
        self,
        prompts: Union[PromptType, Sequence[PromptType]],
        sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
        use_tqdm: Union[bool, Callable[..., Any]] = True,
    ) -> List[RequestOutput]: ...
    def chat(
        self,
        messages: Union[List[Dict[str, Any]], List[List[Dict[str, Any]]]],
        sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
        use_tqdm: Union[bool, Callable[..., Any]] = True,
        chat_template: Optional[str] = None,
        chat_template_content_format: Literal["auto", "string", "openai"] = "auto",
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: Optional[List[Dict[str, Any]]] = None,
        chat_template_kwargs: Optional[Dict[str, Any]] = None,
    ) -> List[RequestOutput]: ...
    def stream(self, prompt: PromptType, sampling_params: Optional[SamplingParams] = None) -> Iterator[RequestOutput]: ...
