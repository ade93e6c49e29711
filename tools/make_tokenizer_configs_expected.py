#!/usr/bin/env python3
"""Builds small tokenizers in the tokenizer.json configurations of the supported checkpoint families and writes the
ids and decodes HF `tokenizers` gives for them, for tests/unit/test_tokenizer_configs.cpp.

Run: /work/venv-tok/bin/python tools/make_tokenizer_configs_expected.py [--shared DIR]
(venv: python3 -m venv /work/venv-tok && /work/venv-tok/bin/pip install tokenizers sentencepiece transformers jinja2;
DIR defaults to ../shared next to the checkout and must hold data/lambada_test.jsonl).

Every vocabulary is trained with tokenizers' BpeTrainer on the LAMBADA passages (vocab 1000), then the pipeline of
the family is set. Outputs under tests/data/tokenizers/:
  texts.jsonl              generated test strings, one {"hex": raw bytes} a line (may be ill-formed UTF-8: the
                           tokenizers side sees bytes.decode('utf-8', 'replace'), as ssmserve repairs input)
  <config>/tokenizer.json  the tokenizer
  <config>/expected.jsonl  per text: {"ids": fnv of encode(add_special_tokens=True) joined by ',', "n": its length,
                           "plain": the same of encode(add_special_tokens=False) when it differs, "dec": fnv(decode(ids)), "skip": fnv(decode(ids, skip_special_tokens=True)) when it
                           differs from "dec"};
                           then per random id sequence: {"rand": ids, "dec": ..., "skip": ...}
  <config>/lambada.txt     per LAMBADA passage: fnv(ids joined by ',') len(ids) fnv(decode(ids, skip_special_tokens=True))
fnv = FNV-1a 64 of the UTF-8 bytes, as 16 hex digits.
Re-running may train a different normalizer_mix vocabulary (tokenizers' BpeTrainer breaks some ties with the
continuing_subword_prefix in hash order); its files stay consistent with each other, and the tests read them.
"""
import argparse
import json
import pathlib
import random

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "tokenizers"
SEED = 32
N_TEXTS = 2000
N_RAND_IDS = 300
VOCAB = 1000

LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")
BYTE_TOKENS = [f"<0x{b:02X}>" for b in range(256)]


def fnv(s):
    h = 0xcbf29ce484222325
    for b in s.encode("utf-8"):
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def train(texts, tok, specials, byte_level=False, prefix=None):
    kw = dict(vocab_size=VOCAB, special_tokens=specials, show_progress=False, min_frequency=2)
    if byte_level:
        kw["initial_alphabet"] = pre_tokenizers.ByteLevel.alphabet()
    if prefix:
        kw["continuing_subword_prefix"] = prefix
    tok.train_from_iterator(texts, trainers.BpeTrainer(**kw))
    return tok


def finish(tok, *, drop_added=(), model_opts=None, pipeline=None):
    """Rewrites the trained tokenizer's JSON: drops `drop_added` from added_tokens (they stay in the model vocab, as
    SentencePiece-converted byte tokens do), sets model options and replaces pipeline parts."""
    j = json.loads(tok.to_str())
    j["added_tokens"] = [a for a in j["added_tokens"] if a["content"] not in drop_added]
    j["model"].update(model_opts or {})
    j.update(pipeline or {})
    return Tokenizer.from_str(json.dumps(j))


def sp_tokens():
    return ["<unk>", "<s>", "</s>"]


def llama_legacy(texts):
    """Mistral 7B / Codestral / Jamba-v0.1 tokenizer.json (transformers' LlamaConverter, legacy): Prepend + Replace
    normalizer, no pre-tokenizer, BPE with byte_fallback and fuse_unk, decoder Replace/ByteFallback/Fuse/Strip."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    train(texts, tok, sp_tokens() + BYTE_TOKENS)
    tok = finish(tok, drop_added=BYTE_TOKENS, pipeline={"pre_tokenizer": None})
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", 1)])
    tok.add_special_tokens([AddedToken("[INST]", special=True, normalized=False),
                            AddedToken("[/INST]", special=True, normalized=False)])
    tok.add_tokens([AddedToken("<tool>", rstrip=True, normalized=False),
                    AddedToken("said", normalized=True, single_word=True)])
    return tok


def metaspace_first(texts):
    """Llama-2 style with legacy=false (Jamba-1.5, Falcon-H1-like SentencePiece BPE): Metaspace pre-tokenizer with
    prepend_scheme first, BPE byte_fallback + ignore_merges, decoder ByteFallback/Metaspace/Fuse; EOS appended too."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    train(texts, tok, sp_tokens() + BYTE_TOKENS)
    tok = finish(tok, drop_added=BYTE_TOKENS, model_opts={"ignore_merges": True})
    tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace(replacement="\u2581",
                                                                                prepend_scheme="first", split=False),
                                     decoders.Fuse()])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", pair="<s> $A </s> $B:1 </s>:1",
                                                       special_tokens=[("<s>", 1), ("</s>", 2)])
    tok.add_special_tokens([AddedToken("<mask>", lstrip=True, special=True, normalized=False),
                            AddedToken("<|im_start|>", special=True, normalized=False)])
    tok.add_tokens([AddedToken(" the", normalized=True), AddedToken("ab", single_word=True, normalized=False)])
    return tok


