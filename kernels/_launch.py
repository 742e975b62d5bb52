"""What the kernel families share: checking the arrays a wrapper got, where they live,
and allocating outputs like them.

A torch CUDA tensor runs on the GPU; a numpy array or CPU torch tensor runs the same kernel
on the CPU emulator (the JIT decides from the arguments). Nothing here imports torch
unless the caller passed a torch tensor.

The public wrappers (vector_add, softmax, layer_norm, transpose, convert, matmul,
flash_attention) take numpy arrays and torch tensors of any strides: each checks its
arguments with `check_arrays` and hands its kernel a view the kernel can read (copying
only where the kernel cannot take the strides). Their kernels, like every @ll.jit kernel,
see raw pointers: a kernel called directly reads memory as its own code says.
"""

from __future__ import annotations

import ctypes
import functools
import sys
import threading
from collections import OrderedDict

import numpy as np

_C_UINT64_VALUE = ctypes.c_uint64.value  # the descriptor behind `holder.value = ...`


def is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


ACCEPTED = "numpy arrays (the CPU emulator) or torch tensors (CUDA: the GPU; CPU: the emulator)"


def device_of(x) -> str:
    """Where an array lives, in words: "cpu" for host memory (numpy, CPU torch), torch's
    device name ("cuda:0") for a torch tensor, "cuda" for another CUDA array."""
    if isinstance(x, np.ndarray):
        return "cpu"
    if is_torch(x) and hasattr(x, "device"):
        return "cpu" if x.device.type == "cpu" else str(x.device)
    return "cuda"  # only __cuda_array_interface__ objects get here (check_arrays)


def _describe(x) -> str:
    if isinstance(x, np.ndarray):
        return "a numpy array (cpu)"
    if is_torch(x):
        return f"a torch tensor on {x.device}"
    return f"a {type(x).__qualname__} (CUDA memory)"


def check_arrays(wrapper: str, **arrays) -> None:
    """The arrays a public wrapper got (by parameter name) are numpy arrays or torch tensors,
    all on one device, and that device is the host or a CUDA GPU; TypeError/ValueError
    saying what to pass otherwise. A Python list or tuple is not converted: the wrapper
    cannot guess the dtype its kernel should run in."""
    for name, x in arrays.items():
        if isinstance(x, np.ndarray) or (is_torch(x) and hasattr(x, "device")) \
                or hasattr(x, "__cuda_array_interface__"):
            continue
        hint = (f"; convert it first, e.g. np.asarray({name}, dtype=np.float32)"
                if isinstance(x, (list, tuple)) else "")
        raise TypeError(f"{wrapper}: {name} must be one of {ACCEPTED}, got "
                        f"{type(x).__module__.replace('builtins', 'Python')}.{type(x).__qualname__}{hint}")
    devices = {name: device_of(x) for name, x in arrays.items()}
    if len(set(devices.values())) > 1:
        raise ValueError(f"{wrapper}: the arrays must live on one device, got "
                         f"{', '.join(f'{n} {_describe(x)}' for n, x in arrays.items())}; "
                         f"move them with .cuda() (GPU) or .cpu() (emulator)")
    for name, x in arrays.items():
        if not (isinstance(x, np.ndarray) or is_torch(x)):
            raise TypeError(f"{wrapper}: {name} is {_describe(x)}; pass torch CUDA tensors "
                            f"(torch.as_tensor({name}, device='cuda')) or numpy arrays")
    device = next(iter(devices.values()), "cpu")
    if device != "cpu" and not device.startswith("cuda"):
        raise ValueError(f"{wrapper} runs on CUDA tensors (the GPU) or host arrays (the CPU "
                         f"emulator), got tensors on {device}; move them with .cuda() or .cpu()")


