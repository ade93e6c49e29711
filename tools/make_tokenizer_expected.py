#!/usr/bin/env python3
"""Writes the tokenizer's expected test data under tests/data/tokenizer/ using Hugging Face `tokenizers`.

Needs `pip install tokenizers` (only for this script; the C++ tests read the committed files).
Run from anywhere: python3 tools/make_tokenizer_expected.py [--shared DIR]

Outputs (all derived from models/tiny-mamba/tokenizer.json):
  vectors.jsonl    44 reference strings from shared/data/gpt-neox-tokenizer-vectors.jsonl (checked against HF),
                   with HF decode of the ids.
  lambada_ids.txt  header line, then one line per LAMBADA passage: space-separated HF ids. The C++ test reads the
                   passages from $SSMSERVE_SHARED_DIR/data/lambada_test.jsonl.
  unicode_classes.txt  HF's regex class of every code point (L letter, N number, W whitespace, O other), as ranges.
  nfc_probes.txt   HF's NFC of per-code-point probe strings (listed when NFC changes them, plus all composition pairs).
  generated.jsonl  seeded random strings stored as hex bytes (invalid UTF-8 survives) with HF ids and decodes, plus
                   random id sequences (including ids past the vocabulary) with HF decodes.
Every decode uses skip_special_tokens explicitly: the Python binding defaults it to True, transformers to False.
"""
import argparse
import json
import pathlib
import random
import unicodedata

from tokenizers import Tokenizer

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "tokenizer"
SEED = 20240611
N_TEXT = 3000
N_ID_SEQS = 400

# Blocks of long-assigned characters (avoid code points newer than utf8proc's / PCRE2's Unicode tables).
BLOCKS = [
    (0x0020, 0x007E), (0x00A0, 0x00FF), (0x0100, 0x017F), (0x0180, 0x024F), (0x0250, 0x02AF), (0x0370, 0x03FF),
    (0x0400, 0x04FF), (0x0531, 0x0587), (0x05D0, 0x05EA), (0x0600, 0x06FF), (0x0900, 0x097F), (0x0980, 0x09FF),
    (0x0B80, 0x0BFF), (0x0E00, 0x0E7F), (0x10A0, 0x10FF), (0x1100, 0x11FF), (0x1200, 0x137F), (0x1780, 0x17FF),
    (0x1E00, 0x1EFF), (0x1F00, 0x1FFF), (0x2000, 0x206F), (0x2070, 0x209C), (0x20A0, 0x20BF), (0x2100, 0x214F),
    (0x2150, 0x218B), (0x2190, 0x21FF), (0x2200, 0x22FF), (0x2500, 0x257F), (0x3000, 0x303F), (0x3040, 0x309F),
    (0x30A0, 0x30FF), (0x4E00, 0x9FCC), (0xAC00, 0xD7A3), (0xF900, 0xFA2D), (0xFF00, 0xFFEF), (0x1D400, 0x1D7FF),
    (0x1F300, 0x1F5FF), (0x1F600, 0x1F64F), (0x1F680, 0x1F6C5), (0x20000, 0x2A6D6),
]
COMBINING = [chr(c) for c in range(0x0300, 0x0370)] + [chr(c) for c in range(0x0591, 0x05BE)] + \
    [chr(c) for c in range(0x20D0, 0x20F1)] + ["\u093c", "\u094d", "\u0e38", "\u0e48", "\u3099", "\u309a"]
WHITESPACE = [" ", "\t", "\n", "\r", "\x0b", "\x0c", "\x1c", "\x1f", "\x85", "\xa0", "\u1680", "\u180e", "\u2000",
              "\u2009", "\u200a", "\u200b", "\u2028", "\u2029", "\u202f", "\u205f", "\u3000", "\ufeff"]
PUNCT = list(".,;:!?-_()[]{}<>/\\|@#$%^&*+=~`\"'") + ["...", "--", "\u2014", "\u2013", "\u201c", "\u201d",
                                                       "\u2018", "\u2019", "\u00ab", "\u00bb", "\u00bf", "\u00a1"]
