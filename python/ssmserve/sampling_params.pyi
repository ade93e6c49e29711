# Type stubs of ssmserve.sampling_params (vLLM's vllm.sampling_params): SamplingParams, StructuredOutputsParams and
# RequestOutputKind.
import enum
from typing import Any, Dict, List, Optional, Union

class RequestOutputKind(enum.Enum):
    """What AsyncLLM.generate streams: the whole output so far, only what is new, or only the finished output."""
    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2

class StructuredOutputsParams:
    """vLLM's StructuredOutputsParams: exactly one of json, regex, choice, grammar, json_object, structural_tag (else
    ValueError); wrong types raise TypeError naming the field. json takes a schema dict (written as JSON text) or the
    text, and reads back as the text. Compares by value; picklable and deep-copyable."""
    @property
    def json(self) -> Optional[str]: ...  # the schema's JSON text
    @json.setter
    def json(self, value: Union[str, Dict[str, Any], None]) -> None: ...
    regex: Optional[str]
    choice: Optional[List[str]]
    grammar: Optional[str]
    json_object: Optional[bool]
    disable_any_whitespace: bool
    disable_additional_properties: bool
    whitespace_pattern: None
    structural_tag: Optional[str]
    def __init__(
        self,
        json: Union[str, Dict[str, Any], None] = None,
        regex: Optional[str] = None,
        choice: Optional[List[str]] = None,
        grammar: Optional[str] = None,
        json_object: Optional[bool] = None,  # None or True
        disable_any_whitespace: bool = False,
        disable_additional_properties: bool = False,
        whitespace_pattern: None = None,  # not supported: only None
        structural_tag: Optional[str] = None,
    ) -> None: ...
    def validate(self) -> None: ...
    def all_constraints_none(self) -> bool: ...
    def all_non_structural_tag_constraints_none(self) -> bool: ...

class SamplingParams:
    """vLLM's SamplingParams: temperature 1.0, max_tokens 16 (None: up to max_model_len), ...; unknown names raise
    TypeError, bad values ValueError naming the field. Compares by value (every field); picklable and deep-copyable."""
    n: int
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    seed: Optional[int]
    presence_penalty: float
    frequency_penalty: float
    repetition_penalty: float
    max_tokens: int
    min_tokens: int
    stop: List[str]
    stop_token_ids: List[int]
    ignore_eos: bool
    logprobs: Optional[int]
    prompt_logprobs: Optional[int]
    include_stop_str_in_output: bool
    skip_special_tokens: bool
    logit_bias: Dict[int, float]
    allowed_token_ids: List[int]
    #: Words never generated (vLLM's bad_words): each word's tokens as given and with a leading space are banned.
    bad_words: List[str]
    #: Read as a copy: assign a new StructuredOutputsParams to change it.
    structured_outputs: Optional[StructuredOutputsParams]
    #: False: outputs carry token_ids only (text "", logprobs' decoded_token None); no stop strings then.
    detokenize: bool
    #: What AsyncLLM.generate streams (LLM.generate ignores it).
    output_kind: RequestOutputKind
    #: For plugins: stored and returned as given (the dict itself).
    extra_args: Optional[Dict[str, Any]]
    def __init__(self,
        *,
        n: int = ...,
        temperature: float = ...,
        top_p: float = ...,
        top_k: int = ...,
        min_p: float = ...,
        seed: Optional[int] = ...,
        presence_penalty: float = ...,
        frequency_penalty: float = ...,
        repetition_penalty: float = ...,
        max_tokens: Optional[int] = ...,
        min_tokens: int = ...,
        stop: Union[str, List[str], None] = ...,
        stop_token_ids: Optional[List[int]] = ...,
        ignore_eos: bool = ...,
        logprobs: Optional[int] = ...,
        prompt_logprobs: Optional[int] = ...,
        include_stop_str_in_output: bool = ...,
        skip_special_tokens: bool = ...,
        logit_bias: Optional[Dict[int, float]] = ...,
        allowed_token_ids: Optional[List[int]] = ...,
        bad_words: Optional[List[str]] = ...,
        structured_outputs: Optional[StructuredOutputsParams] = ...,
        detokenize: bool = ...,
        output_kind: RequestOutputKind = ...,
        extra_args: Optional[Dict[str, Any]] = ...,
    ) -> None: ...
    @classmethod
    def from_optional(cls, **kwargs: Any) -> "SamplingParams": ...  # None: the default (vLLM's)
    def clone(self) -> "SamplingParams": ...
    def validate(self, vocab_size: int) -> None: ...
