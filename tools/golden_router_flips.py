#!/usr/bin/env python3
"""MoE routing near-ties in a golden's greedy continuations: the reference under the other choice.

Usage (adds the fields to an existing golden, leaving every other field as it is):
    python3 tools/golden_router_flips.py MODEL_DIR GOLDEN_JSON [--out OUT_JSON] [--threads N]
make_goldens.py calls add_router_flips() itself for models with softmax top-k routers.

Why: a softmax top-k router picks its k-th expert over the (k+1)-th by the difference of their router logits. An
engine that rounds activations to bf16 upstream (the GPU with bf16 weights) moves router logits by ~1e-3 (median) up
to a few 1e-2, so where the reference's k-th and (k+1)-th logits are closer than that it may take the other expert;
the token's MoE output then jumps, and so can the greedy logprobs of the steps after it (through the recurrent states
and the KV cache), while the ids stay the same. A wider logprob tolerance would hide real errors; instead the golden
records, for each such near-tie, what transformers itself computes with that one choice flipped, and a test may accept
a step that matches the golden or one of those (tests/model/golden_router_flips.h).

Method, per prompt, with the golden's greedy ids teacher-forced: ONE forward (float32, no cache) over prompt + greedy
ids but the last gives every step's logprobs (row num_prompt_tokens - 1 + s predicts greedy id s), and, through a
forward hook on every router, each (layer, position)'s router logits (recomputed from the router's input with its
weight: F.linear, the router's own arithmetic). For each (layer, position) whose k-th and (k+1)-th logits are less
than MAX_LOGIT_GAP apart, the same forward with that choice flipped (the hook returns the router's output with the
k-th expert replaced by the (k+1)-th, their weights the softmax probabilities renormalized as the router does) gives
the alternative. Flips that move some step's logprob by more than MIN_EFFECT, or bring some step's top-2 gap below
TOKEN_NEAR_TIE where the golden's is not, are written to the prompt as

  router_flips: [{"layer": L, "position": p, "logit_gap": g,
                  "greedy_logprobs": [steps], "top2_gap": [steps]}, ...]   (ordered by position, then layer)

  layer            decoder layer index (the router module's name, "...layers.L....")
  position         0-based sequence position over prompt + greedy ids; steps s >= position - num_prompt_tokens + 1
                   depend on it
  logit_gap        router logit of the k-th expert minus the (k+1)-th's in the golden's routing (natural log units)
  greedy_logprobs  logprob of greedy id s under the flip (float64 log_softmax of the float32 logits; rounded to 1e-6,
                   the tests' tolerances being 1e-3 and up)
  top2_gap         greedy id s's logprob minus the best other id's under the flip (negative: another id is argmax)

and the document gets "router_flip_rule" (the thresholds and counts). Routers are found as modules whose class name
ends in "router" with a 2-D weight [experts, hidden] and an int top_k that return (logits, scores, indices); the first
pass checks that the returned indices are the top-k of softmax(F.linear(x, weight)) and the scores those
probabilities (renormalized or not), and raises Unsupported otherwise (e.g. sigmoid or grouped routing, which this
does not model: make_goldens.py then writes no router_flips, this script exits with the reason). A model without such
routers gets no fields.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

MAX_LOGIT_GAP = 0.05   # flip candidates: k-th minus (k+1)-th router logit below this
MIN_EFFECT = 0.01      # record a flip that moves some greedy logprob by more than this ...
TOKEN_NEAR_TIE = 0.05  # ... or brings some step's top-2 gap below this (the tests' token near-tie)


class Unsupported(Exception):
    pass


def find_routers(model) -> list[tuple[int, str, torch.nn.Module]]:
    """[(layer, name, module)] of the model's router modules (see the module docstring), in layer order."""
    out = []
    for name, mod in model.named_modules():
        w, k = getattr(mod, "weight", None), getattr(mod, "top_k", None)
        if not type(mod).__name__.lower().endswith("router"):
            continue
        if not isinstance(w, torch.Tensor) or w.dim() != 2 or not isinstance(k, int):
            continue
        m = re.search(r"layers\.(\d+)\.", name)
        if m is None:
            raise Unsupported(f"router {name}: no 'layers.N.' in its name")
        out.append((int(m.group(1)), name, mod))
    layers = [l for l, _, _ in out]
    if len(set(layers)) != len(layers):
        raise Unsupported(f"more than one router in a layer: {[n for _, n, _ in out]}")
    return sorted(out, key=lambda t: t[0])