WORDS = ["the", "The", "Hello", "world", "tokenizer", "Mamba", "state", "space", "model", "über", "naïve", "café",
         "Ελληνικά", "русский", "日本語", "中文", "한국어", "עברית", "العربية", "हिन्दी", "ไทย", "ქართული", "a", "I"]
CONTRACTIONS = ["it's", "IT'S", "It'S", "don't", "DON'T", "we're", "WE'RE", "I've", "I'VE", "I'm", "I'M", "you'll",
                "YOU'LL", "he'd", "HE'D", "'s", "'S", "''s", "'t", "'re", "'ve", "'m", "'ll", "'d", "can't", "o'clock",
                "rock'n'roll", "it\u2019s", "' s", "'sam", "'tis", "'dd", "'lll", "James's"]
EMOJI = ["\U0001F600", "\U0001F44D\U0001F3FD", "\U0001F468\u200D\U0001F469\u200D\U0001F467\u200D\U0001F466",
         "\U0001F3F3\uFE0F\u200D\U0001F308", "\U0001F1FA\U0001F1F8", "1\uFE0F\u20E3", "\u2764\uFE0F", "\U0001F999",
         "\U0001F469\U0001F3FE\u200D\U0001F4BB", "\U0001F9D1\u200D\U0001F91D\u200D\U0001F9D1", "\u263A", "\U0001F680"]
DIGITS = ["0", "7", "42", "1234567890", "3.14159", "1,000,000", "$100", "50%", "2024-06-11", "12:30", "\u0661\u0662",
          "\uff11\uff12", "\u00b2\u00b3", "\u2160\u2161", "\u0967\u0968", "1e-9", "0x1F"]
SPECIAL = ["<|endoftext|>", "<|padding|>", "<|endoftext|", "<|ENDOFTEXT|>", "<|endoftext|><|endoftext|>", "|>", "<|"]
NFC_CASES = ["\u212b", "\u2126", "\u212a", "A\u030a", "e\u0301", "\u1100\u1161\u11a8", "\u0958", "\uf900", "\u1f71",
             "\u0344", "o\u0308\u0301", "a\u0323\u0302", "a\u0302\u0323", "\u00c5\u0301", "\u0340", "\u0374",
             # characters newer than HF's NFC tables (Unicode 9) or than PCRE2's (Unicode 14); see unicode_compat.h
             "a\u09fe\u05b9", "\uac00\u11a7", "\u1100\u1161\u11a7", "\U00011935\U00011930", "x\U00031350\U00031351",
             "\U00010D40\U00010D41", "\U000105C0a", "e\u1ac0\u0301"]


def rand_char(rng):
    while True:
        lo, hi = rng.choice(BLOCKS)
        c = chr(rng.randint(lo, hi))
        if unicodedata.category(c) not in ("Cn", "Cs", "Co"):
            return c


def fragment(rng):
    k = rng.randrange(13)
    if k == 0:
        return "".join(rand_char(rng) for _ in range(rng.randint(1, 12)))
    if k == 1:  # base letters with combining marks in random (often non-canonical) order
        return "".join(rng.choice("aeouAEOUnczsy" + rand_char(rng)) + "".join(
            rng.choice(COMBINING) for _ in range(rng.randint(0, 3))) for _ in range(rng.randint(1, 4)))
    if k == 2:
        return unicodedata.normalize(rng.choice(["NFD", "NFKD", "NFC"]), rng.choice(WORDS + NFC_CASES))
    if k == 3:
        return "".join(rng.choice(WHITESPACE) for _ in range(rng.randint(1, 6)))
    if k == 4:
        return " " * rng.choice([1, 2, 3, 4, 7, 8, 16, 23, 24, 25, 26, 47, 48, 49, 60, 80])
    if k == 5:
        return rng.choice(DIGITS)
    if k == 6:
        return "".join(rng.choice(PUNCT) for _ in range(rng.randint(1, 4)))
    if k == 7:
        return rng.choice(CONTRACTIONS)
    if k == 8:
        return rng.choice(EMOJI)
    if k == 9:
        return rng.choice(SPECIAL)
    if k == 10:
        return rng.choice(NFC_CASES)
    if k == 11:
        return "".join(chr(rng.randint(0x20, 0x7E)) for _ in range(rng.randint(1, 10)))
    return rng.choice(WORDS)