def bytelevel_llama3(texts):
    """Granite-4.0 / Bamba / Nemotron-H / MiniMax style: Split(Llama-3 regex) + ByteLevel(use_regex=false), BPE with
    ignore_merges, ByteLevel decoder, post-processor Sequence[ByteLevel, TemplateProcessing(BOS)]."""
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    train(texts, tok, ["<|begin_of_text|>", "<|end_of_text|>"], byte_level=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
                                      special_tokens=[("<|begin_of_text|>", 0)])])
    tok.add_special_tokens([AddedToken("<|eot_id|>", special=True, normalized=False),
                            AddedToken("<|start_header_id|>", special=True, normalized=False, rstrip=True),
                            AddedToken("<think>", special=False, normalized=False, lstrip=True)])
    tok.add_tokens([AddedToken("  ", normalized=True), AddedToken("\u00e9t\u00e9", normalized=True)])
    return tok


def falcon_digits(texts):
    """Falcon style: NFC, pre-tokenizers Punctuation(contiguous), ByteLevel(add_prefix_space, regex), Digits, Split of
    3-digit groups; ByteLevel decoder and post-processor."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Punctuation(behavior="contiguous"),
        pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True),
        pre_tokenizers.Digits(individual_digits=False),
        pre_tokenizers.Split(Regex("[0-9][0-9][0-9]"), behavior="isolated")])
    train(texts, tok, ["<|endoftext|>", ">>ABSTRACT<<"], byte_level=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    tok.add_tokens([AddedToken("<|code|>", normalized=False, single_word=True, lstrip=True, rstrip=True)])
    return tok


def normalizer_mix(texts):
    """The other normalizers and split behaviours: NFKC, Lowercase, Strip, Replace(regex); Split(MergedWithPrevious,
    Removed, inverted Contiguous), Digits(individual), Metaspace(split, always); BPE with a continuing_subword_prefix;
    decoder Replace/Metaspace/Strip."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", continuing_subword_prefix="##"))
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase(), normalizers.Strip(),
                                           normalizers.Replace(Regex(r"\s+"), " "), normalizers.NFD()])
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"[.!?]"), behavior="merged_with_previous"),
        pre_tokenizers.Split(Regex(r"--+"), behavior="removed"),
        pre_tokenizers.Split(Regex(r"[a-z]+"), behavior="contiguous", invert=True),
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.Split(" ", behavior="merged_with_next"),
        pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)])
    train(texts, tok, ["<unk>", "[CLS]", "[SEP]"], prefix="##")
    tok.decoder = decoders.Sequence([decoders.Replace("##", ""), decoders.Metaspace(prepend_scheme="always"),
                                     decoders.Strip(" ", 1, 0)])
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                                       special_tokens=[("[CLS]", 1), ("[SEP]", 2)])
    tok.add_tokens([AddedToken("Hello", normalized=True), AddedToken("[X]", normalized=False, lstrip=True)])
    return tok


CONFIGS = {"llama_legacy": llama_legacy, "metaspace_first": metaspace_first, "bytelevel_llama3": bytelevel_llama3,
           "falcon_digits": falcon_digits, "normalizer_mix": normalizer_mix}

