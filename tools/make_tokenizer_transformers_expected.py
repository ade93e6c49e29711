#!/usr/bin/env python3
"""Writes what transformers 5 AutoTokenizer gives for checkpoint folders that pair a family tokenizer.json
(tests/data/tokenizers/<family>) with the config.json model_type and tokenizer_config.json the families ship, for
tests/unit/test_tokenizer_classes.cpp: transformers picks a tokenizer class from them and some classes (LlamaTokenizer,
GPT2Tokenizer, GPTNeoXTokenizer, the Qwen classes) rebuild tokenizer.json's pipeline.

Run: /work/venv-tok/bin/python tools/make_tokenizer_transformers_expected.py   (after make_tokenizer_configs_expected.py)

Outputs under tests/data/tokenizers/classes/:
  cases.json    [{"name", "family", "config", "tokenizer_config", "class"}]: the folder contents and the class
                transformers instantiated ("TokenizersBackend" when it kept tokenizer.json)
  <name>.txt    per line of ../texts.jsonl: fnv(ids joined by ',') len(ids) fnv(decode(ids, skip_special_tokens=False))
                for ids = tokenizer(text)["input_ids"] (fnv as in make_tokenizer_configs_expected.py)
"""
import json
import pathlib
import tempfile
import warnings

from transformers import AutoTokenizer

ROOT = pathlib.Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "tokenizers"
OUT = DATA / "classes"

CASES = [
    # Codestral-Mamba: mamba2's registered GPTNeoXTokenizer differs from the hub's LlamaTokenizer -> LlamaTokenizer.
    ("codestral_llama", "llama_legacy", {"model_type": "mamba2"}, {"tokenizer_class": "LlamaTokenizerFast"}),
    ("llama_legacy_true", "llama_legacy", {"model_type": "falcon_h1"},
     {"tokenizer_class": "LlamaTokenizer", "legacy": True}),
    ("llama_no_prefix", "metaspace_first", {"model_type": "bamba"},
     {"tokenizer_class": "LlamaTokenizer", "add_prefix_space": False}),
    # Jamba: in MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS, registered TokenizersBackend -> tokenizer.json as it is.
    ("jamba_backend", "llama_legacy", {"model_type": "jamba"}, {"tokenizer_class": "LlamaTokenizerFast"}),
    # Granite-4.0-H: registered TokenizersBackend over the hub's GPT2Tokenizer.
    ("granite_backend", "bytelevel_llama3", {"model_type": "granitemoehybrid"}, {"tokenizer_class": "GPT2Tokenizer"}),
    # No registered class (bamba, minimax): the hub's GPT2Tokenizer rebuilds ByteLevel with the GPT-2 regex.
    ("minimax_gpt2", "bytelevel_llama3", {"model_type": "minimax"}, {"tokenizer_class": "GPT2TokenizerFast"}),
    ("gpt2_prefix", "falcon_digits", {"model_type": "bamba"},
     {"tokenizer_class": "GPT2Tokenizer", "add_prefix_space": True}),
    # A hub LlamaTokenizer over a ByteLevel tokenizer.json (Llama-3 style): TokenizersBackend.
    ("llama3_bytelevel", "bytelevel_llama3", {"model_type": "nemotron_h"}, {"tokenizer_class": "LlamaTokenizerFast"}),
    # tokenizer_config.json special tokens missing from tokenizer.json become added special tokens (new ids, or the
    # vocabulary id of a plain token, which then matches anywhere).
    ("backend_new_specials", "bytelevel_llama3", {"model_type": "nemotron_h"},
     {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<newbos>", "pad_token": "<pad>", "unk_token": "said"}),
    ("llama_unk_in_vocab", "metaspace_first", {"model_type": "bamba"},
     {"tokenizer_class": "LlamaTokenizer", "unk_token": "said", "pad_token": "<pad>"}),
    # A mamba checkpoint without tokenizer_class: GPTNeoXTokenizer (NFC + ByteLevel).
    ("mamba_neox", "falcon_digits", {"model_type": "mamba"}, None),
]


def fnv(s):
    h = 0xcbf29ce484222325
    for b in s.encode("utf-8"):
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def main():
    warnings.filterwarnings("ignore")
    texts = [bytes.fromhex(json.loads(line)["hex"]).decode("utf-8", "replace") for line in open(DATA / "texts.jsonl")]
    OUT.mkdir(exist_ok=True)
    meta = []
    for name, family, config, tok_config in CASES:
        d = pathlib.Path(tempfile.mkdtemp())
        (d / "tokenizer.json").write_text((DATA / family / "tokenizer.json").read_text())
        (d / "config.json").write_text(json.dumps(config))
        if tok_config is not None:
            (d / "tokenizer_config.json").write_text(json.dumps(tok_config))
        tok = AutoTokenizer.from_pretrained(str(d))
        meta.append({"name": name, "family": family, "config": config, "tokenizer_config": tok_config,
                     "class": type(tok).__name__})
        with open(OUT / f"{name}.txt", "w") as f:
            for t in texts:
                ids = tok(t)["input_ids"]
                f.write(f"{fnv(','.join(map(str, ids)))} {len(ids)} {fnv(tok.decode(ids, skip_special_tokens=False))}\n")
        print(name, type(tok).__name__)
    (OUT / "cases.json").write_text(json.dumps(meta, indent=1) + "\n")


if __name__ == "__main__":
    main()
