# device="cuda" through the Python API: the module built with the CUDA backend (pip install . -C
# cmake.define.SSMSERVE_PYTHON_CUDA=ON, ssmserve.has_cuda) on a GPU generates the CPU's greedy tokens for the bundled
# model, batched and streamed, and its logprobs agree to bf16-GEMM tolerance. Skipped without the backend or a GPU
# (CI); scripts/gpu-python-check.sh runs it on the GPU machine (plain `python3 FILE` works without pytest too).
import math
import sys
from pathlib import Path

import ssmserve

MODEL = Path(__file__).resolve().parents[2] / "models" / "tiny-mamba"
PROMPTS = ["And the LORD said unto Moses,", "It is a truth universally acknowledged", "Call me Ishmael.", "a"]


def cuda_llm():
    """(LLM on the GPU, None) or (None, why it cannot run here)."""
    if not ssmserve.has_cuda:
        return None, "module built without the CUDA backend (SSMSERVE_PYTHON_CUDA=OFF)"
    try:
        return ssmserve.LLM(str(MODEL), device="cuda", max_num_seqs=8), None
    except ssmserve.SsmserveError as e:
        if "no usable CUDA device" in str(e):
            return None, str(e)
        raise


def check_cuda_matches_cpu(gpu):
    cpu = ssmserve.LLM(str(MODEL), device="cpu", max_num_seqs=8, threads=2)
    greedy = ssmserve.SamplingParams(temperature=0, max_tokens=32, logprobs=1)
    want = cpu.generate(PROMPTS, greedy)
    got = gpu.generate(PROMPTS, greedy)
    for w, g in zip(want, got):
        wc, gc = w.outputs[0], g.outputs[0]
        assert g.prompt_token_ids == w.prompt_token_ids
        assert gc.token_ids == wc.token_ids, (w.prompt, wc.text, gc.text)
        assert gc.text == wc.text and gc.finish_reason == wc.finish_reason
        for t, lw, lg in zip(wc.token_ids, wc.logprobs, gc.logprobs):
            assert math.isclose(lw[t].logprob, lg[t].logprob, abs_tol=5e-2), (t, lw[t].logprob, lg[t].logprob)
    # Alone == batched on the GPU (batch-independent results), and the streaming iterator ends with the same text.
    alone = gpu.generate(PROMPTS[1], ssmserve.SamplingParams(temperature=0, max_tokens=32))[0].outputs[0]
    assert alone.token_ids == got[1].outputs[0].token_ids
    last = None
    for last in gpu.stream(PROMPTS[2], ssmserve.SamplingParams(temperature=0, max_tokens=32)):
        pass
    assert last is not None and last.finished and last.outputs[0].text == got[2].outputs[0].text
    # Seeded sampling: the same seed gives the same tokens on the GPU twice.
    seeded = ssmserve.SamplingParams(temperature=0.8, top_p=0.9, seed=7, max_tokens=16)
    assert gpu.generate(PROMPTS[0], seeded)[0].outputs[0].token_ids == gpu.generate(PROMPTS[0], seeded)[0].outputs[0].token_ids


def test_cuda_matches_cpu():
    import pytest

    gpu, why = cuda_llm()
    if gpu is None:
        pytest.skip(why)
    check_cuda_matches_cpu(gpu)


if __name__ == "__main__":
    gpu, why = cuda_llm()
    if gpu is None:
        print(f"SKIPPED: {why}")
        sys.exit(0)
    check_cuda_matches_cpu(gpu)
    print("PASSED: device='cuda' matches device='cpu'")
