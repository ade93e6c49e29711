#!/usr/bin/env python3
"""Reference outputs ("goldens") from Hugging Face transformers for ssmserve's numerical tests.

Usage:
    python3 tools/make_goldens.py MODEL_DIR OUT_JSON [--steps 32] [--name NAME] [--lambada PATH]

Loads MODEL_DIR with transformers' AutoModelForCausalLM in float32 on the CPU (no TF32, no cache, no
generate()), tokenizes a fixed set of prompts with the checkpoint's own tokenizer (no BOS added), and writes,
for every prompt:

  prompt_logprobs[i]  natural-log p(token_i | tokens_<i) from ONE full forward over the prompt (null for i=0)
  prompt_top5[i]      top-5 [id, logprob] of the distribution that predicts token i (null for i=0)
  greedy_token_ids    `steps` argmax tokens; each step is a FULL forward over the whole growing sequence
                      (model(input_ids=ids, use_cache=False).logits[0, -1]); EOS does not stop the loop
  greedy_logprobs     logprob of each chosen token
  greedy_top5         top-5 [id, logprob] at each step, sorted by logprob descending (ties: lower id first)
  top2_gap            logprob(top1) - logprob(top2) at each step (small gaps = argmax could flip under
                      legitimate float differences; tests should tolerate a flip there)
  router_flips        MoE models with softmax top-k routers only: the greedy logprobs / top-2 gaps with one router
                      choice flipped at each routing near-tie that matters (tools/golden_router_flips.py)

Logprobs are log_softmax in float64 of the float32 logits, over all `vocab_size` rows of the LM head
(including the padding rows past the tokenizer's vocabulary).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import sys
import time
from pathlib import Path

# CPU only (float32 reference math); set before torch is imported.
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import torch  # noqa: E402

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_LAMBADA = REPO_ROOT.parent / "shared" / "data" / "lambada_test.jsonl"

# Fixed prompts. Text is stored verbatim in the output JSON together with its token ids.
AUSTEN_1 = ("It is a truth universally acknowledged, that a single man in possession of a good fortune, "
            "must be in want of a wife.")
AUSTEN_2 = ("Emma Woodhouse, handsome, clever, and rich, with a comfortable home and happy disposition, "
            "seemed to unite some of the best blessings of existence;")
KJV_1 = "In the beginning God created the heaven and the earth."
KJV_2 = "And the LORD said unto Moses,"
SINGLE = "The"
UNICODE = "\u201cOh! Mr. Darcy\u2014is it r\u00e9ally you?\u201d cried \u00c9lise, na\u00efvely\u2026 (caf\u00e9 \u2116 7: 3\u00bd% \u2192 \u20ac5) \U0001F60A\t#tag"
# Ecclesiastes 3:1-8 (KJV); cut to a word prefix of exactly 64 tokens.
KJV_64_SOURCE = (
    "To every thing there is a season, and a time to every purpose under the heaven: A time to be born, and a "
    "time to die; a time to plant, and a time to pluck up that which is planted; A time to kill, and a time to "
    "heal; a time to break down, and a time to build up; A time to weep, and a time to laugh; a time to mourn, "
    "and a time to dance; A time to cast away stones, and a time to gather stones together; a time to embrace, "
    "and a time to refrain from embracing; A time to get, and a time to lose; a time to keep, and a time to "
    "cast away;")
LONG_TARGET_TOKENS = 300
EXACT_TOKENS = 64


def encode(tok, text: str) -> list[int]:
    return list(tok(text, add_special_tokens=False)["input_ids"])


def word_prefix_with_tokens(tok, text: str, n: int, exact: bool) -> str:
    """Longest whitespace-word prefix of `text` with <= n tokens (== n when exact, else error)."""
    words = text.split(" ")
    best = None
    for k in range(1, len(words) + 1):
        cand = " ".join(words[:k])
        cnt = len(encode(tok, cand))
        if cnt <= n:
            best = (cand, cnt)
        if cnt >= n:
            break
    if best is None or (exact and best[1] != n):
        raise SystemExit(f"no word prefix with {'exactly' if exact else 'at most'} {n} tokens "
                         f"(best {best[1] if best else None}) in: {text[:80]!r}...")
    return best[0]


def long_lambada_prompt(tok, path: Path) -> tuple[str, str]:
    """The first LAMBADA (test) passages joined by blank lines, cut at a word to <= LONG_TARGET_TOKENS tokens.

    (No single LAMBADA passage reaches 300 tokens, so several are concatenated in file order.)"""
    parts: list[str] = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            parts.append(json.loads(line)["text"])
            text = "\n\n".join(parts)
            if len(encode(tok, text)) >= LONG_TARGET_TOKENS + 20:
                return (word_prefix_with_tokens(tok, text, LONG_TARGET_TOKENS, exact=False),
                        f"{path.name} lines 1-{lineno} joined with blank lines, cut at a word boundary "
                        f"to <= {LONG_TARGET_TOKENS} tokens")
    raise SystemExit(f"{path}: fewer than {LONG_TARGET_TOKENS} tokens in all")


def build_prompts(tok, lambada: Path) -> list[dict]:
    long_text, long_src = long_lambada_prompt(tok, lambada)
    exact_text = word_prefix_with_tokens(tok, KJV_64_SOURCE, EXACT_TOKENS, exact=True)
    prompts = [
        {"name": "austen_pride", "prompt": AUSTEN_1},
        {"name": "austen_emma", "prompt": AUSTEN_2},
        {"name": "kjv_genesis", "prompt": KJV_1},
        {"name": "kjv_moses", "prompt": KJV_2},
        {"name": "single_token", "prompt": SINGLE},
        {"name": "unicode_punct", "prompt": UNICODE},
        {"name": "lambada_long", "prompt": long_text, "source": long_src},
        {"name": "kjv_exact64", "prompt": exact_text, "source": "Ecclesiastes 3:1-8 (KJV), word prefix of exactly 64 tokens"},
    ]
    for p in prompts:
        p["prompt_token_ids"] = encode(tok, p["prompt"])
        if not p["prompt_token_ids"]:
            raise SystemExit(f"prompt {p['name']} tokenizes to nothing")
    n_single = len(prompts[4]["prompt_token_ids"])
    if n_single != 1:
        raise SystemExit(f"single-token prompt {SINGLE!r} has {n_single} tokens")
    if len(prompts[7]["prompt_token_ids"]) != EXACT_TOKENS:
        raise SystemExit("exact-64 prompt is not 64 tokens")
    return prompts


def topk_pairs(lp: torch.Tensor, k: int = 5) -> list[list]:
    """Top-k [id, logprob] of a float64 logprob vector, logprob descending, lower id first on exact ties."""
    # Sort stably by (-lp, id): take a few extra candidates from topk, then order them deterministically.
    vals, idx = torch.topk(lp, min(k + 8, lp.numel()))
    kth = vals[k - 1].item()
    # Include every entry tied with the k-th value so the tie-break by id is exact.
    cand = torch.nonzero(lp >= kth).flatten().tolist()
    cand.sort(key=lambda i: (-lp[i].item(), i))
    return [[int(i), float(lp[i].item())] for i in cand[:k]]


@torch.no_grad()
def last_logprobs(model, ids: list[int]) -> torch.Tensor:
    x = torch.tensor([ids], dtype=torch.long)
    logits = model(input_ids=x, use_cache=False).logits[0, -1]
    assert logits.dtype == torch.float32, logits.dtype
    return torch.log_softmax(logits.to(torch.float64), dim=-1)


@torch.no_grad()
def run_prompt(model, p: dict, steps: int) -> dict:
    ids = list(p["prompt_token_ids"])
    x = torch.tensor([ids], dtype=torch.long)
    logits = model(input_ids=x, use_cache=False).logits[0]
    assert logits.dtype == torch.float32, logits.dtype
    lsm = torch.log_softmax(logits.to(torch.float64), dim=-1)  # [T, V]
    prompt_lp: list = [None]
    prompt_top5: list = [None]
    for i in range(1, len(ids)):
        prompt_lp.append(float(lsm[i - 1, ids[i]].item()))
        prompt_top5.append(topk_pairs(lsm[i - 1]))

    g_ids, g_lp, g_top5, gaps = [], [], [], []
    seq = list(ids)
    for _ in range(steps):
        lp = last_logprobs(model, seq)  # full forward over the whole sequence, no cache
        top5 = topk_pairs(lp)
        tok = top5[0][0]
        g_ids.append(tok)
        g_lp.append(top5[0][1])
        g_top5.append(top5)
        gaps.append(top5[0][1] - top5[1][1])
        seq.append(tok)

    out = {k: v for k, v in p.items()}
    out.update({
        "num_prompt_tokens": len(ids),
        "prompt_logprobs": prompt_lp,
        "prompt_top5": prompt_top5,
        "greedy_token_ids": g_ids,
        "greedy_logprobs": g_lp,
        "greedy_top5": g_top5,
        "top2_gap": gaps,
    })
    return out


def dump_json(doc: dict) -> str:
    """Readable, diff-friendly JSON: one top-level field per line, one prompt field per line (values compact)."""
    def c(v):
        return json.dumps(v, ensure_ascii=False, separators=(",", ":"))
    lines = ["{"]
    items = list(doc.items())
    for n, (k, v) in enumerate(items):
        end = "," if n + 1 < len(items) else ""
        if k == "prompts":
            lines.append(f' {c(k)}: [')
            for m, p in enumerate(v):
                lines.append("  {")
                pitems = list(p.items())
                for j, (pk, pv) in enumerate(pitems):
                    lines.append(f"   {c(pk)}: {c(pv)}" + ("," if j + 1 < len(pitems) else ""))
                lines.append("  }" + ("," if m + 1 < len(v) else ""))
            lines.append(" ]" + end)
        else:
            lines.append(f" {c(k)}: {c(v)}{end}")
    lines.append("}")
    text = "\n".join(lines) + "\n"
    assert json.loads(text) == json.loads(json.dumps(doc))
    return text


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def load_reference_model(model_dir: Path):
    """(tokenizer, model, loading_info): MODEL_DIR through transformers' Auto classes, float32 on the CPU, eval mode.
    Raises SystemExit when a parameter is not float32."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    kwargs = {}
    quant = json.loads((model_dir / "config.json").read_text()).get("quantization_config") or {}
    if quant.get("quant_method") == "compressed-tensors":  # FP8 weights dequantized to float32 at load, as ssmserve does
        from transformers import CompressedTensorsConfig
        kwargs["quantization_config"] = CompressedTensorsConfig(dequantize=True)
    model, info = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32, output_loading_info=True,
                                                       **kwargs)
    model = model.to("cpu").eval()
    for p in model.parameters():
        if p.dtype != torch.float32:
            raise SystemExit(f"parameter not float32: {p.dtype}")
    loading_info = {k: sorted(list(v)) if isinstance(v, (set, list)) else str(v) for k, v in info.items()}
    return tok, model, loading_info


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir", type=Path)
    ap.add_argument("out_json", type=Path)
    ap.add_argument("--steps", type=int, default=32, help="greedy steps per prompt (default 32)")
    ap.add_argument("--name", default=None, help="model name in the JSON (default: MODEL_DIR's basename)")
    ap.add_argument("--lambada", type=Path, default=DEFAULT_LAMBADA, help="LAMBADA test jsonl for the long prompt")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch default)")
    ap.add_argument("--no-router-flips", action="store_true",
                    help="skip router_flips (tools/golden_router_flips.py) for MoE models with softmax top-k routers")
    args = ap.parse_args()

    import tokenizers
    import transformers

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    t0 = time.time()
    tok, model, loading_info = load_reference_model(args.model_dir)
    print(f"[make_goldens] loaded {args.model_dir} ({type(model).__name__}) in {time.time() - t0:.1f}s; "
          f"loading info: {loading_info}", file=sys.stderr)

    prompts = build_prompts(tok, args.lambada)
    results = []
    for p in prompts:
        t1 = time.time()
        r = run_prompt(model, p, args.steps)
        r["greedy_text"] = tok.decode(r["greedy_token_ids"])
        results.append(r)
        print(f"[make_goldens] {p['name']}: {r['num_prompt_tokens']} prompt tokens, min top2_gap "
              f"{min(r['top2_gap']):.3g}, {time.time() - t1:.1f}s: {r['greedy_text']!r}", file=sys.stderr)

    cfg = model.config
    weights = args.model_dir / "model.safetensors"
    doc = {
        "model": args.name or args.model_dir.resolve().name,
        "architecture": type(model).__name__,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "tokenizers_version": tokenizers.__version__,
        "python_version": platform.python_version(),
        "dtype": "float32",
        "device": "cpu",
        "logprob_dtype": "float64 log_softmax of float32 logits",
        "logprob_vocab_size": int(cfg.vocab_size),
        "add_bos": False,
        "steps": args.steps,
        "greedy_method": "full forward over the whole sequence at every step, use_cache=False; argmax, lower id on ties; EOS does not stop",
        "model_safetensors_sha256": sha256_file(weights) if weights.exists() else None,
        "loading_info": loading_info,
        "generated_by": "tools/make_goldens.py",
        "prompts": results,
    }
    if not args.no_router_flips:  # MoE models with softmax top-k routers: the other choice at each near-tie
        from golden_router_flips import Unsupported, add_router_flips

        try:
            add_router_flips(model, doc)
        except Unsupported as e:
            print(f"[make_goldens] no router_flips: {e}", file=sys.stderr)
    args.out_json.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out_json, "w", encoding="utf-8") as f:
        f.write(dump_json(doc))
    print(f"[make_goldens] wrote {args.out_json} in {time.time() - t0:.1f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
