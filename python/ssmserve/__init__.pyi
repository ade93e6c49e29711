# Type stubs of the ssmserve package (the extension module's classes are declared here, so editors complete them).
import os
from typing import Any, AsyncGenerator, Callable, Dict, Iterable, Iterator, List, Literal, Optional, Sequence, Union

from .async_llm import AsyncEngineArgs as AsyncEngineArgs, AsyncLLM as AsyncLLM, EngineArgs as EngineArgs
from .outputs import CompletionOutput as CompletionOutput, RequestMetrics as RequestMetrics, RequestOutput as RequestOutput
from .sampling_params import SamplingParams as SamplingParams

__version__: str
#: True when the package was built with the CUDA backend (device="cuda").
has_cuda: bool
#: True when the package was built with structured outputs (xgrammar; SamplingParams.structured_outputs).
has_structured_outputs: bool

class SsmserveError(ValueError):
    """An engine error (bad config, checkpoint, request): a ValueError."""

class Logprob:
    """vLLM's Logprob: a candidate token's natural-log probability, its rank (1 = most likely) and its text.
    Compares by value; picklable and deep-copyable."""
    def __init__(self, logprob: float, rank: int = 0, decoded_token: str = "") -> None: ...
    @property
    def logprob(self) -> float: ...
    @property
    def rank(self) -> int: ...
    @property
    def decoded_token(self) -> str: ...

PromptType = Union[str, Sequence[int], Dict[str, Any]]

class Tokenizer:
    """The engine's tokenizer: encode(text) -> ids, decode(ids) -> text, vocab_size, eos_token_id."""
    def encode(self, text: str) -> List[int]: ...
    def decode(self, ids: Union[int, Sequence[int]], skip_special_tokens: bool = ...) -> str: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def eos_token_id(self) -> Optional[int]: ...
    def __len__(self) -> int: ...

class LLM:
    """vLLM's offline LLM (see the class docstring for every argument)."""
    def __init__(
        self,
        model: str,
        *,
        tokenizer: Optional[str] = None,
        dtype: Union[str, Any] = "auto",  # "auto" / "bfloat16" / "float32" / "float", or a torch.dtype
        seed: Optional[int] = None,
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
        log_level: Optional[str] = None,
        generation_config: Optional[Union[str, os.PathLike]] = None,  # "auto" / "vllm" / a folder
        override_generation_config: Optional[Dict[str, Any]] = None,
    ) -> None: ...
    def get_tokenizer(self) -> Tokenizer: ...
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
