#!/usr/bin/env python3
"""Trains small SentencePiece models (BPE and unigram, byte fallback on) with the `sentencepiece` package on the
LAMBADA passages and writes the ids and decodes that package gives, for tests/unit/test_tokenizer_sentencepiece.cpp.

Run: python3 -m venv /work/venv-spm && /work/venv-spm/bin/pip install sentencepiece==0.1.99
     /work/venv-spm/bin/python tools/make_tokenizer_sentencepiece_expected.py [--shared DIR]
(after tools/make_tokenizer_configs_expected.py, whose texts.jsonl it reuses). 0.1.99 is the Python release of the
C++ library Debian 12 ships (libsentencepiece 0.1.97); 0.2.x breaks exact ties of the unigram Viterbi search the other
way (2 of the 2000 texts here: "...." as "..." + "." rather than "." + "..."), BPE is the same.

Outputs under tests/data/tokenizers/spm_<type>/:
  tokenizer.model  the model (vocab 1000)
  expected.jsonl   per line of texts.jsonl: {"ids": fnv(sp.encode(text) joined by ','), "n": its length,
                   "dec": fnv(sp.decode(ids))}, the text being the bytes decoded with errors='replace'
  lambada.txt      per LAMBADA passage: fnv(ids joined by ',') len(ids) fnv(sp.decode(ids))
"""
import argparse
import io
import json
import pathlib

import sentencepiece as spm

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "tokenizers"


def fnv(s):
    h = 0xcbf29ce484222325
    for b in s.encode("utf-8"):
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shared", default=str(ROOT.parent / "shared"))
    args = ap.parse_args()
    lambada = [json.loads(line)["text"] for line in open(pathlib.Path(args.shared) / "data" / "lambada_test.jsonl")]
    texts = [bytes.fromhex(json.loads(line)["hex"]).decode("utf-8", "replace") for line in open(OUT / "texts.jsonl")]
    # BPE with identity normalization and byte fallback as Llama / Mistral / Codestral ship it; unigram with the default
    # nmt_nfkc normalization (its precompiled charsmap travels in the model).
    for model_type, rule in [("bpe", "identity"), ("unigram", "nmt_nfkc")]:
        d = OUT / f"spm_{model_type}"
        d.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        spm.SentencePieceTrainer.train(sentence_iterator=iter(lambada), model_writer=buf, model_type=model_type,
                                       vocab_size=1000, byte_fallback=True, character_coverage=0.9995,
                                       user_defined_symbols=["<tool>"], minloglevel=2, num_threads=2,
                                       normalization_rule_name=rule)
        (d / "tokenizer.model").write_bytes(buf.getvalue())
        sp = spm.SentencePieceProcessor(model_proto=buf.getvalue())
        with open(d / "expected.jsonl", "w") as f:
            for t in texts:
                ids = sp.encode(t)
                f.write(json.dumps({"ids": fnv(",".join(map(str, ids))), "n": len(ids), "dec": fnv(sp.decode(ids))}) + "\n")
        with open(d / "lambada.txt", "w") as f:
            for p in lambada:
                ids = sp.encode(p)
                f.write(f"{fnv(','.join(map(str, ids)))} {len(ids)} {fnv(sp.decode(ids))}\n")
        assert spm.__version__ == "0.1.99", spm.__version__
        print(f"spm_{model_type}: {sp.get_piece_size()} pieces, bos {sp.bos_id()}")


if __name__ == "__main__":
    main()