def joiner(rng):
    return rng.choice(["", " ", " ", " ", "  ", "\n", "\t", " \n ", "   "])


INVALID_SNIPPETS = [b"\x80", b"\xbf", b"\xc0\x80", b"\xc1\xbf", b"\xe0\x80\x80", b"\xe0\x9f\xbf", b"\xed\xa0\x80",
                    b"\xed\xbf\xbf", b"\xf0\x80\x80\x80", b"\xf4\x90\x80\x80", b"\xf5\x80", b"\xff", b"\xfe\xfe",
                    b"\xe2\x82", b"\xf0\x9f\x98", b"\xf0\x9f", b"\xc3", b"\xe2", b"\xf0\x9f\x98\x80\x80"]


def make_bytes(rng, i):
    """The i-th generated test input, as bytes."""
    kind = i % 10
    if kind < 6:
        parts = [fragment(rng) for _ in range(rng.randint(1, 8))]
        s = "".join(p + joiner(rng) for p in parts)
        return s.encode("utf-8")
    if kind == 6:  # valid text with injected ill-formed bytes
        b = bytearray()
        for _ in range(rng.randint(1, 6)):
            b += fragment(rng).encode("utf-8")
            b += rng.choice(INVALID_SNIPPETS)
            if rng.random() < 0.3:  # truncate a multi-byte character
                c = rand_char(rng).encode("utf-8")
                b += c[: rng.randint(1, max(1, len(c) - 1))]
        return bytes(b)
    if kind == 7:  # random bytes
        return bytes(rng.randint(0, 255) for _ in range(rng.randint(1, 24)))
    if kind == 8:  # special tokens mid-text, whitespace around them
        s = fragment(rng) + rng.choice(SPECIAL) + rng.choice(["", " ", "  ", "\u0301", "\n"]) + fragment(rng)
        return s.encode("utf-8")
    # long strings: long words, long mixed text, long whitespace runs
    choice = rng.randrange(3)
    if choice == 0:
        return ("".join(rng.choice("abcdefghij") for _ in range(rng.randint(200, 1200)))).encode("utf-8")
    if choice == 1:
        return "".join(fragment(rng) + joiner(rng) for _ in range(rng.randint(20, 60))).encode("utf-8")
    return "".join(rng.choice([" ", "\t", "\n", "  ", "\r\n"]) * rng.randint(1, 40) for _ in range(8)).encode()


def write_generated(tok, path):
    rng = random.Random(SEED)
    n_text = 0
    with open(path, "w") as f:
        fixed = [b"", b" ", b"<|endoftext|>", b"a<|endoftext|>b", " " * 100, b"\xff\xfe", b"\x00a\x00"]
        inputs = [x if isinstance(x, bytes) else x.encode() for x in fixed] + [make_bytes(rng, i) for i in range(N_TEXT)]
        for b in inputs:
            text = b.decode("utf-8", errors="replace")
            ids = tok.encode(text).ids
            rec = {"hex": b.hex(), "ids": ids,
                   "decoded_hex": tok.decode(ids, skip_special_tokens=False).encode().hex(),
                   "decoded_skip_hex": tok.decode(ids, skip_special_tokens=True).encode().hex()}
            f.write(json.dumps(rec) + "\n")
            n_text += 1
        vocab = tok.get_vocab_size(with_added_tokens=True)
        for _ in range(N_ID_SEQS):  # arbitrary ids: partial UTF-8 tokens, specials, space runs, ids past the vocab
            ids = [rng.choice([rng.randrange(vocab), rng.randrange(vocab), rng.randint(0, 1), rng.randint(50254, 50279),
                               rng.randint(94, 256)]) for _ in range(rng.randint(1, 30))]
            rec = {"ids_only": ids, "decoded_hex": tok.decode(ids, skip_special_tokens=False).encode().hex(),
                   "decoded_skip_hex": tok.decode(ids, skip_special_tokens=True).encode().hex()}
            f.write(json.dumps(rec) + "\n")
    return n_text