POOL = (list("abcdefghijklmnopqrstuvwxyzABCXYZ0123456789 .,;:!?'\"-_()[]{}#/\\@$%&*+=<>|~`\n\r\t") +
        ["\r\n", "\n\n", "  ", "   ", "\t\t", "'s", "'S", "'ll", "n't", "the", "The", " the", "and", "said", " said",
         "ing", "hello", "Hello", "ab", " ab ", "--", "---", "...", "123", "4567", "1234567", "3.14", "\u00e9", "e\u0301",
         "\u0301", "\u0308", "\u0915\u093f", "\u094d", "\u0e01\u0e34", "\u0e48", "\u4e2d\u6587", "\u3042\u3044",
         "\u0416\u0438\u0437\u043d\u044c", "\u03a9\u03c3\u03c2", "\u05d0\u05b8", "\u0627\u0644\u0639", "\u0661\u0662",
         "\u0966", "\u00b2", "\u00bd", "\u2460", "\u2163", "\uff11", "\uff21\uff42", "\ufb01", "\u2126", "\u212b",
         "\u1e9e", "\u0130", "\u00df", "\u03a3", "\u2028", "\u2029", "\u00a0", "\u3000", "\u2003", "\u200b", "\u200d",
         "\ufeff", "\U0001F600", "\U0001F44D\U0001F3FD", "\U0001F468\u200D\U0001F469\u200D\U0001F467", "\u2764\ufe0f",
         "1\ufe0f\u20e3", "\U0001F1FA\U0001F1F8", "\u2014", "\u201c", "\u201d", "\u2019", "\u00bf", "\u00a1", "\u3002",
         "\uff01", "\u2581", "\u2581\u2581", "##", "<0x41>", "<s>", "</s>", "<unk>", "[INST]", "[/INST]", "<tool>",
         "<mask>", " <mask>", "<|im_start|>", "<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<think>",
         "<|endoftext|>", ">>ABSTRACT<<", "<|code|>", " <|code|> ", "[CLS]", "[X]", " [X]", "\u00e9t\u00e9",
         "\U00010348", "\U0001D400", "\ud7a3", "\u1100\u1161\u11a8", "\x00", "\x7f", "\x1b"])
BAD_UTF8 = [b"\xff", b"\xc0\xaf", b"\xe2\x82", b"\xed\xa0\x80", b"\xf0\x9f\x98", b"\x80", b"\xf4\x90\x80\x80", b"\xc3"]


def make_texts(rng, lambada):
    out = [b"", b" ", b"a", b"  leading and trailing  ", b"\n", "Hello World".encode(), b"123456789",
           "caf\u00e9 na\u00efve \u00c5ngstr\u00f6m".encode(), "[INST] said hello [/INST]".encode()]
    while len(out) < N_TEXTS:
        kind = rng.random()
        if kind < 0.15:  # a slice of a passage
            p = rng.choice(lambada)
            i = rng.randrange(len(p))
            out.append(p[i:i + rng.randint(1, 80)].encode())
            continue
        parts = []
        for _ in range(rng.randint(1, 12)):
            if rng.random() < 0.04:
                parts.append(rng.choice(BAD_UTF8))
            else:
                parts.append(rng.choice(POOL).encode())
        out.append(b"".join(parts))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shared", default=str(ROOT.parent / "shared"))
    args = ap.parse_args()
    lambada = [json.loads(line)["text"] for line in open(pathlib.Path(args.shared) / "data" / "lambada_test.jsonl")]
    rng = random.Random(SEED)
    texts = make_texts(rng, lambada)
    OUT.mkdir(parents=True, exist_ok=True)
    with open(OUT / "texts.jsonl", "w") as f:
        for t in texts:
            f.write(json.dumps({"hex": t.hex()}) + "\n")
    for name, build in CONFIGS.items():
        tok = build(lambada)
        d = OUT / name
        d.mkdir(exist_ok=True)
        tok.save(str(d / "tokenizer.json"), pretty=False)
        tok = Tokenizer.from_file(str(d / "tokenizer.json"))  # exactly what the C++ side reads
        n = tok.get_vocab_size(with_added_tokens=True)
        with open(d / "expected.jsonl", "w") as f:
            for t in texts:
                s = t.decode("utf-8", "replace")
                ids = tok.encode(s).ids
                plain = tok.encode(s, add_special_tokens=False).ids
                rec = {"ids": fnv(",".join(map(str, ids))), "n": len(ids)}
                if plain != ids:
                    rec["plain"] = fnv(",".join(map(str, plain)))
                rec["dec"] = fnv(tok.decode(ids, skip_special_tokens=False))
                skip = fnv(tok.decode(ids, skip_special_tokens=True))
                if skip != rec["dec"]:
                    rec["skip"] = skip
                f.write(json.dumps(rec) + "\n")
            for _ in range(N_RAND_IDS):
                ids = [rng.randrange(n) for _ in range(rng.randint(1, 12))]
                f.write(json.dumps({"rand": ids, "dec": fnv(tok.decode(ids, skip_special_tokens=False)),
                                    "skip": fnv(tok.decode(ids, skip_special_tokens=True))}) + "\n")
        with open(d / "lambada.txt", "w") as f:
            for p in lambada:
                ids = tok.encode(p).ids
                f.write(f"{fnv(','.join(map(str, ids)))} {len(ids)} {fnv(tok.decode(ids))}\n")
        print(f"{name}: vocab {n}")


if __name__ == "__main__":
    main()
