#!/usr/bin/env python3
"""Writes the Qwen tokenizer reference data under tests/data/tokenizer/ with transformers 5.x and `tokenizers`.

Run with the reference venv: /work/venv-ref/bin/python tools/make_tokenizer_qwen_expected.py [--shared DIR]
(DIR defaults to ../shared next to the checkout; the models are read from DIR/models).

Outputs (read by tests/unit/test_tokenizer_qwen.cpp):
  qwen_ids.json     texts (hand-picked cases on the Qwen regexes' differences from GPT-2, plus seeded random mixes)
                    with the ids and decodes of
                      auto_qwen3_5_moe  AutoTokenizer.from_pretrained(models/tiny-qwen3_5_moe): transformers picks
                                        Qwen3_5Tokenizer and rebuilds the pipeline from tokenizer.json's vocab/merges;
                      seq_qwen2, seq_qwen3_5  tokenizers.Tokenizer on models/tiny-mamba/tokenizer.json with the
                                        pre_tokenizer replaced by Sequence[Split(Regex(P), Isolated), ByteLevel(
                                        use_regex=false)], P = Qwen2Tokenizer's / Qwen3_5Tokenizer's PRETOKENIZE_REGEX
                                        (the C++ test writes the same file).
                    Decodes use skip_special_tokens=False.
  onig_classes.txt  Oniguruma's class of every code point as `tokenizers` sees it (L \\p{L}, M \\p{M}, N \\p{N},
                    W \\s, O other; surrogates listed as O), as ranges.
"""
import argparse
import json
import pathlib
import random

from tokenizers import Regex, Tokenizer, pre_tokenizers
from transformers import AutoTokenizer
from transformers.models.qwen2 import tokenization_qwen2
from transformers.models.qwen3_5 import tokenization_qwen3_5

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "tokenizer"
SEED = 20250301
N_RANDOM = 300

CASES = [
    "a.\n\n\u201cOh", "Hello\n\nworld", "line1\r\nline2\r\n\r\nline3", "\n", "\n\n\n", "\r\n", "\r\r\n\n", " \n", "  \n  ",
    "a  \n b", "x \t\n\ty", "end.\n", "end!\n\n", "Wow?!\r\n", "\"quote\"\n\n\u2014dash", "(a)\n(b)", "...\n...",
    "caf\u00e9 cafe\u0301 e\u0301\u0301 A\u030a \u212b", "na\u0131\u0308ve", "\u0915\u094d\u0937 \u0939\u093f\u0928\u094d\u0926\u0940 \u0928\u092e\u0938\u094d\u0924\u0947",
    "\u0e44\u0e17\u0e22 \u0e01\u0e34\u0e19\u0e02\u0e49\u0e32\u0e27 \u0e19\u0e49\u0e33", "\u05e9\u05c1\u05b8\u05dc\u05d5\u05b9\u05dd", "\u0627\u0644\u0639\u064e\u0631\u064e\u0628\u0650\u064a\u064e\u0651\u0629",
    "0", "42", "1234567890", "3.14159", "1,000,000", "$100", "50%", "2024-06-11 12:30", "\u0661\u0662\u0663", "\uff11\uff12",
    "\u00b2\u00b3", "\u2160\u2161", "a1b2c3", "x=10;y=20", "IT'S", "It'S", "it's", "DON'T", "WE'RE", "I'VE", "I'M", "YOU'LL",
    "HE'D", "'S", "'s", "'LL", "'Ll", "'\u017f", "James'S", "rock'N'roll", "it\u2019s", "' s", "'tis",
    "\U0001F600", "\U0001F44D\U0001F3FD ok", "\U0001F468\u200D\U0001F469\u200D\U0001F467", "\u2764\ufe0f\n", "1\ufe0f\u20e3",
    "\U0001F1FA\U0001F1F8!", "Hello \u4e16\u754c, \u3053\u3093\u306b\u3061\u306f \u043f\u0440\u0438\u0432\u0435\u0442 \u0393\u03b5\u03b9\u03b1",
    "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8", "mixed\u0915\u093fscripts", "<|endoftext|>", "a<|endoftext|>\n\nb", "<|padding|>x",
    "   ", "a   b", "    indented\n        more", "\t\ttabs", "trailing   ", " leading", "x\u00a0y", "\u3000\u3000z",
    "def f(x):\n    return x**2\n", "<div>\n  <p>hi</p>\n</div>", "#include <stdio.h>\r\nint main(){}", "a\u0897b \u0627\u0897",
    "\U00011380\U000113b8", "\u1c89\u1c8a", "\U00010d40\U00010d41", "-\u0301x", "!\u0301", " \u0301", "\n\u0301", "\u0301",
    "a\u200db", "x\u2028y\u2029z", "\x0b\x0c\x85", "a\u180eb", "e\u0301\n\ne\u0301",
]