NFC_PROBE_PREFIXES = ["", "\u05b0", "\u1100", "\uac00"]  # c alone, after a ccc-10 mark, after L jamo, after LV
NFC_PROBE_SUFFIXES = ["\u0334"]  # c before a ccc-1 mark
# Keep this probe set in sync with tests/unit/test_tokenizer_unicode.cpp.


def code_points():
    return (c for c in range(0x110000) if not 0xD800 <= c < 0xE000)


def write_unicode_audit(tok):
    """Per-code-point answers of HF's pre-tokenizer regex and NFC normalizer, for the exhaustive C++ test."""
    pt, norm = tok.pre_tokenizer, tok.normalizer
    ranges = []
    for c in code_points():
        ch = chr(c)
        if len(pt.pre_tokenize_str("a" + ch)) == 1:
            k = "L"
        elif len(pt.pre_tokenize_str("1" + ch)) == 1:
            k = "N"
        elif len(pt.pre_tokenize_str("!" + ch)) == 1:
            k = "O"
        else:
            k = "W"
        if ranges and ranges[-1][2] == k and ranges[-1][1] == c - 1:
            ranges[-1][1] = c
        else:
            ranges.append([c, c, k])
    with open(OUT / "unicode_classes.txt", "w") as f:
        f.write("# lo hi class (hex code points; L letter, N number, W whitespace, O other) per HF ByteLevel regex\n")
        for lo, hi, k in ranges:
            f.write(f"{lo:x} {hi:x} {k}\n")
    n_probes = 0
    with open(OUT / "nfc_probes.txt", "w") as f:
        f.write("# probe_hex nfc_hex (HF NFC); unlisted generic probes are unchanged by NFC\n")
        for c in code_points():
            ch = chr(c)
            probes = [p + ch for p in NFC_PROBE_PREFIXES] + [ch + q for q in NFC_PROBE_SUFFIXES]
            d = unicodedata.decomposition(ch)
            if d and not d.startswith("<") and len(d.split()) == 2:  # composition pair, listed even if unchanged
                pair = "".join(chr(int(x, 16)) for x in d.split())
            else:
                pair = None
            for p in probes:
                out = norm.normalize_str(p)
                if out != p:
                    f.write(f"{p.encode().hex()} {out.encode().hex()}\n")
                    n_probes += 1
            if pair is not None:
                f.write(f"{pair.encode().hex()} {norm.normalize_str(pair).encode().hex()}\n")
                n_probes += 1
    return len(ranges), n_probes


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shared", default=str(ROOT.parent / "shared"), help="shared/ folder (default: <repo>/../shared)")
    args = ap.parse_args()
    shared = pathlib.Path(args.shared)
    tok = Tokenizer.from_file(str(ROOT / "models" / "tiny-mamba" / "tokenizer.json"))
    OUT.mkdir(parents=True, exist_ok=True)

    n_vec = 0
    with open(shared / "data" / "gpt-neox-tokenizer-vectors.jsonl") as src, open(OUT / "vectors.jsonl", "w") as dst:
        for line in src:
            rec = json.loads(line)
            ids = tok.encode(rec["text"]).ids
            assert ids == rec["ids"], f"HF disagrees with the reference vector {rec['text']!r}"
            rec["decoded"] = tok.decode(ids, skip_special_tokens=False)
            dst.write(json.dumps(rec) + "\n")
            n_vec += 1

    texts = [json.loads(line)["text"] for line in open(shared / "data" / "lambada_test.jsonl", encoding="utf-8")]
    round_trip = sum(tok.decode(tok.encode(t).ids, skip_special_tokens=False) == t for t in texts)
    with open(OUT / "lambada_ids.txt", "w") as f:
        f.write(f"# {len(texts)} passages of lambada_test.jsonl; {round_trip} decode back to their text exactly\n")
        for enc in tok.encode_batch(texts):
            f.write(" ".join(map(str, enc.ids)) + "\n")

    n_ranges, n_nfc = write_unicode_audit(tok)
    n_gen = write_generated(tok, OUT / "generated.jsonl")
    print(f"vectors: {n_vec}, lambada passages: {len(texts)} (round trip exact: {round_trip}), generated texts: {n_gen}, "
          f"class ranges: {n_ranges}, nfc probes listed: {n_nfc}")


if __name__ == "__main__":
    main()
