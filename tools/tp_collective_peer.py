#!/usr/bin/env python3
"""Peer for ssmserve's tensor-parallel collectives (issue 9): microseconds per torch.distributed NCCL all-reduce and
all-gather of decode-sized fp32 messages between 2 GPUs (one process per GPU), 200 calls captured in a CUDA graph
per size, the same sizes as tests/cuda/test_cuda_tp_collectives.cpp's DISABLED_CollectiveTimes.

Usage: python3 tools/tp_collective_peer.py   (needs 2 GPUs and PyTorch with NCCL; run by scripts/gpu-tp-check.sh)
"""
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SIZES = [192, 2560, 4 * 2560, 16 * 2560, 64 * 2560, 256 * 4096, 50280, 16 * 25140]
CALLS = 200


def timed(fn):
    """Microseconds per call of fn (CALLS calls captured in one graph, replayed once after a warm-up)."""
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        for _ in range(CALLS):
            fn()
    g.replay()
    torch.cuda.synchronize()
    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0.record()
    g.replay()
    t1.record()
    torch.cuda.synchronize()
    return 1e3 * t0.elapsed_time(t1) / CALLS


def worker(rank: int) -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=2, device_id=torch.device("cuda", rank))
    for gather in (False, True):
        for n in SIZES:
            x = torch.zeros(n, device="cuda")
            out = torch.empty(2 * n, device="cuda")
            us = timed((lambda: dist.all_gather_into_tensor(out, x)) if gather else (lambda: dist.all_reduce(x)))
            if rank == 0:
                print(f"torch-nccl {'all-gather' if gather else 'all-reduce'} {n:9d} floats: {us:8.2f} us", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, nprocs=2)
