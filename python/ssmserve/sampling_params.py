"""Sampling parameters (vLLM's vllm.sampling_params): SamplingParams, the per-request decoding knobs,
StructuredOutputsParams, the constraint of SamplingParams.structured_outputs, and RequestOutputKind, what
AsyncLLM.generate streams (SamplingParams.output_kind).

    from ssmserve import LLM, SamplingParams
    from ssmserve.sampling_params import StructuredOutputsParams
    params = SamplingParams(max_tokens=32, structured_outputs=StructuredOutputsParams(choice=["yes", "no"]))

Both are classes of the extension module: SamplingParams subclasses it here to check its keyword arguments as vLLM
does; StructuredOutputsParams is the extension's class itself (its constructor checks its arguments). An attribute
read returns a copy of the value (as a list field's list): `p.structured_outputs.regex = ...` changes the copy, so
assign a new StructuredOutputsParams to p.structured_outputs instead.
"""
import copy
import enum
from typing import Any

from . import _ssmserve

__all__ = ["SamplingParams", "StructuredOutputsParams", "RequestOutputKind"]


class RequestOutputKind(enum.Enum):
    """vLLM's RequestOutputKind (SamplingParams.output_kind): what each output of AsyncLLM.generate holds.
    CUMULATIVE: the whole output so far (the default); DELTA: only what is new since the previous output (text,
    token_ids, logprobs; prompt_logprobs in the first output only); FINAL_ONLY: no output until the finished one.
    LLM.generate returns finished outputs whatever it is (as vLLM's LLM)."""
    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


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
_BOOL_FIELDS = frozenset({"ignore_eos", "include_stop_str_in_output", "skip_special_tokens", "detokenize"})
# Fields whose None is a value of its own (vLLM's from_optional passes it on): max_tokens None is no limit, ...
_NULLABLE_FIELDS = frozenset({"seed", "stop", "stop_token_ids", "bad_words", "max_tokens", "logprobs",
                              "prompt_logprobs", "structured_outputs", "logit_bias", "allowed_token_ids", "extra_args"})
_ID_LIST_FIELDS = frozenset({"stop_token_ids", "allowed_token_ids"})


class SamplingParams(_ssmserve.SamplingParams):
    """vLLM's SamplingParams: n, temperature (1.0), top_p, top_k, min_p, seed, presence_penalty,
    frequency_penalty, repetition_penalty, max_tokens (16; None: up to max_model_len), min_tokens, stop,
    stop_token_ids, ignore_eos, logprobs, prompt_logprobs, include_stop_str_in_output, skip_special_tokens,
    logit_bias ({token_id: bias}), allowed_token_ids (only these ids can be sampled; not empty), bad_words (a list of
    str: words never generated; each word's tokens as given and with a leading space, as vLLM), structured_outputs
    (a StructuredOutputsParams: the output follows its JSON schema, regex, choice, grammar, ...), detokenize (True;
    False: the outputs carry token_ids only: text "" and logprobs' decoded_token None; stop strings then are a
    ValueError, as vLLM), output_kind (a RequestOutputKind: what AsyncLLM.generate streams; LLM.generate ignores it),
    extra_args (None or a dict for plugins: stored and returned as given; the engine does not read it).
    SamplingParams.from_optional(**kwargs): vLLM's, None meaning the default.
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
        """A copy of the same class (vLLM's SamplingParams.clone; extra_args deep-copied, as vLLM's deepcopy)."""
        q = type(self).__new__(type(self))
        q.__setstate__(self.__getstate__())
        if self.extra_args is not None:
            q.extra_args = copy.deepcopy(self.extra_args)
        return q

    @classmethod
    def from_optional(cls, **kwargs: Any) -> "SamplingParams":
        """vLLM's SamplingParams.from_optional: SamplingParams(**kwargs) where None is the default for the fields
        that take no None (n, temperature, top_p, top_k, min_p, the penalties, min_tokens, the bool fields,
        output_kind) and keeps its meaning for the others (max_tokens=None: no limit but max_model_len; seed=None:
        unseeded; stop=None: none; ...). logit_bias values are clamped to [-100, 100], as vLLM's. Unknown names are a
        TypeError; a logit_bias key that is no token id a ValueError; other bad values as the constructor's."""
        for k in kwargs:
            if k not in _SAMPLING_FIELDS:
                raise TypeError(f"SamplingParams.from_optional() got an unexpected keyword argument '{k}'")
        args = {k: v for k, v in kwargs.items() if v is not None or k in _NULLABLE_FIELDS}
        bias = args.get("logit_bias")
        if bias is not None:
            if not isinstance(bias, dict):
                raise TypeError(f"SamplingParams.logit_bias must be a dict, got {type(bias).__name__}")
            clamped = {}
            for t, b in bias.items():
                try:
                    t = int(t)
                except (TypeError, ValueError):
                    raise ValueError("logit_bias contains a key that cannot be converted to an integer token id: "
                                     f"{t!r}"[:300]) from None
                if isinstance(b, bool) or not isinstance(b, (int, float)):
                    raise TypeError(f"SamplingParams.logit_bias[{t}] must be a float, got {b!r} ({type(b).__name__})"[:300])
                clamped[t] = min(100.0, max(-100.0, float(b)))
            args["logit_bias"] = clamped
        return cls(**args)


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
    if k == "output_kind" and not isinstance(v, RequestOutputKind):
        raise TypeError("SamplingParams.output_kind must be a RequestOutputKind (ssmserve.sampling_params), got "
                        f"{v!r} ({type(v).__name__})"[:300])
    if k == "extra_args" and v is not None and not isinstance(v, dict):
        raise TypeError(f"SamplingParams.extra_args must be None or a dict, got {v!r} ({type(v).__name__})"[:300])
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
