from typing import Any, AsyncGenerator, Dict, Iterable, Optional, Union

from . import PromptType, Tokenizer, SamplingParams
from .outputs import RequestOutput

class EngineArgs:
    model: str
    tokenizer: Optional[str]
    dtype: Union[str, Any]  # as LLM(dtype=...): a name or a torch.dtype
    seed: Optional[int]
    max_model_len: Optional[int]
    max_num_seqs: Optional[int]
    max_num_batched_tokens: Optional[int]
    gpu_memory_utilization: float
    tensor_parallel_size: int
    enable_prefix_caching: Optional[bool]
    speculative_config: Optional[dict]
    device: str
    load_format: str
    threads: Optional[int]
    num_state_blocks: Optional[int]
    mamba_cache_dtype: Optional[str]
    mamba_ssm_cache_dtype: Optional[str]
    num_scheduler_steps: Optional[int]
    mamba_cache_mode: Optional[str]
    mamba_block_size: Optional[int]
    swap_space: Optional[float]
    quantization: Optional[str]
    log_level: Optional[str]
    generation_config: Optional[str]
    override_generation_config: Optional[Dict[str, Any]]
    max_logprobs: int
    # vLLM's arguments that have no effect here (ssmserve.LLM lists the values each takes).
    trust_remote_code: bool
    enforce_eager: bool
    disable_log_stats: bool
    tokenizer_mode: str
    revision: Optional[str]
    tokenizer_revision: Optional[str]
    code_revision: Optional[str]
    skip_tokenizer_init: bool
    task: str
    runner: str
    enable_chunked_prefill: Optional[bool]
    kv_cache_dtype: str
    block_size: Optional[int]
    cpu_offload_gb: float
    pipeline_parallel_size: int
    data_parallel_size: int
    distributed_executor_backend: Optional[str]
    download_dir: Optional[str]
    hf_overrides: Optional[Dict[str, Any]]
    compilation_config: Optional[Union[int, Dict[str, Any]]]
    max_seq_len_to_capture: int
    disable_custom_all_reduce: bool
    model_impl: str
    disable_async_output_proc: bool
    enable_sleep_mode: bool
    async_scheduling: Optional[bool]
    scheduling_policy: str
    disable_log_requests: bool
    enable_log_requests: bool
    def __init__(
        self,
        model: str,
        tokenizer: Optional[str] = None,
        dtype: Union[str, Any] = "auto",
        seed: Optional[int] = 0,
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
        generation_config: Optional[str] = None,
        override_generation_config: Optional[Dict[str, Any]] = None,
        max_logprobs: int = 20,
        trust_remote_code: bool = False,
        enforce_eager: bool = False,
        disable_log_stats: bool = False,
        tokenizer_mode: str = "auto",
        revision: Optional[str] = None,
        tokenizer_revision: Optional[str] = None,
        code_revision: Optional[str] = None,
        skip_tokenizer_init: bool = False,
        task: str = "auto",
        runner: str = "auto",
        enable_chunked_prefill: Optional[bool] = None,
        kv_cache_dtype: str = "auto",
        block_size: Optional[int] = None,
        cpu_offload_gb: float = 0,
        pipeline_parallel_size: int = 1,
        data_parallel_size: int = 1,
        distributed_executor_backend: Optional[str] = None,
        download_dir: Optional[str] = None,
        hf_overrides: Optional[Dict[str, Any]] = None,
        compilation_config: Optional[Union[int, Dict[str, Any]]] = None,
        max_seq_len_to_capture: int = 8192,
        disable_custom_all_reduce: bool = False,
        model_impl: str = "auto",
        disable_async_output_proc: bool = False,
        enable_sleep_mode: bool = False,
        async_scheduling: Optional[bool] = None,
        scheduling_policy: str = "fcfs",
        disable_log_requests: bool = False,
        enable_log_requests: bool = False,
    ) -> None: ...

class AsyncEngineArgs(EngineArgs): ...

class AsyncLLM:
    def __init__(self, model: str, **engine_args: Any) -> None: ...
    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs, **_ignored: Any) -> "AsyncLLM": ...
    def generate(
        self,
        prompt: PromptType,
        sampling_params: Optional[SamplingParams] = None,
        request_id: Optional[str] = None,
        *,
        lora_request: Any = None,
        trace_headers: Any = None,
        priority: int = 0,
    ) -> AsyncGenerator[RequestOutput, None]: ...
    async def abort(self, request_id: Union[str, Iterable[str]]) -> None: ...
    async def get_tokenizer(self) -> Tokenizer: ...
    async def reset_prefix_cache(self) -> bool: ...
    def get_engine_stats(self) -> Dict[str, int]: ...
    @property
    def is_running(self) -> bool: ...
    @property
    def errored(self) -> bool: ...
    def shutdown(self) -> None: ...
    def __enter__(self) -> "AsyncLLM": ...
    def __exit__(self, *exc: Any) -> None: ...
