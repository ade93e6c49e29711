"""The engine's tokenizer as Python code reads a Hugging Face tokenizer (LLM.get_tokenizer / AsyncLLM.get_tokenizer):
encoding and decoding through the C++ tokenizer, the chat template as LLM.chat renders it, and the special tokens,
vocabulary and limits transformers' AutoTokenizer reports for the same folder (tokenizer_config.json and the
tokenizer class's defaults)."""
import json
import operator
import os
from typing import Any, Dict, List, Optional, Sequence, Union

from . import _check_process, _render_chats
from .sampling_params import _check_bool

__all__ = ["BatchEncoding", "Tokenizer"]

#: transformers' model_max_length when tokenizer_config.json sets none (VERY_LARGE_INTEGER: no limit).
_VERY_LARGE_INTEGER = int(1e30)

#: transformers' special-token attributes, in its order (all_special_tokens lists them so, then the additional ones).
_SPECIAL_TOKEN_ATTRIBUTES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")

#: The special tokens a tokenizer class sets when tokenizer_config.json does not name them (transformers 5's class
#: defaults: the __init__ arguments of GPT2Tokenizer, GPTNeoXTokenizer, LlamaTokenizer, Qwen2Tokenizer and
#: Qwen3_5Tokenizer; src/tokenizer/transformers_class.cpp registers the same tokens). Other classes set none.
_CLASS_SPECIAL_TOKENS = {
    "GPT2Tokenizer": {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>"},
    "GPTNeoXTokenizer": {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>",
                         "pad_token": "<|padding|>"},
    "LlamaTokenizer": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
    "Qwen2Tokenizer": {"eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>", "pad_token": "<|endoftext|>"},
    "Qwen3_5Tokenizer": {"eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>", "pad_token": "<|endoftext|>"},
}


def _token_content(value) -> Optional[str]:
    """A special token as tokenizer_config.json writes it (a str, or an AddedToken {"content": ...}), or None."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _special_tokens_of(folder: str, tokenizer_class: str) -> Dict[str, Any]:
    """transformers' special tokens and model_max_length of the tokenizer in `folder`, loaded as `tokenizer_class`:
    {"bos_token": str or None, ... (each of _SPECIAL_TOKEN_ATTRIBUTES), "additional": [str], "padding_side": str or None,
    "model_max_length": int}.
    Each attribute is tokenizer_config.json's value (null: none), else the class default; the additional ones are its
    additional_special_tokens (transformers 4) and extra_special_tokens (5: a list, or a dict of named ones).
    ValueError naming the file when it exists but cannot be read as a JSON object."""
    path = os.path.join(folder, "tokenizer_config.json")
    try:
        with open(path, encoding="utf-8") as f:
            cfg = json.load(f)
    except FileNotFoundError:
        cfg = {}
    except (OSError, ValueError) as e:
        raise ValueError(f"{path} cannot be read: {e}") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"{path} is not a JSON object")
    defaults = _CLASS_SPECIAL_TOKENS.get(tokenizer_class, {})
    out: Dict[str, Any] = {}
    for attr in _SPECIAL_TOKEN_ATTRIBUTES:
        out[attr] = _token_content(cfg[attr]) if attr in cfg else defaults.get(attr)
    additional: List[str] = []
    for key in ("additional_special_tokens", "extra_special_tokens"):
        value = cfg.get(key)
        items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
        additional.extend(t for t in map(_token_content, items) if t is not None)
    out["additional"] = additional
    side = cfg.get("padding_side")
    out["padding_side"] = side if side in ("left", "right") else None
    length = cfg.get("model_max_length")
    out["model_max_length"] = (int(length) if isinstance(length, (int, float)) and not isinstance(length, bool)
                               and length == length and abs(length) != float("inf") else _VERY_LARGE_INTEGER)
    return out


class BatchEncoding(dict):
    """What the tokenizer's call returns (Hugging Face's BatchEncoding, lists only): a dict whose keys ("input_ids",
    "attention_mask") are also attributes."""

    def __getattr__(self, name: str):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class Tokenizer:
    """The engine's tokenizer (LLM.get_tokenizer), with the Hugging Face names users call: encode(text,
    add_special_tokens=True) -> token ids (as prompts are encoded), tokenizer(text) -> {"input_ids", "attention_mask"},
    decode(ids, skip_special_tokens=False) -> str (ids the tokenizer does not know, e.g. the padded rows of an
    embedding, decode to nothing, as Hugging Face's fast tokenizers), batch_decode, convert_ids_to_tokens,
    apply_chat_template (the LLM's chat template, as LLM.chat renders it), vocab_size, and as transformers'
    AutoTokenizer reports them for the same folder: bos_token / eos_token / unk_token / pad_token and their *_id
    (None when the tokenizer has none), all_special_tokens / all_special_ids, get_vocab(), convert_tokens_to_ids,
    convert_tokens_to_string, tokenize(text) (the token strings), chat_template, name_or_path, model_max_length;
    and vLLM's max_token_id. eos_token_id falls back to the first of the model's EOS ids when the tokenizer names no
    eos_token. The special tokens come from tokenizer_config.json, else the tokenizer class's defaults."""

    def __init__(self, engine, pid: Optional[int] = None):
        self._engine = engine
        self._pid = os.getpid() if pid is None else pid  # the process that created the engine (see _check_process)
        self._special: Optional[Dict[str, Any]] = None  # _special_tokens_of, read on first use
        self._vocab: Optional[Dict[str, int]] = None     # get_vocab, built on first use

    def _special_tokens(self) -> Dict[str, Any]:
        if self._special is None:
            _check_process(self._pid, "tokenizer's LLM")
            self._special = _special_tokens_of(self._engine.tokenizer_dir(), self._engine.tokenizer_class())
        return self._special

    def _vocabulary(self) -> Dict[str, int]:
        if self._vocab is None:
            _check_process(self._pid, "tokenizer's LLM")
            self._vocab = self._engine.vocab()
        return self._vocab

    def encode(self, text: str, add_special_tokens: bool = True) -> List[int]:
        if not isinstance(text, str):
            raise TypeError(f"encode() takes a str, got {type(text).__name__}")
        add_special_tokens = _check_bool(add_special_tokens, "encode() add_special_tokens")
        _check_process(self._pid, "tokenizer's LLM")
        return self._engine.encode(text, add_special_tokens)

    def __call__(self, text: Union[str, Sequence[str]], add_special_tokens: bool = True,
                 return_tensors: Optional[str] = None) -> "BatchEncoding":
        """Hugging Face's tokenizer(text): a BatchEncoding (a dict whose keys are attributes too) with "input_ids" and
        "attention_mask" (all ones); a list of texts gives lists. return_tensors must be None (lists only)."""
        if return_tensors is not None:
            raise ValueError(f"return_tensors={return_tensors!r}: this tokenizer returns lists only (None)")
        if isinstance(text, str):
            ids = self.encode(text, add_special_tokens)
            return BatchEncoding(input_ids=ids, attention_mask=[1] * len(ids))
        if not isinstance(text, (list, tuple)):
            raise TypeError(f"tokenizer() takes a str or a list of str, got {type(text).__name__}")
        ids = [self.encode(t, add_special_tokens) for t in text]
        return BatchEncoding(input_ids=ids, attention_mask=[[1] * len(i) for i in ids])

    def batch_decode(self, sequences: Sequence[Sequence[int]], skip_special_tokens: bool = False) -> List[str]:
        return [self.decode(ids, skip_special_tokens) for ids in sequences]

    def convert_ids_to_tokens(self, ids: Union[int, Sequence[int]]) -> Union[Optional[str], List[Optional[str]]]:
        """The vocabulary strings of token ids (byte-level BPE's, e.g. "Ġthe"); None for an id it does not know."""
        one = not hasattr(ids, "__iter__")
        checked = [operator.index(t) for t in ([ids] if one else ids)]
        _check_process(self._pid, "tokenizer's LLM")
        tokens = [self._engine.id_to_token(t) if 0 <= t < 2**31 else None for t in checked]
        return tokens[0] if one else tokens

    def apply_chat_template(self, conversation, tools: Optional[List[dict]] = None, chat_template: Optional[str] = None,
                            add_generation_prompt: bool = False, continue_final_message: bool = False,
                            tokenize: bool = True, **kwargs):
        """Hugging Face's apply_chat_template with the LLM's template (LLM.chat's rendering; extra keyword arguments
        are template variables, e.g. enable_thinking=False): the text with tokenize=False, else its token ids
        (encoded without adding special tokens: the template writes them). A list of conversations gives a list."""
        tokenize = _check_bool(tokenize, "apply_chat_template() tokenize")
        # Hugging Face's options that are not template variables.
        return_dict = _check_bool(kwargs.pop("return_dict", False), "apply_chat_template() return_dict")
        if kwargs.pop("return_tensors", None) is not None:
            raise ValueError("apply_chat_template(return_tensors=...): this tokenizer returns lists only (None)")
        for name in ("padding", "truncation", "max_length", "tokenizer_kwargs", "return_assistant_tokens_mask"):
            if kwargs.pop(name, None) not in (None, False):
                raise ValueError(f"apply_chat_template({name}=...) is not supported by this tokenizer")
        _check_process(self._pid, "tokenizer's LLM")
        batched = isinstance(conversation, (list, tuple)) and bool(conversation) and isinstance(conversation[0], (list, tuple))
        texts = _render_chats(self._engine, conversation, chat_template, add_generation_prompt, continue_final_message,
                              tools, kwargs or None, "apply_chat_template()")
        out = [self._engine.encode(t, False) for t in texts] if tokenize else texts
        if return_dict and tokenize:  # Hugging Face: a BatchEncoding of the ids
            return BatchEncoding(input_ids=out if batched else out[0],
                                 attention_mask=[[1] * len(i) for i in out] if batched else [1] * len(out[0]))
        return out if batched else out[0]

    def decode(self, ids: Union[int, Sequence[int]], skip_special_tokens: bool = False) -> str:
        """The text of token ids (one id or a sequence); ids the tokenizer does not know decode to nothing (as Hugging
        Face's fast tokenizers). TypeError for ids that are not ints or a skip_special_tokens that is not a bool;
        ValueError for an id outside [0, 2**31)."""
        skip_special_tokens = _check_bool(skip_special_tokens, "decode() skip_special_tokens")
        if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
            try:
                ids = [operator.index(ids)]  # one id (Hugging Face's decode takes an int too)
            except TypeError:
                raise TypeError(f"decode() takes a list of int token ids, got {type(ids).__name__}") from None
        checked = []
        for t in ids:
            if isinstance(t, bool):
                raise TypeError("decode() takes int token ids, got a bool")
            try:
                t = operator.index(t)
            except TypeError:
                raise TypeError(f"decode() takes int token ids, got {t!r} ({type(t).__name__})"[:300]) from None
            if not 0 <= t < 2**31:
                raise ValueError(f"token id {t} is not in the vocabulary")
            checked.append(t)
        _check_process(self._pid, "tokenizer's LLM")
        return self._engine.decode(checked, skip_special_tokens)

    @property
    def vocab_size(self) -> int:
        """The number of token ids (the largest id + 1, added tokens included)."""
        return self._engine.vocab_size()

    @property
    def eos_token_id(self) -> Optional[int]:
        """The id of eos_token (Hugging Face's), else the first of the model's EOS ids, else None."""
        token = self.eos_token
        if token is not None:
            return self.convert_tokens_to_ids(token)
        ids = self._engine.eos_token_ids()
        return ids[0] if ids else None

    def __len__(self) -> int:
        return self.vocab_size

    # Special tokens, as transformers' attributes (str or None) and their ids (None when the token is not set).
    @property
    def bos_token(self) -> Optional[str]:
        """tokenizer_config.json's bos_token, else the tokenizer class's default, else None."""
        return self._special_tokens()["bos_token"]

    @property
    def eos_token(self) -> Optional[str]:
        """tokenizer_config.json's eos_token, else the tokenizer class's default, else None."""
        return self._special_tokens()["eos_token"]

    @property
    def unk_token(self) -> Optional[str]:
        """tokenizer_config.json's unk_token, else the tokenizer class's default, else None."""
        return self._special_tokens()["unk_token"]

    @property
    def pad_token(self) -> Optional[str]:
        """tokenizer_config.json's pad_token, else the tokenizer class's default, else None."""
        return self._special_tokens()["pad_token"]

    @property
    def sep_token(self) -> Optional[str]:
        """tokenizer_config.json's sep_token, else the tokenizer class's default, else None."""
        return self._special_tokens()["sep_token"]

    @property
    def cls_token(self) -> Optional[str]:
        """tokenizer_config.json's cls_token, else the tokenizer class's default, else None."""
        return self._special_tokens()["cls_token"]

    @property
    def mask_token(self) -> Optional[str]:
        """tokenizer_config.json's mask_token, else the tokenizer class's default, else None."""
        return self._special_tokens()["mask_token"]

    @property
    def sep_token_id(self) -> Optional[int]:
        """The id of sep_token (convert_tokens_to_ids), or None when it is not set."""
        return None if self.sep_token is None else self.convert_tokens_to_ids(self.sep_token)

    @property
    def cls_token_id(self) -> Optional[int]:
        """The id of cls_token (convert_tokens_to_ids), or None when it is not set."""
        return None if self.cls_token is None else self.convert_tokens_to_ids(self.cls_token)

    @property
    def mask_token_id(self) -> Optional[int]:
        """The id of mask_token (convert_tokens_to_ids), or None when it is not set."""
        return None if self.mask_token is None else self.convert_tokens_to_ids(self.mask_token)

    @property
    def special_tokens_map(self) -> Dict[str, Any]:
        """transformers' special_tokens_map: each set special-token attribute by name, and
        "additional_special_tokens" when there are any."""
        special = self._special_tokens()
        out: Dict[str, Any] = {a: special[a] for a in _SPECIAL_TOKEN_ATTRIBUTES if special[a] is not None}
        if special["additional"]:
            out["additional_special_tokens"] = list(special["additional"])
        return out

    @property
    def is_fast(self) -> bool:
        """True, as a Hugging Face fast tokenizer (the tokenizer.json pipeline) reports."""
        return True

    @property
    def padding_side(self) -> str:
        """tokenizer_config.json's padding_side, else "right" (Hugging Face's default; this tokenizer never pads)."""
        return self._special_tokens().get("padding_side") or "right"

    @property
    def bos_token_id(self) -> Optional[int]:
        """The id of bos_token (convert_tokens_to_ids), or None when it is not set."""
        return None if self.bos_token is None else self.convert_tokens_to_ids(self.bos_token)

    @property
    def unk_token_id(self) -> Optional[int]:
        """The id of unk_token, or None when it is not set or names no token."""
        return None if self.unk_token is None else self._engine.token_to_id(self.unk_token)

    @property
    def pad_token_id(self) -> Optional[int]:
        """The id of pad_token (convert_tokens_to_ids), or None when it is not set."""
        return None if self.pad_token is None else self.convert_tokens_to_ids(self.pad_token)

    @property
    def all_special_tokens(self) -> List[str]:
        """transformers' all_special_tokens: the set special-token attributes (bos, eos, unk, sep, pad, cls, mask) then
        the additional special tokens, each once, in that order."""
        special = self._special_tokens()
        tokens = [special[a] for a in _SPECIAL_TOKEN_ATTRIBUTES if special[a] is not None] + special["additional"]
        return list(dict.fromkeys(tokens))

    @property
    def all_special_ids(self) -> List[int]:
        """The ids of all_special_tokens (convert_tokens_to_ids)."""
        return self.convert_tokens_to_ids(self.all_special_tokens)

    def get_vocab(self) -> Dict[str, int]:
        """Every token string (byte-level BPE's form, e.g. "Ġthe"; added tokens included) -> its id: a new dict."""
        return dict(self._vocabulary())

    @property
    def max_token_id(self) -> int:
        """vLLM's max_token_id: the largest id of get_vocab()."""
        return max(self._vocabulary().values())

    def convert_tokens_to_ids(self, tokens: Union[str, Sequence[str], None]) -> Union[Optional[int], List[Optional[int]]]:
        """The id of a token string, or a list of ids for a list (Hugging Face's): a string that is no token gives
        unk_token's id (None without one); None gives None. TypeError for anything but a str or a list of str."""
        if tokens is None:
            return None
        one = isinstance(tokens, str)
        items = [tokens] if one else tokens
        if not isinstance(items, (list, tuple)) or not all(isinstance(t, str) for t in items):
            raise TypeError("convert_tokens_to_ids() takes a str or a list of str, got "
                            f"{tokens!r} ({type(tokens).__name__})"[:300])
        _check_process(self._pid, "tokenizer's LLM")
        ids = [self._engine.token_to_id(t) for t in items]
        if any(i is None for i in ids):
            unk = self.unk_token_id
            ids = [unk if i is None else i for i in ids]
        return ids[0] if one else ids

    def convert_tokens_to_string(self, tokens: Sequence[str]) -> str:
        """The text of token strings (Hugging Face's: as decode() gives it for their ids, special tokens kept); a
        string that is no token contributes nothing. TypeError for anything but a list of str."""
        if isinstance(tokens, str) or not isinstance(tokens, (list, tuple)) or not all(isinstance(t, str) for t in tokens):
            raise TypeError(f"convert_tokens_to_string() takes a list of str, got {tokens!r} ({type(tokens).__name__})"[:300])
        _check_process(self._pid, "tokenizer's LLM")
        return self._engine.tokens_to_string(list(tokens))

    def tokenize(self, text: str, add_special_tokens: bool = False) -> List[str]:
        """Hugging Face's tokenize: the token strings of `text` (convert_ids_to_tokens of its encoding, without the
        special tokens encode() adds unless add_special_tokens=True). TypeError for a text that is not a str."""
        ids = self.encode(text, add_special_tokens)
        return [self._engine.id_to_token(i) for i in ids]

    @property
    def chat_template(self) -> Optional[str]:
        """The source of the checkpoint's chat template (chat_template.jinja or tokenizer_config.json's; the default
        one when it names several), or None when it has none (LLM.chat then uses ssmserve's plain default).
        SsmserveError for a template file that cannot be read or parsed."""
        _check_process(self._pid, "tokenizer's LLM")
        return self._engine.chat_template_source()

    @property
    def name_or_path(self) -> str:
        """The tokenizer's folder, as LLM(tokenizer=...) (else the model) named it."""
        return self._engine.tokenizer_dir()

    @property
    def model_max_length(self) -> int:
        """tokenizer_config.json's model_max_length, else transformers' int(1e30) (no limit)."""
        return self._special_tokens()["model_max_length"]
