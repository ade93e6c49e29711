"""Result types of the offline and async APIs, with vLLM's names (vllm.outputs.RequestOutput / CompletionOutput,
vllm.sequence.RequestMetrics)."""
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Union


@dataclass
class CompletionOutput:
    """One generated sequence (vLLM's CompletionOutput).

    index: which of the request's n choices. text: the cumulative generated text (str). token_ids: the generated
    token ids (list[int], len = tokens generated so far). logprobs: None unless SamplingParams.logprobs was set, else
    one dict[token_id, Logprob] per generated token (the sampled token and the top-k; natural-log probabilities).
    finish_reason: "stop", "length", "abort" or None while running. stop_reason: the matched stop string (str) or
    stop token id (int), else None. cumulative_logprob: the sum of the sampled tokens' logprobs (natural log), None
    unless logprobs were asked for (as vLLM v1)."""
    index: int
    text: str
    token_ids: List[int]
    logprobs: Optional[List[Dict[int, Any]]]
    finish_reason: Optional[str]
    stop_reason: Union[str, int, None] = None
    cumulative_logprob: Optional[float] = None
    lora_request: Any = None  # always None (no LoRA adapters)

    def finished(self) -> bool:
        """True once finish_reason is set."""
        return self.finish_reason is not None


@dataclass
class RequestMetrics:
    """A request's timing (vLLM's RequestMetrics): wall-clock times in seconds since the epoch (time.time());
    None until the event happened. num_generation_tokens: tokens generated (choice 0) so far."""
    arrival_time: float
    first_token_time: Optional[float] = None
    last_token_time: Optional[float] = None
    finished_time: Optional[float] = None
    num_generation_tokens: int = 0

    @property
    def first_token_latency(self) -> Optional[float]:
        """Seconds from arrival to the first generated token (time to first token), or None before it."""
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time


@dataclass
class RequestOutput:
    """A request's state (vLLM's RequestOutput).

    request_id (str); prompt (the prompt text; for a token-id prompt the text given with it, else None); prompt_token_ids
    (list[int]); outputs (list[CompletionOutput], one per choice of n); finished (bool). prompt_logprobs: None
    unless SamplingParams.prompt_logprobs was set, else one entry per prompt token: None for the first, then a
    dict[token_id, Logprob] of the prompt token and the top-k. num_cached_tokens: prompt tokens served from the
    prefix cache. metrics: a RequestMetrics. In a stream, delta_text is the text that became final since the
    previous output (never half a character or part of a possible stop string); "" in AsyncLLM streams of n > 1
    (each choice's cumulative text is outputs[c].text)."""
    request_id: str
    prompt: Optional[str]
    prompt_token_ids: List[int]
    outputs: List[CompletionOutput]
    finished: bool
    delta_text: str = ""
    prompt_logprobs: Optional[list] = None
    metrics: Optional[RequestMetrics] = field(default=None, repr=False)
    num_cached_tokens: int = 0
    lora_request: Any = None              # always None (no LoRA adapters)
    encoder_prompt: Optional[str] = None  # always None (decoder-only models)
    encoder_prompt_token_ids: Optional[List[int]] = None
