"""Where the host time of one cached launch goes: weft's paths beside raw driver calls.

    python -m benchmarks.launch_overhead

Each number is the median over 5 rounds of 2000 back-to-back launches of a one-block
kernel (host microseconds per launch; the GPU work is far shorter than the host work).
"""

from __future__ import annotations

import ctypes
import time


def per_launch_us(launch, rounds=5, count=2000) -> float:
    import torch

    for _ in range(200):
        launch()
    torch.cuda.synchronize()
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(count):
            launch()
        samples.append((time.perf_counter() - start) / count * 1e6)
        torch.cuda.synchronize()
    return sorted(samples)[rounds // 2]


def run() -> dict:
    import torch
    import triton
    import triton.language as tl
    from cuda.bindings import driver as cu

    from weft.kernels.vector_add import add_kernel_for_overhead

    @triton.jit
    def triton_copy(x_ptr, y_ptr, n):
        i = tl.arange(0, 128)
        tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n), mask=i < n)

    x = torch.randn(128, device="cuda")
    y = torch.empty_like(x)
    jit_launch = add_kernel_for_overhead()
    jit_launch(x, y, 128)
    torch.cuda.synchronize()
    assert torch.equal(x, y), "the overhead kernel copied wrongly"
    jit = jit_launch.__closure__[0].cell_contents if jit_launch.__closure__ else None
    entry = next(iter(jit._dispatch.values()))
    launcher = entry.launcher
    function = launcher.function(torch.cuda.current_device())
    state = launcher._state()
    config, params = state.config, state.params_address
    stream = torch.cuda.current_stream().cuda_stream
    config.hStream = cu.CUstream(stream)

    libcuda = ctypes.CDLL("libcuda.so.1")
    raw = libcuda.cuLaunchKernel
    raw.restype = ctypes.c_int
    raw.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
    function_ptr = int(function)
    stream_obj = cu.CUstream(stream)

    paths = {
        "weft jit kernel[grid](x, y, n)": lambda: jit_launch(x, y, 128),
        "weft Launcher((1,), args)": lambda: launcher((1,), (x, y, 128)),
        "cuda-python cuLaunchKernelEx": lambda: cu.cuLaunchKernelEx(config, function, params, 0),
        "cuda-python cuLaunchKernel": lambda: cu.cuLaunchKernel(function, 1, 1, 1, 128, 1, 1, 0, stream_obj, params, 0),
        "ctypes cuLaunchKernel": lambda: raw(function_ptr, 1, 1, 1, 128, 1, 1, 0, stream, params, None),
        "triton kernel[grid](x, y, n)": lambda: triton_copy[(1,)](x, y, 128),
        "torch y.copy_(x)": lambda: y.copy_(x),
    }
    results = {name: per_launch_us(fn) for name, fn in paths.items()}
    # The same JIT path with the driver call replaced by a no-op: weft's own Python cost.
    from weft.runtime import arguments

    results["weft arguments.read_all(x, y, n)"] = per_launch_us(lambda: arguments.read_all((x, y, 128)))
    real_launch = state.launch
    state.launch = lambda config, function, params, extra: (0,)
    try:
        results["weft jit, driver call stubbed"] = per_launch_us(lambda: jit_launch(x, y, 128))
    finally:
        state.launch = real_launch
    return results


if __name__ == "__main__":
    for name, us in run().items():
        print(f"{name:<36}{us:8.2f} us")
