"""A stand-in GPU for testing the GPU host path without one: `fake_gpu()` makes weft see
CPU torch tensors as living on device 0 and stubs the driver calls a launch makes
(cuLaunchKernelEx, cuTensorMapEncodeTiled, cuMemsetD32Async, module loading, occupancy,
device attributes), recording what they were given. Used by test_host_fast_path.py and
by benchmarks/host_path.py."""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import operator
import struct
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
        return (0,)  # cuda-python returns (CUresult,)


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
        # A C getter, not a lambda: the host path asks every input, and host_path.py
        # times that path, which should not time the fake.
        patch(torch.Tensor, "is_cuda", property(operator.attrgetter("is_cpu")))
        patch(torch.Tensor, "get_device", lambda self: 0 if self.device.type == "cpu" else -1)
        patch(driver, "init", lambda: None)
        patch(driver, "current_device", lambda: 0)
        patch(driver, "make_address_context_current", lambda address: None)  # the fake device is always current
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