class RouterProbe:
    """Forward hooks on the routers: record each layer's router logits [T, E] (flip None), or flip one choice."""

    def __init__(self, routers):
        self.flip: tuple[int, int] | None = None  # (layer, position)
        self.flipped = False
        self.logits: dict[int, torch.Tensor] = {}
        self.renormalized: dict[int, bool] = {}
        self.handles = [mod.register_forward_hook(self._hook(layer, name), with_kwargs=True) for layer, name, mod in routers]

    def close(self):
        for h in self.handles:
            h.remove()

    def _hook(self, layer: int, name: str):
        def hook(mod, args, kwargs, out):
            x = args[0] if args else kwargs.get("hidden_states")
            if x is None:
                raise Unsupported(f"{name}: no input tensor")
            if not (isinstance(out, tuple) and len(out) == 3 and out[2].dtype in (torch.int64, torch.int32)):
                raise Unsupported(f"{name}: output is not (logits, scores, indices)")
            _, scores, idx = out
            logits = F.linear(x.reshape(-1, mod.weight.shape[1]), mod.weight).float()  # [T, E]
            probs = torch.softmax(logits, dim=-1)
            k = idx.shape[-1]
            if self.flip is None:
                # The router's own choice must be the softmax top-k of these logits (as sets: exact ties may order
                # differently), its scores those probabilities, renormalized or not.
                ref = torch.topk(probs, k, dim=-1).indices
                if not torch.equal(torch.sort(idx.long(), dim=-1).values, torch.sort(ref, dim=-1).values):
                    raise Unsupported(f"{name}: its choice is not the softmax top-{k} of its logits")
                picked = probs.gather(-1, idx.long())
                if torch.allclose(scores.float(), picked / picked.sum(-1, keepdim=True), rtol=1e-5, atol=1e-6):
                    self.renormalized[layer] = True
                elif torch.allclose(scores.float(), picked, rtol=1e-5, atol=1e-6):
                    self.renormalized[layer] = False
                else:
                    raise Unsupported(f"{name}: its scores are not the chosen softmax probabilities")
                self.logits[layer] = logits.detach().clone()
                return None
            if self.flip[0] != layer:
                return None
            p = self.flip[1]
            order = torch.sort(probs[p], descending=True, stable=True).indices
            ids = torch.cat([order[: k - 1], order[k : k + 1]])
            w = probs[p, ids]
            if self.renormalized[layer]:
                w = w / w.sum()
            idx, scores = idx.clone(), scores.clone()
            idx[p] = ids.to(idx.dtype)
            scores[p] = w.to(scores.dtype)
            self.flipped = True
            return (out[0], scores, idx)

        return hook


@torch.no_grad()
def forced_steps(model, seq: list[int], greedy: list[int], num_prompt: int) -> tuple[list[float], list[float]]:
    """(logprob of greedy id s, its top-2 gap) for every step s, from one forward over `seq` (prompt + greedy[:-1])."""
    logits = model(input_ids=torch.tensor([seq], dtype=torch.long), use_cache=False).logits[0]
    assert logits.dtype == torch.float32, logits.dtype
    lsm = torch.log_softmax(logits.to(torch.float64), dim=-1)
    lps, gaps = [], []
    for s, tok in enumerate(greedy):
        row = lsm[num_prompt - 1 + s]
        lp = float(row[tok].item())
        other = row.clone()
        other[tok] = -float("inf")
        lps.append(lp)
        gaps.append(lp - float(other.max().item()))
    return lps, gaps