POOL = (list("abcXYZ019 .,;:!?'\"-_()[]{}\n\r\t") + ["\r\n", "\n\n", "  ", "'S", "'s", "'ll", "\u00e9", "e\u0301", "\u0301",
        "\u0915\u093f", "\u094d", "\u0e01\u0e34", "\u0e48", "\u4e2d", "\u3042", "\u0416", "\u03a9", "\u05d0\u05b8",
        "\u0661", "\u00b2", "\U0001F600", "\u200d", "\ufe0f", "\u00a0", "\u3000", "\u2014", "\u201c", "\u2019",
        "<|endoftext|>", "\u0897", "\U000113b8", "\u1c89", "\u017f", "\u212b", "\u0131"])


def sequence_tokenizer(neox_json, pattern):
    j = json.loads(neox_json)
    j["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
    return Tokenizer.from_str(json.dumps(j))


def onig_classes():
    pats = [(k, pre_tokenizers.Split(Regex(p), behavior="removed"))
            for k, p in [("L", r"\p{L}"), ("M", r"\p{M}"), ("N", r"\p{N}"), ("W", r"\s")]]
    classes = []
    for c in range(0x110000):
        k = "O"
        if not 0xD800 <= c < 0xE000:
            for name, p in pats:
                if not p.pre_tokenize_str(chr(c)):
                    k = name
                    break
        classes.append(k)
    ranges, lo = [], 0
    for c in range(1, 0x110001):
        if c == 0x110000 or classes[c] != classes[lo]:
            ranges.append((lo, c - 1, classes[lo]))
            lo = c
    return ranges


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shared", default=str(ROOT.parent / "shared"))
    args = ap.parse_args()
    models = pathlib.Path(args.shared) / "models"
    rng = random.Random(SEED)
    texts = list(CASES) + ["".join(rng.choice(POOL) for _ in range(rng.randint(1, 24))) for _ in range(N_RANDOM)]

    auto = AutoTokenizer.from_pretrained(str(models / "tiny-qwen3_5_moe"))
    assert type(auto).__name__ == "Qwen3_5Tokenizer", type(auto).__name__
    neox = (models / "tiny-mamba" / "tokenizer.json").read_text()
    tokenizers = {
        "auto_qwen3_5_moe": (lambda t: auto(t)["input_ids"], lambda ids: auto.decode(ids, skip_special_tokens=False)),
    }
    for name, pattern in [("seq_qwen2", tokenization_qwen2.PRETOKENIZE_REGEX),
                          ("seq_qwen3_5", tokenization_qwen3_5.PRETOKENIZE_REGEX)]:
        tok = sequence_tokenizer(neox, pattern)
        tokenizers[name] = (lambda t, tok=tok: tok.encode(t).ids,
                            lambda ids, tok=tok: tok.decode(ids, skip_special_tokens=False))
    out = {"versions": {"transformers": __import__("transformers").__version__,
                        "tokenizers": __import__("tokenizers").__version__},
           "patterns": {"seq_qwen2": tokenization_qwen2.PRETOKENIZE_REGEX,
                        "seq_qwen3_5": tokenization_qwen3_5.PRETOKENIZE_REGEX},
           "cases": []}
    for t in texts:
        case = {"text": t}
        for name, (enc, dec) in tokenizers.items():
            ids = enc(t)
            case[name] = {"ids": ids, "decode": dec(ids)}
        out["cases"].append(case)
    OUT.mkdir(parents=True, exist_ok=True)
    with open(OUT / "qwen_ids.json", "w") as f:
        f.write('{"versions": ' + json.dumps(out["versions"]) + ',\n "patterns": ' + json.dumps(out["patterns"]) +
                ',\n "cases": [\n')
        f.write(",\n".join(json.dumps(c, ensure_ascii=True) for c in out["cases"]))
        f.write("\n]}\n")
    with open(OUT / "onig_classes.txt", "w") as f:
        f.write("# lo hi class (hex code points; Oniguruma via tokenizers: L \\p{L}, M \\p{M}, N \\p{N}, W \\s, O other)\n")
        for lo, hi, k in onig_classes():
            f.write(f"{lo:x} {hi:x} {k}\n")
    print(f"wrote {len(texts)} cases to {OUT / 'qwen_ids.json'} and {OUT / 'onig_classes.txt'}")


if __name__ == "__main__":
    main()
