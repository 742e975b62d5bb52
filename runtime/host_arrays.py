"""Host arrays a public kernel wrapper takes: checking them, where they live, their strides,
and allocating outputs like them.

A torch CUDA tensor runs on the GPU; a numpy array or CPU torch tensor runs the same kernel
on the CPU emulator (the JIT decides from the arguments). Nothing here imports torch
unless the caller passed a torch tensor.

The public wrappers (weft.kernels, weft.highlevel.examples) take numpy arrays and torch
tensors of any strides: each checks its arguments with `check_arrays` and hands its kernel
a view the kernel can read (copying only where the kernel cannot take the strides). Their
kernels, like every @jit kernel, see raw pointers: a kernel called directly reads memory as
its own code says.
"""

from __future__ import annotations

import numpy as np


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
    from .arguments import ArgumentTypeError, dtype_signature

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
