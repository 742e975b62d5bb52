"""Host time per call of flash_attention and matmul up to the driver's launch call.

On a machine with a GPU it times real calls on CUDA tensors (the driver's launch and
encodes included). Without one (`--fake`, the default when no GPU answers) it runs the
GPU host path on CPU torch tensors under `fake_gpu()`: weft sees the tensors as living on
device 0, and the driver calls a launch makes (cuLaunchKernelEx, cuTensorMapEncodeTiled,
cuMemsetD32Async, module loading, occupancy, device attributes) are stubs that record
what they were given. Kernels are compiled for sm_90a as on a GPU (ptxas needed).

    PYTHONPATH=/work/wt/eager python3 -m weft.benchmarks.host_path [--calls 2000]
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import hashlib
import struct
import time
from unittest import mock

H100_SMS = 132


class FakeDriver:
    """What the stubbed driver was asked: every launch (grid, block, shared bytes, stream,
    the bytes of each parameter), every tensor map encoded and every memset."""

    # Per function name, the bytes and names of its parameters; shared by every fake, as
    # launchers keep their loaded functions from one fake to the next.
    param_sizes: dict = {}
    param_names: dict = {}

    def __init__(self, address_in_place: bool = True, record: bool = True):
        # False: the encoding mixes the address into every byte, so weft cannot patch it
        # in place and must encode again for each new address.
        self.address_in_place = address_in_place
        self.record = record  # False: launches are only counted (timing the host path)
        self.launch_count = 0
        self.maps: dict = {}  # 128 encoded bytes -> the fields encoded
        self.launches: list[dict] = []
        self.encodes = 0
        self.memsets: list[tuple] = []

    # cuLaunchKernelEx(config, function, void** params, extra)
    def launch(self, config, function, params, extra):
        if not self.record:
            self.launch_count += 1
            return (0,)
        slots = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))
        sizes = self.param_sizes[function]
        raw = [ctypes.string_at(slots[i], size) for i, size in enumerate(sizes)]
        self.launches.append(dict(function=function, grid=(config.gridDimX, config.gridDimY, config.gridDimZ),
                                  block=(config.blockDimX, config.blockDimY, config.blockDimZ),
                                  shared=config.sharedMemBytes, stream=int(config.hStream), params=raw,
                                  attrs=config.numAttrs))
        return (0,)

    def encode(self, data_type, rank, address, dims, strides, box, element_strides, interleave, swizzle,
               l2, oob):
        """A stand-in for cuTensorMapEncodeTiled: 128 bytes that name every input, so two
        encodes are equal exactly when their inputs are."""
        self.encodes += 1
        fields = [int(data_type), int(rank), int(address), *map(int, dims), *map(int, strides),
                  *map(int, box), *map(int, element_strides), int(interleave), int(swizzle), int(l2), int(oob)]
        tensor_map = _FakeTensorMap(fields, self.address_in_place)
        self.maps[struct.pack("<16Q", *tensor_map.opaque)] = tuple(fields)
        return (0, tensor_map)

    def memset32(self, address, value, count, stream):
        self.memsets.append((int(address), int(value), int(count), int(stream)))
        return 0


class _FakeTensorMap:
    """The global address in the first 8 bytes (as a reader can check), a digest of every
    field after it."""

    def __init__(self, fields, address_in_place):
        named = fields[:2] + fields[3:] if address_in_place else fields
        digest = hashlib.blake2b(repr(named).encode(), digest_size=64).digest()
        self.opaque = struct.unpack("<16Q", (struct.pack("<Q", fields[2]) + digest).ljust(128, b"\0"))


def _param_sizes(compiled) -> list[int]:
    from weft.runtime.arguments import is_descriptor_type

    sizes = []
    for param in compiled.params:
        t = param.type
        sizes.append(8 if t.startswith("*") else 128 if is_descriptor_type(t) else
                     8 if t in ("i64", "u64", "fp64") else 4)
    return sizes


@contextlib.contextmanager
def fake_gpu(address_in_place: bool = True, record: bool = True):
    """CPU torch tensors act as CUDA tensors on device 0 of a stubbed 132-SM H100; yields
    the FakeDriver. Compiles for sm_90a; launches, encodes and memsets are recorded."""
    import torch

    from weft.runtime import driver, launcher

    fake = FakeDriver(address_in_place, record)
    props = driver.DeviceProperties(0, "fake H100", (9, 0), H100_SMS, 227 * 1024, 228 * 1024, 1024, 32)

    def load(self, device):
        fake.param_sizes[self.name] = _param_sizes(self.compiled)
        fake.param_names[self.name] = self.param_names
        return self.name

    cuda = driver.cuda()
    with contextlib.ExitStack() as stack:
        patch = lambda *a, **k: stack.enter_context(mock.patch.object(*a, **k))  # noqa: E731
        patch(torch.Tensor, "is_cuda", property(lambda self: self.device.type == "cpu"))
        patch(torch.Tensor, "get_device", lambda self: 0 if self.device.type == "cpu" else -1)
        patch(driver, "init", lambda: None)
        patch(driver, "current_device", lambda: 0)
        patch(driver, "device_properties", lambda device=0: props)
        patch(driver, "max_active_ctas", lambda function, threads, shared: 1)
        patch(driver, "max_active_clusters", lambda function, threads, shared, cluster: H100_SMS // cluster[0])
        patch(launcher.Launcher, "_load", load)
        patch(launcher, "_torch_stream_getter", lambda: (lambda device: 0))
        # Launchers keep the launch function they first looked up: route through the
        # fake that is active now.
        patch(cuda, "cuLaunchKernelEx", _to_active("launch"))
        patch(cuda, "cuTensorMapEncodeTiled", _to_active("encode"))
        patch(cuda, "cuMemsetD32Async", _to_active("memset32"))
        _ACTIVE.append(fake)
        stack.callback(_ACTIVE.pop)
        stack.callback(_forget_driver_answers)
        _forget_driver_answers()
        yield fake


_ACTIVE: list = []  # the FakeDriver of the innermost fake_gpu


def _to_active(method: str):
    def call(*args):
        return getattr(_ACTIVE[-1], method)(*args)
    return call


def _forget_driver_answers() -> None:
    """Drop what weft remembered from the driver (encodings, the tensor-map probe,
    prepared launches), so a stubbed driver's answers never outlive it."""
    from weft.kernels import _launch
    from weft.runtime import tensor_descriptor

    tensor_descriptor._encoded.cache_clear()
    # An older weft (timed for comparison) has no probe and no prepared calls.
    getattr(tensor_descriptor, "clear_address_field", lambda: None)()
    getattr(_launch, "clear_prepared_calls", lambda: None)()


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
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--fake", action="store_true", help="stub the driver even where a GPU answers")
    args = parser.parse_args()
    from weft.runtime import driver

    real = driver.has_gpu() and not args.fake
    context = contextlib.nullcontext(None) if real else fake_gpu(record=False)
    with context as fake:
        for name, call in _cases("cuda" if real else "cpu"):
            us = time_calls(call, args.calls)
            allocation = _allocation_us(args.calls)
            extra = "" if fake is None else f" ({fake.launch_count} launches, {fake.encodes} encodes so far)"
            print(f"{name:>42}: {us:8.1f} us per call, {allocation:6.1f} us of it allocating outputs, "
                  f"{us - allocation:6.1f} us the rest{extra}")
    print("driver:", "real GPU" if real else "stubbed (CPU torch tensors as device 0)")


if __name__ == "__main__":
    main()