def prompt_router_flips(model, routers, p: dict) -> tuple[list[dict], dict]:
    """The router_flips of one golden prompt (see the module docstring) and counts for the log."""
    prompt, greedy = list(p["prompt_token_ids"]), list(p["greedy_token_ids"])
    P, seq = len(prompt), list(p["prompt_token_ids"]) + list(p["greedy_token_ids"])[:-1]
    probe = RouterProbe(routers)
    try:
        base_lp, base_gap = forced_steps(model, seq, greedy, P)
        drift = max(abs(a - b) for a, b in zip(base_lp, p["greedy_logprobs"]))
        if drift > 1e-3:
            raise SystemExit(f"{p['name']}: the teacher-forced forward is {drift:.3g} off the golden's greedy logprobs "
                             "(another model or transformers version than the golden's?)")
        candidates = []
        for layer, logits in probe.logits.items():
            if logits.shape[0] != len(seq):
                raise SystemExit(f"layer {layer}: router saw {logits.shape[0]} rows for {len(seq)} tokens")
            k = next(mod.top_k for l, _, mod in routers if l == layer)
            if k >= logits.shape[1]:
                continue  # every expert chosen: nothing to flip
            top = torch.sort(logits, dim=-1, descending=True).values
            gap = top[:, k - 1] - top[:, k]
            for pos in torch.nonzero(gap < MAX_LOGIT_GAP).flatten().tolist():
                candidates.append((pos, layer, float(gap[pos].item())))
        candidates.sort()
        flips = []
        for pos, layer, g in candidates:
            probe.flip, probe.flipped = (layer, pos), False
            lp, tg = forced_steps(model, seq, greedy, P)
            if not probe.flipped:
                raise SystemExit(f"layer {layer}: the flip at position {pos} was not applied")
            effect = max(abs(a - b) for a, b in zip(lp, base_lp))
            new_tie = any(a < TOKEN_NEAR_TIE <= b for a, b in zip(tg, p["top2_gap"]))
            if effect > MIN_EFFECT or new_tie:
                flips.append({"layer": layer, "position": pos, "logit_gap": g,
                              "greedy_logprobs": [round(v, 6) for v in lp], "top2_gap": [round(v, 6) for v in tg]})
        probe.flip = None
    finally:
        probe.close()
    return flips, {"candidates": len(candidates), "recorded": len(flips), "teacher_forced_drift": drift}


def add_router_flips(model, doc: dict, log=sys.stderr) -> bool:
    """Adds router_flips to every prompt of the golden `doc` and router_flip_rule to it (in place). False, changing
    nothing, when the model has no routers. Raises Unsupported, changing nothing, when its routers are not softmax
    top-k (see the docstring)."""
    routers = find_routers(model)
    if not routers:
        return False
    results = []
    for p in doc["prompts"]:
        t0 = time.time()
        flips, info = prompt_router_flips(model, routers, p)
        results.append(flips)
        print(f"[router_flips] {p['name']}: {info['candidates']} near-ties below {MAX_LOGIT_GAP}, {info['recorded']} "
              f"recorded (teacher-forced drift {info['teacher_forced_drift']:.2g}), {time.time() - t0:.1f}s", file=log)
    for p, flips in zip(doc["prompts"], results):
        p["router_flips"] = flips
    doc["router_flip_rule"] = {
        "generated_by": "tools/golden_router_flips.py",
        "max_logit_gap": MAX_LOGIT_GAP,
        "min_effect": MIN_EFFECT,
        "token_near_tie": TOKEN_NEAR_TIE,
        "routers": len(routers),
        "method": "greedy ids teacher-forced, one float32 forward per flip (no cache); one router choice flipped "
                  "(k-th expert -> (k+1)-th) at (layer, position); recorded when some step's logprob moves by more "
                  "than min_effect or its top-2 gap falls below token_near_tie",
    }
    return True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir", type=Path)
    ap.add_argument("golden", type=Path)
    ap.add_argument("--out", type=Path, default=None, help="write here instead of over GOLDEN")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch default)")
    args = ap.parse_args()

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import make_goldens  # noqa: E402  (CPU only, no TF32: set on import)

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    with open(args.golden, encoding="utf-8") as f:
        doc = json.load(f)
    weights = args.model_dir / "model.safetensors"
    want = doc.get("model_safetensors_sha256")
    if want and weights.exists() and make_goldens.sha256_file(weights) != want:
        raise SystemExit(f"{weights} is not the checkpoint {args.golden} was made from (sha256 differs)")
    model = make_goldens.load_reference_model(args.model_dir)[1]
    try:
        if not add_router_flips(model, doc):
            print(f"[router_flips] {args.model_dir}: no routers; {args.golden} unchanged", file=sys.stderr)
            return 0
    except Unsupported as e:
        raise SystemExit(f"router flips: {e}")
    out = args.out or args.golden
    with open(out, "w", encoding="utf-8") as f:
        f.write(make_goldens.dump_json(doc))
    print(f"[router_flips] wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
