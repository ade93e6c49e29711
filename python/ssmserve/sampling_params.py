"""Sampling parameters (vLLM's vllm.sampling_params): SamplingParams, the per-request decoding knobs, and
StructuredOutputsParams, the constraint of SamplingParams.structured_outputs.

    from ssmserve import LLM, SamplingParams
    from ssmserve.sampling_params import StructuredOutputsParams
    params = SamplingParams(max_tokens=32, structured_outputs=StructuredOutputsParams(choice=["yes", "no"]))

Both are classes of the extension module: SamplingParams subclasses it here to check its keyword arguments as vLLM
does; StructuredOutputsParams is the extension's class itself (its constructor checks its arguments). An attribute
read returns a copy of the value (as a list field's list): `p.structured_outputs.regex = ...` changes the copy, so
assign a new StructuredOutputsParams to p.structured_outputs instead.
"""
from typing import Any

from . import _ssmserve

__all__ = ["SamplingParams", "StructuredOutputsParams"]

#: vLLM's StructuredOutputsParams: exactly one constraint of json (a JSON schema: a dict, kept as its JSON text, or
#: the text; read back as the text), regex (the whole output matches it), choice (a list of str: the output is one of
#: them), grammar (EBNF, xgrammar's GBNF-style syntax, root rule `root`), json_object (True: a JSON object) or
#: structural_tag (an xgrammar structural tag's JSON text); disable_any_whitespace (JSON output in json.dumps' form:
#: ", " and ": ", no other whitespace) and disable_additional_properties (JSON schemas: properties the schema does not
#: list are allowed where it does not forbid them). whitespace_pattern: only None (not supported). Wrong types raise
#: TypeError; no or several constraints, an empty one or json_object=False ValueError (SsmserveError); each names the
#: field (structured_outputs.<field>). An invalid schema / regex / grammar raises SsmserveError naming it when a
#: request with it is added (LLM.generate). Compares by value; picklable and deep-copyable.
StructuredOutputsParams = _ssmserve.StructuredOutputsParams

# The settable fields (the binding's properties; methods such as clone are not keyword arguments).
_SAMPLING_FIELDS = frozenset(n for n, v in vars(_ssmserve.SamplingParams).items() if isinstance(v, property))
_INT_FIELDS = frozenset({"n", "top_k", "max_tokens", "min_tokens", "logprobs", "prompt_logprobs"})
_BOOL_FIELDS = frozenset({"ignore_eos", "include_stop_str_in_output", "skip_special_tokens"})
_ID_LIST_FIELDS = frozenset({"stop_token_ids", "allowed_token_ids"})


class SamplingParams(_ssmserve.SamplingParams):
    """vLLM's SamplingParams: n, temperature (1.0), top_p, top_k, min_p, seed, presence_penalty,
    frequency_penalty, repetition_penalty, max_tokens (16; None: up to max_model_len), min_tokens, stop,
    stop_token_ids, ignore_eos, logprobs, prompt_logprobs, include_stop_str_in_output, skip_special_tokens,
    logit_bias ({token_id: bias}), allowed_token_ids (only these ids can be sampled; not empty), bad_words (a list of
    str: words never generated; each word's tokens as given and with a leading space, as vLLM), structured_outputs
    (a StructuredOutputsParams: the output follows its JSON schema, regex, choice, grammar, ...).
    Keyword arguments only. Unknown names raise TypeError; values are checked here, as vLLM does (ValueError naming
    the field), and token ids against the model's vocabulary when a request is added. A class (isinstance,
    subclassing and annotations work, as vLLM's); compares by value, pickles and deep-copies."""

    __slots__ = ()  # no attributes beyond the fields (a misspelt one is an AttributeError)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        for k, v in kwargs.items():
            if k not in _SAMPLING_FIELDS:
                raise TypeError(f"SamplingParams() got an unexpected keyword argument '{k}'")
            setattr(self, k, v)
        self.validate(2**31 - 1)  # every range but the vocabulary's (SsmserveError is a ValueError)

    def __setattr__(self, k: str, v: Any) -> None:
        """Sets a field with the constructor's checks of its type and token ids (`p.allowed_token_ids = []` is a
        ValueError, as in the constructor); its range (`p.temperature = -1`) is checked when a request with it is
        added. Other names are Python's (a subclass's own attributes; a misspelt field is an AttributeError)."""
        if k not in _SAMPLING_FIELDS:
            return super().__setattr__(k, v)
        v = _checked_field(k, v)
        try:
            super().__setattr__(k, v)
        except (TypeError, ValueError) as e:
            why = "" if "incompatible function arguments" in str(e) else ": " + str(e).splitlines()[0]
            raise TypeError(f"SamplingParams.{k} cannot be {v!r} ({type(v).__name__}){why}") from None

    def clone(self) -> "SamplingParams":
        """A copy of the same class (vLLM's SamplingParams.clone)."""
        q = type(self).__new__(type(self))
        q.__setstate__(self.__getstate__())
        return q


