"""Host time per call of flash_attention and matmul up to the driver's launch call.

On a machine with a GPU it times real calls on CUDA tensors (the driver's launch and
encodes included). Without one (`--fake`, the default when no GPU answers) it runs the
GPU host path on CPU torch tensors under `fake_gpu()`: weft sees the tensors as living on
device 0, and the driver calls a launch makes (cuLaunchKernelEx, cuTensorMapEncodeTiled,
cuMemsetD32Async, module loading, occupancy, device attributes) are stubs that record
what they were given. Kernels are compiled for sm_90a as on a GPU (ptxas needed). Each
line also counts the Python frames of a call (cProfile): a figure that, unlike the time,
does not move when other work loads the machine.

    python3 -m benchmarks.host_path [--calls 2000]     # from the repo root
"""

from __future__ import annotations

import argparse
import contextlib
import time

from tests.kernels.fake_gpu import fake_gpu


def time_calls(call, calls: int, runs: int = 20) -> float:
    """Microseconds per call: the best of `runs` runs of calls // runs calls each, after
    a warm-up (the best run is the one least disturbed by other work on the machine)."""
    for _ in range(20):
        call()
    batch = max(1, calls // runs)
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        for _ in range(batch):
            call()
        best = min(best, (time.perf_counter() - start) / batch)
    return best * 1e6


def python_frames_per_call(call, calls: int = 50) -> float:
    """Python function calls (cProfile) per call, the fake driver's own included: a count
    that, unlike the time, other work on the machine does not change."""
    import cProfile
    import pstats

    profile = cProfile.Profile()
    profile.enable()
    for _ in range(calls):
        call()
    profile.disable()
    stats = pstats.Stats(profile).stats
    return sum(entry[1] for (filename, _, _), entry in stats.items() if filename != "~") / calls


def _keep_freed_buffers_in_the_heap() -> None:
    """On CPU tensors, glibc serves each large buffer (a 4096x4096 C: 32 MiB) by mmap and
    returns it by munmap, which costs more than the rest of the call and slows what
    follows; torch's CUDA caching allocator hands the freed block back instead. Raising
    malloc's mmap threshold keeps the fake's outputs in the heap, as that allocator would."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if name is None:
        return
    libc = ctypes.CDLL(name)
    m_trim_threshold, m_mmap_threshold = -1, -3
    if hasattr(libc, "mallopt"):
        libc.mallopt(m_mmap_threshold, 1 << 30)
        libc.mallopt(m_trim_threshold, (1 << 31) - 1)


def _allocation_us(calls: int) -> float:
    """Time torch.empty takes for the outputs of the prepared call used last (nan when
    the wrapper has none: an older weft). On CPU tensors it is malloc's time for large
    buffers, which is not what torch's CUDA caching allocator costs: the rest is weft's."""
    from weft.kernels import _launch

    entries = getattr(getattr(_launch, "_CALLS", None), "entries", None)
    if not entries:
        return float("nan")
    import torch

    prepared = next(reversed(entries.values()))

    def allocate():
        for shape, strides, dtype, device in prepared.outputs:
            if strides is None:
                torch.empty(shape, dtype=dtype, device=device)
            else:
                torch.empty_strided(shape, strides, dtype=dtype, device=device)
    return time_calls(allocate, calls)


def _cases(device: str):
    import torch

    from weft.kernels.attention import flash_attention
    from weft.kernels.matmul import matmul
    from weft.kernels.matmul.config import Config as MatmulConfig

    dtype = torch.bfloat16
    cases = []
    for b, h, hk, s, d, causal in ((2, 8, 8, 1024, 128, False), (2, 8, 2, 1024, 128, True), (1, 4, 4, 512, 64, False)):
        q = torch.empty(b, h, s, d, dtype=dtype, device=device)
        k, v = (torch.empty(b, hk, s, d, dtype=dtype, device=device) for _ in range(2))
        cases.append((f"flash_attention {b}x{h}/{hk}x{s}x{d}{' causal' if causal else ''}",
                       lambda q=q, k=k, v=v, causal=causal: flash_attention(q, k, v, causal=causal)))
    for m, n, kk in ((4096, 4096, 4096), (64, 11008, 4096)):
        a = torch.empty(m, kk, dtype=dtype, device=device)
        bt = torch.empty(kk, n, dtype=dtype, device=device)
        # A fixed config: the autotuner times candidates with CUDA events, which need a GPU.
        config = None if device == "cuda" else MatmulConfig(block_k=64, stages=3)
        cases.append((f"matmul {m}x{n}x{kk}", lambda a=a, bt=bt, config=config: matmul(a, bt, config=config)))
    # The last shapes again with a q and an a that require grad: the calls go through the
    # torch operators (kernels/torch_ops.py), as in training.
    q, a = q.detach().requires_grad_(), a.detach().requires_grad_()
    cases.append(("flash_attention 1x4/4x512x64, q requires grad (weft::flash_attention)", lambda q=q, k=k, v=v: flash_attention(q, k, v)))
    cases.append((f"matmul {m}x{n}x{kk}, a requires grad (weft::matmul)",
                  lambda a=a, bt=bt, config=config: matmul(a, bt, config=config)))
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--fake", action="store_true", help="stub the driver even where a GPU answers")
    args = parser.parse_args()
    from weft.runtime import driver

    real = driver.has_gpu() and not args.fake
    if not real:
        _keep_freed_buffers_in_the_heap()
    context = contextlib.nullcontext(None) if real else fake_gpu(record=False)
    with context as fake:
        for name, call in _cases("cuda" if real else "cpu"):
            us = time_calls(call, args.calls)
            allocation = _allocation_us(args.calls)
            frames = python_frames_per_call(call)
            extra = "" if fake is None else f" ({fake.launch_count} launches, {fake.encodes} encodes so far)"
            print(f"{name:>42}: {us:8.1f} us per call, {allocation:6.1f} us of it allocating outputs, "
                  f"{us - allocation:6.1f} us the rest, {frames:4.0f} Python frames{extra}")
    print("driver:", "real GPU" if real else "stubbed (CPU torch tensors as device 0)")


if __name__ == "__main__":
    main()
