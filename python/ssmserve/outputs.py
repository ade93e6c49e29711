"""Result types of the offline API, with vLLM's names (vllm.outputs.RequestOutput / CompletionOutput)."""
from dataclasses import dataclass, field
from typing import Any, Optional, Union


@dataclass
class CompletionOutput:
    """One generated sequence: cumulative text and token ids; logprobs (when asked for) is one
    dict[token_id, Logprob] per generated token (the sampled token and the top-k); finish_reason is "stop",
    "length", "abort" or None while running; stop_reason the matched stop string or stop token id."""
    index: int
    text: str
    token_ids: list
    logprobs: Optional[list]
    finish_reason: Optional[str]
    stop_reason: Union[str, int, None] = None
    cumulative_logprob: Optional[float] = None  # sum of the sampled tokens' logprobs (when logprobs are asked for)

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """A request's state: prompt, prompt_token_ids, prompt_logprobs (when asked for: None for the first prompt
    token, then a dict[token_id, Logprob] of the prompt token and the top-k), outputs (n choices), finished.
    In a stream, delta_text is the text that became final since the previous output (never half a character or
    part of a possible stop string)."""
    request_id: str
    prompt: str
    prompt_token_ids: list
    outputs: list
    finished: bool
    delta_text: str = ""
    prompt_logprobs: Optional[list] = None
    metrics: Any = field(default=None, repr=False)
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache (vLLM's name)