def element_strides(x) -> tuple[int, ...]:
    """x's strides in elements (numpy's are in bytes)."""
    return tuple(x.stride()) if is_torch(x) else tuple(s // x.itemsize for s in x.strides)


def is_contiguous(x) -> bool:
    """Whether x is laid out as a fresh array of its shape (C order, every stride as
    computed from the shape, size-1 dims included: kernels may read those strides)."""
    return element_strides(x) == _contiguous_strides(tuple(x.shape))


def contiguous(x):
    """x itself when `is_contiguous`, else a C-contiguous copy on its device."""
    if is_contiguous(x):
        return x
    copy = new_array(x, tuple(x.shape))
    copy[...] = x
    return copy


def _contiguous_strides(shape: tuple) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


def with_contiguous_rows(x):
    """A 2-D x whose rows a row kernel can read from (row pointer, row stride): x itself
    when its last dim has stride 1 and its row stride is not negative, else a contiguous
    copy."""
    strides = element_strides(x)
    return x if strides[-1] == 1 and strides[0] >= 0 else contiguous(x)


def empty_like(x, dtype=None):
    if is_torch(x):
        import torch

        return torch.empty_like(x, dtype=dtype)
    return np.empty_like(x, dtype=dtype)


def new_array(like, shape, dtype: str | None = None, zero: bool = False):
    """An array where `like` lives (a torch tensor on its device, else numpy): `shape`, of
    `like`'s dtype or the one named ("float32", "int32"), zeroed when `zero`."""
    if is_torch(like):
        import torch

        make = torch.zeros if zero else torch.empty
        return make(shape, dtype=getattr(torch, dtype) if dtype else like.dtype, device=like.device)
    return (np.zeros if zero else np.empty)(shape, dtype=np.dtype(dtype) if dtype else like.dtype)


_FLOAT_BITS = {"fp32": 32, "fp16": 16, "bf16": 16}


def float_bits(x, what: str) -> int:
    """Bits per element of a fp32/fp16/bf16 array; TypeError naming `what` otherwise."""
    from ..runtime.arguments import ArgumentTypeError, dtype_signature

    try:
        name = dtype_signature(x.dtype)
    except ArgumentTypeError:
        name = str(x.dtype)
    if name not in _FLOAT_BITS:
        raise TypeError(f"{what} supports fp32, fp16 and bf16, got {name}")
    return _FLOAT_BITS[name]


def row_stride(x) -> int:
    """Elements between consecutive rows; the last dim must be contiguous."""
    if is_torch(x):
        strides = x.stride()
    else:
        strides = tuple(s // x.itemsize for s in x.strides)
    if strides[-1] != 1:
        raise ValueError(f"the last dim must be contiguous (stride 1), got strides {strides}")
    return strides[0] if len(strides) > 1 else x.shape[-1]


def next_power_of_two(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def data_address(x) -> int:
    return x.data_ptr() if is_torch(x) else x.ctypes.data


def item_bytes(x) -> int:
    return x.element_size() if is_torch(x) else x.itemsize


def rows_start_on_16_bytes(x) -> bool:
    """Whether every row of a 2-D array starts on a 16-byte boundary (what bulk copies
    and bulk prefetches need)."""
    return data_address(x) % 16 == 0 and (row_stride(x) * item_bytes(x)) % 16 == 0


def prefetch_distance(x, config) -> int:
    """Rows ahead that a row kernel prefetches into L2 (0 on the emulator: no L2 there).

    About one wave of resident CTAs ahead (SMs x CTAs per SM, from the config's warps):
    the prefetched row is read by a CTA that starts roughly one CTA lifetime later.
    Rows that do not start on 16-byte boundaries are never prefetched: the bulk
    prefetch would fault on them.
    """
    if not rows_start_on_16_bytes(x):
        return 0
    if config.prefetch_rows >= 0:
        return config.prefetch_rows
    if not is_torch(x) or not x.is_cuda:
        return 0
    from ..runtime import driver

    sm_count = driver.device_properties(x.device.index or 0).sm_count  # cached by the driver
    ctas_per_sm = max(1, 2048 // (32 * config.num_warps))
    return sm_count * ctas_per_sm


EMULATED_CTAS = 3  # persistent kernels on the CPU emulator: a few CTAs, each with several items
_RESIDENT: dict = {}


def persistent_grid(kernel, x, items: int, args: tuple, constexprs: dict, num_warps: int,
                    options: dict | None = None) -> int:
    """CTAs to launch for a persistent kernel over `items` work items (rows, tiles) on
    x's device: as many as the SMs hold at once (every CTA resident, so none waits for
    another to finish; the driver's occupancy answer for a launch with these launch
    `options`, e.g. maxnreg), but no more than there are items."""
    if not (is_torch(x) and x.is_cuda):
        return max(1, min(items, EMULATED_CTAS))
    from ..runtime import driver

    resident = _resident(kernel, x, args, constexprs, num_warps, options=options)
    return max(1, min(items, driver.device_properties(x.device.index or 0).sm_count * resident))


def persistent_cluster_grid(kernel, x, items: int, args: tuple, constexprs: dict, num_warps: int,
                            cluster: int) -> int:
    """CTAs to launch for a persistent kernel whose CTAs run in clusters of
    `cluster` along x (launched with cluster=(cluster, 1, 1)), `cluster` items per cluster:
    as many clusters as the device holds at once (a cluster's CTAs share a GPC, so that
    can be fewer than SMs / cluster; one more would wait for another to finish), but no
    more than there are items for. On the emulator, one cluster."""
    if not (is_torch(x) and x.is_cuda):
        return cluster
    return cluster * max(1, min(items // cluster, _resident(kernel, x, args, constexprs, num_warps, cluster)))


def _resident(kernel, x, args: tuple, constexprs: dict, num_warps: int, cluster: int | None = None,
              options: dict | None = None) -> int:
    """The driver's occupancy answer for this kernel variant on x's device, asked once:
    CTAs per SM, or with `cluster`, clusters of that many CTAs on the whole device."""
    options = options or {}
    key = (kernel, str(x.dtype), tuple(sorted(constexprs.items())), num_warps, x.device.index or 0, cluster,
           tuple(sorted(options.items())))
    resident = _RESIDENT.get(key)
    if resident is None:
        if cluster is None:
            resident = kernel.resident_ctas(*args, **constexprs, num_warps=num_warps, **options)
        else:
            resident = kernel.resident_clusters(*args, **constexprs, num_warps=num_warps, cluster=(cluster, 1, 1))
        _RESIDENT[key] = resident
    return resident


# ----------------------------------------------------------------------------- prepared calls
#
# A wrapper called again with the same inputs (same tensors, or others at the same
# addresses with the same shapes, strides, dtypes and device) and the same options makes
# the same launch but for its outputs, which are new tensors each call. The first such
# call goes the long way (checks, config choice, descriptors, grid, dispatch) and keeps
# a PreparedCall; later calls look it up by their signature and only allocate outputs,
# point the packed launch at them, zero what must start at zero, and launch.

PREPARED_CALLS = 16  # signatures kept per thread (least recently used dropped)


class PreparedCall:
    """A wrapper's GPU call with every input fact fixed. `outputs`: per output,
    (shape, strides or None for contiguous, torch dtype, torch device). `bindings`: per
    output, the functions address -> None that point the launch at it (a pointer
    parameter's holder, a descriptor's `rebinder`). `zeroed`: (output index, int32 words)
    to clear on the launch stream before each launch. `result`: outputs -> what the
    wrapper returns."""

    __slots__ = ("launch", "outputs", "bindings", "zeroed", "result", "_empty", "_empty_strided", "_memset")

    def __init__(self, launch, outputs, bindings, zeroed, result):
        import torch

        from ..runtime import driver

        self.launch, self.outputs, self.result = launch, tuple(outputs), result
        self.bindings = tuple(tuple(b) for b in bindings)
        self.zeroed = tuple(zeroed)
        self._empty, self._empty_strided = torch.empty, torch.empty_strided
        self._memset = driver.cuda().cuMemsetD32Async if self.zeroed else None

    def __call__(self):
        empty, empty_strided = self._empty, self._empty_strided
        outs = [empty(shape, dtype=dtype, device=device) if strides is None
                else empty_strided(shape, strides, dtype=dtype, device=device)
                for shape, strides, dtype, device in self.outputs]
        for out, binds in zip(outs, self.bindings):
            address = out.data_ptr()
            for bind in binds:
                bind(address)
        stream = self.launch.config.hStream
        for index, words in self.zeroed:
            err = self._memset(outs[index].data_ptr(), 0, words, stream)
            if err != 0:
                from ..runtime import driver

                driver.check((err,), "cuMemsetD32Async")
        self.launch()
        return self.result(outs)


def pointer_binding(launch, name: str):
    """address -> None storing the address in pointer parameter `name` of a
    PreparedLaunch (a no-op when the kernel dropped the parameter)."""
    holder = launch.holder(name)
    if holder is None:
        return lambda address: None
    return functools.partial(_C_UINT64_VALUE.__set__, holder)


def descriptor_binding(launch, name: str, desc):
    """address -> None rewriting descriptor parameter `name` of a PreparedLaunch (built
    from `desc`) for `desc`'s tensor moved to that address."""
    from ..runtime.tensor_descriptor import rebinder

    holder = launch.holder(name)
    if holder is None:
        return lambda address: None
    return rebinder(desc, holder)


class _PreparedCalls(threading.local):
    def __init__(self):
        self.entries: OrderedDict = OrderedDict()


_CALLS = _PreparedCalls()


def prepared_call(key):
    """The PreparedCall kept for a signature, or None."""
    entries = _CALLS.entries
    call = entries.get(key)
    if call is not None:
        entries.move_to_end(key)
    return call


def keep_prepared_call(key, call: PreparedCall) -> None:
    entries = _CALLS.entries
    entries[key] = call
    entries.move_to_end(key)
    while len(entries) > PREPARED_CALLS:
        entries.popitem(last=False)


def clear_prepared_calls() -> None:
    """Forget every prepared call of this thread (and the stream getter)."""
    _CALLS.entries.clear()
    _STREAM.clear()


_STREAM: list = []  # [device -> torch's current raw stream, config.emulate] once looked up


def tensor_facts(x):
    """What a launch reads from a torch CUDA tensor: address, shape, strides, dtype and
    device ordinal; None for anything else (numpy, CPU tensors, subclasses), which
    takes the long way every call."""
    if type(x) is not _TORCH_TENSOR[0] or not x.is_cuda:
        return None
    return (x.data_ptr(), x.shape, x.stride(), x.dtype, x.get_device())


_TORCH_TENSOR: list = [None]  # torch.Tensor once torch is imported


def gpu_signature(tensors: tuple, options: tuple):
    """The signature a prepared call is kept under: every fact of `tensors` (torch CUDA
    tensors) the launch depends on, `options` (the wrapper's flags), torch's current
    stream on their device, and WEFT_EMULATE. None when any tensor is not a plain torch
    CUDA tensor (the wrapper then takes the long way)."""
    if _TORCH_TENSOR[0] is None:
        torch = sys.modules.get("torch")
        if torch is None:
            return None
        _TORCH_TENSOR[0] = torch.Tensor
    facts = tuple(map(tensor_facts, tensors))
    if None in facts:
        return None
    if not _STREAM:
        from ..runtime import launcher

        _STREAM.append(launcher._torch_stream_getter())
        from ..compiler import config

        _STREAM.append(config.emulate)
    return (facts, options, _STREAM[0](facts[0][4]), _STREAM[1]())