def _checked_field(k: str, v: Any) -> Any:
    """SamplingParams field `k`'s value `v` as the extension's property takes it, after vLLM's checks: TypeError for a
    wrong type, ValueError for an out-of-range int or an empty allowed_token_ids, each naming the field."""
    if v is None and k in ("stop", "stop_token_ids", "logit_bias", "allowed_token_ids", "bad_words"):
        return {} if k == "logit_bias" else []  # vLLM's None: the default (none)
    if v is None and k == "max_tokens":
        return 2**31 - 1  # vLLM's None: no limit but the request's max_model_len (finish_reason "length")
    if k == "stop" and isinstance(v, str):
        v = [v]
    if k == "seed" and isinstance(v, int) and not isinstance(v, bool) and v == -1:
        return None  # vLLM's __post_init__: seed -1 is no seed
    if k in ("logprobs", "prompt_logprobs") and isinstance(v, bool):
        v = int(v)  # vLLM's __post_init__: logprobs True is 1 (and False, an int there, 0)
    # Types as vLLM's (msgspec) fields: a bool is not a number and None is not a bool (both were taken silently:
    # skip_special_tokens=None read False, max_tokens=True read 1).
    if k == "structured_outputs" and v is not None and not isinstance(v, StructuredOutputsParams):
        raise TypeError("SamplingParams.structured_outputs must be None or a StructuredOutputsParams "
                        f"(ssmserve.sampling_params), got {type(v).__name__}")
    if k in _BOOL_FIELDS:
        v = _check_bool(v, f"SamplingParams.{k}")
    elif isinstance(v, bool) and (k in _INT_FIELDS or k == "seed"):
        raise TypeError(f"SamplingParams.{k} must be an int, got {v!r} (bool)")
    elif k in _ID_LIST_FIELDS and not isinstance(v, (str, bytes)):
        try:
            ids = list(v)
        except TypeError:
            ids = None
        for t in ids or ():
            if isinstance(t, bool):
                raise TypeError(f"SamplingParams.{k} must hold token ids (ints), got {t!r} (bool)")
            if isinstance(t, int) and not 0 <= t < 2**31 - 1:
                raise ValueError(f"SamplingParams.{k}: token id {t} is out of the vocabulary range [0, 2147483647)")
        if k == "allowed_token_ids" and ids == []:  # vLLM refuses an empty list
            raise ValueError("SamplingParams.allowed_token_ids must not be empty (None allows every token)")
        if ids is not None:
            v = ids
    if k == "bad_words":
        v = _str_list(v, "SamplingParams.bad_words")
    if k == "seed" and isinstance(v, int) and not -2**63 <= v < 2**64:
        raise ValueError(f"SamplingParams.seed must be None or an integer in [-2**63, 2**64), got {v}")
    if k == "seed" and isinstance(v, int) and v < 0:
        v += 2**64  # as the server takes a negative int64 seed: its two's-complement bits
    if k in _INT_FIELDS and isinstance(v, int) and not isinstance(v, bool) and not -2**31 <= v < 2**31:
        raise ValueError(f"SamplingParams.{k} must fit in 32 bits, got {v}")
    if k == "logit_bias":
        try:
            v = {int(t): float(b) for t, b in dict(v).items()}
        except (TypeError, ValueError) as e:
            raise TypeError(f"SamplingParams.logit_bias cannot be {v!r} ({type(v).__name__}): {str(e).splitlines()[0]}") from None
    if k == "stop" and not isinstance(v, (str, bytes)):
        try:
            v = list(v)
        except TypeError:
            pass  # the property's own TypeError names it
    return v


def _str_list(value, where: str) -> list:
    """value's items as a list when it is an iterable of str other than a str itself; TypeError naming `where` otherwise
    (a lone string would otherwise be taken as its characters)."""
    items = None
    if not isinstance(value, (str, bytes)):
        try:
            items = list(value)
        except TypeError:
            pass
    if items is None or not all(isinstance(w, str) for w in items):
        raise TypeError(f"{where} must be a list of str, got {value!r} ({type(value).__name__})"[:300])
    return items


def _check_bool(value, where: str) -> bool:
    """value when it is a bool (or numpy's bool_); TypeError naming `where` otherwise (no truthiness of strings)."""
    if isinstance(value, bool) or (type(value).__module__ == "numpy" and type(value).__name__ in ("bool_", "bool")):
        return bool(value)
    raise TypeError(f"{where} must be a bool, got {value!r} ({type(value).__name__})"[:300])
