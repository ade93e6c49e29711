#!/usr/bin/env python3
"""Builds the small tekken.json (Mistral's tiktoken-style tokenizer file) of the tekken test and its expected ids.

A byte-level BPE is trained here on LAMBADA passages (ranks: the 256 bytes, then merges in the order learned, so
every token is reachable as tiktoken needs), written in tekken's format (base64 token bytes, the v7 special-token
list padded with fillers to default_num_special_tokens, vocab cut to default_vocab_size), and the expected ids come
from mistral_common's Tekkenizer (pip install mistral-common), independent of ssmserve.
Usage: make_tekken.py [LAMBADA_JSONL] (default ../shared/data/lambada_test.jsonl)
"""
import base64
import collections
import json
import os
import sys

import regex
from mistral_common.tokens.tokenizers.tekken import Tekkenizer

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(HERE))))
PATTERN = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?"
           r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
NUM_MERGES = 700
NUM_SPECIAL = 100


def train(texts):
    words = collections.Counter()
    for t in texts:
        for w in regex.findall(PATTERN, t):
            words[tuple(bytes([b]) for b in w.encode())] += 1
    ranks = [bytes([i]) for i in range(256)]
    for _ in range(NUM_MERGES):
        pairs = collections.Counter()
        for w, c in words.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] += c
        if not pairs:
            break
        best = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]
        ranks.append(best[0] + best[1])
        merged = collections.Counter()
        for w, c in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(best[0] + best[1])
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            merged[tuple(out)] += c
        words = merged
    return ranks


def main():
    src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "..", "shared", "data", "lambada_test.jsonl")
    texts = [json.loads(line)["text"] for line in open(src)]
    ranks = train(texts[:400])
    vocab = [{"rank": i, "token_bytes": base64.b64encode(b).decode(), "token_str": b.decode("utf-8", "replace")}
             for i, b in enumerate(ranks)]
    special = [{"rank": i, "token_str": s, "is_control": True} for i, s in enumerate(
        ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]",
         "[/TOOL_RESULTS]", "[TOOL_CALLS]", "[IMG]", "<pad>", "[IMG_BREAK]", "[IMG_END]", "[PREFIX]", "[MIDDLE]",
         "[SUFFIX]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[TOOL_CONTENT]"])]
    # The vocabulary is cut to default_vocab_size - default_num_special_tokens: the last 20 merges are dropped.
    cfg = {"pattern": PATTERN, "num_vocab_tokens": len(vocab), "default_vocab_size": NUM_SPECIAL + len(vocab) - 20,
           "default_num_special_tokens": NUM_SPECIAL, "version": "v7"}
    path = os.path.join(HERE, "tekken.json")
    with open(path, "w") as f:
        json.dump({"config": cfg, "vocab": vocab, "special_tokens": special}, f, ensure_ascii=False)
    tok = Tekkenizer.from_file(path)
    strings = texts[400:460] + [
        "", " ", "  leading and trailing  ", "Hello, World! 12345 678", "naïve café — “quotes” 日本語 😀 e\u0301",
        "<s> [INST] special strings are text [/INST] </s>", "tabs\tand\nnew\r\nlines\n\n\n", "x" * 300,
        "CamelCaseWords and ALLCAPS and lower", "a/b/c\n//\n", "\u00a0\u2003 spaces", "1,000,000.50$"]
    with open(os.path.join(HERE, "expected.jsonl"), "w") as f:
        for s in strings:
            ids = tok.encode(s, bos=True, eos=False)
            f.write(json.dumps({"text": s, "ids": ids, "decoded": tok.decode(ids)}, ensure_ascii=False) + "\n")
    print(f"{path}: {len(vocab)} tokens ({tok.n_words} ids), {len(strings)} strings")


if __name__ == "__main__":
    main()
