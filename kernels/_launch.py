"""What the kernel families share on the host: how many CTAs a persistent kernel launches
(as many as stay resident), how far ahead a row kernel prefetches, the prepared calls
that let a repeated GPU call skip the long way, and which torch calls go through weft's
torch operators instead. The arrays themselves are checked and allocated by
runtime/host_arrays.py.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import sys
import threading
from collections import OrderedDict

from ..runtime.host_arrays import is_torch, rows_start_on_16_bytes

_C_UINT64_VALUE = ctypes.c_uint64.value  # the descriptor behind `holder.value = ...`


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
    wrapper returns.

    A call is the whole fast path, so it is one Python frame over C calls: everything
    that does not change from call to call (contiguous strides, the stream, the driver's
    memset) is worked out here once."""

    __slots__ = ("launch", "outputs", "bindings", "zeroed", "result", "_allocations", "_empty_strided",
                 "_memset", "_stream")

    def __init__(self, launch, outputs, bindings, zeroed, result):
        import torch

        from ..runtime import driver

        self.launch, self.outputs, self.result = launch, tuple(outputs), result
        self.bindings = tuple(tuple(b) for b in bindings)
        self.zeroed = tuple(zeroed)
        self._allocations = tuple((tuple(shape), _contiguous_strides(shape) if strides is None else tuple(strides),
                                   dtype, device, binds)
                                  for (shape, strides, dtype, device), binds in zip(self.outputs, self.bindings))
        self._empty_strided = torch.empty_strided
        self._memset = driver.memset_d32_async_entry() if self.zeroed else None
        self._stream = launch.config.hStream

    def __call__(self):
        empty_strided = self._empty_strided
        outs = []
        for shape, strides, dtype, device, binds in self._allocations:
            out = empty_strided(shape, strides, dtype=dtype, device=device)
            address = out.data_ptr()
            for bind in binds:
                bind(address)
            outs.append(out)
        for index, words in self.zeroed:
            err = self._memset(outs[index].data_ptr(), 0, words, self._stream)[0]
            if err != 0:
                from ..runtime import driver

                driver.check((err,), "cuMemsetD32Async")
        self.launch()
        return self.result(outs)


def _contiguous_strides(shape) -> tuple:
    strides, step = [], 1
    for size in reversed(tuple(shape)):
        strides.append(step)
        step *= max(1, size)
    return tuple(reversed(strides))


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
    """Keep `call` under `key`, unless torch is capturing a CUDA graph: a call's launch
    holds the tensors of the call that made it (through its descriptors), and tensors
    made during capture live in the graph's memory pool, which torch hands out again
    once the graph is done with it (torch.compile's CUDA graph trees refuse such tensors
    kept alive). Calls under capture take the long way."""
    if not may_keep_tensors():
        return
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


def capturing_cuda_graph() -> bool:
    """Whether torch (when loaded) is capturing a CUDA graph on the current stream."""
    torch = sys.modules.get("torch")
    return torch is not None and torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


_KEEPING_NO_TENSORS = threading.local()


@contextlib.contextmanager
def keeping_no_tensors():
    """Calls inside keep no tensor in weft's caches (prepared calls, split-K scratch). The
    torch operators run their calls so: under torch.compile's mode="reduce-overhead", CUDA
    graph trees run a graph's first calls without capture but with every allocation in the
    graph's memory pool, and refuse to replay while a tensor of that pool is kept alive
    outside the graph's outputs; capture itself cannot be seen there."""
    depth = getattr(_KEEPING_NO_TENSORS, "depth", 0)
    _KEEPING_NO_TENSORS.depth = depth + 1
    try:
        yield
    finally:
        _KEEPING_NO_TENSORS.depth = depth


def may_keep_tensors() -> bool:
    """Whether this call may keep tensors in weft's caches: not under CUDA-graph capture
    (they would live in the graph's memory pool) nor inside `keeping_no_tensors`."""
    return not getattr(_KEEPING_NO_TENSORS, "depth", 0) and not capturing_cuda_graph()


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
    # tensor_facts, inlined: this runs on every call.
    tensor = _TORCH_TENSOR[0]
    facts = []
    for x in tensors:
        if type(x) is not tensor or not x.is_cuda:
            return None
        facts.append((x.data_ptr(), x.shape, x.stride(), x.dtype, x.get_device()))
    if not _STREAM:
        from ..runtime import launcher

        _STREAM.append(launcher._torch_stream_getter())
        from ..compiler import config

        _STREAM.append(config.emulate)
    return (tuple(facts), options, _STREAM[0](facts[0][4]), _STREAM[1]())


# ----------------------------------------------------------------------------- torch operators

OPERATOR, AUTOGRAD = "operator", "autograd"  # the two torch routes of `torch_route`


def torch_route(*arrays) -> str | None:
    """How a wrapper's call on `arrays` reaches its kernel (kernels/torch_ops.py):

    - OPERATOR, weft's torch.library operator, which torch.compile, torch's dispatch
      modes (FakeTensorMode, FlopCounterMode) and torch.func see: any torch call inside a
      torch.compile trace, under a dispatch mode or a torch.func transform, or on a
      tensor subclass (FakeTensor, FunctionalTensor);
    - AUTOGRAD, a torch.autograd.Function around the host path: plain tensors in eager
      mode of which one requires grad (grad mode on). The operator is differentiable
      too, but its dispatch and torch's generic autograd wrapper cost several times the
      Function's Python;
    - None, the host path alone: numpy arrays, mixed arguments (which the host path
      refuses with a readable error) and plain tensors no gradient flows through.
    """
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    tensor = torch.Tensor
    for x in arrays:
        if not isinstance(x, tensor):
            return None
    if torch.compiler.is_compiling():
        return OPERATOR
    for x in arrays:
        if type(x) is not tensor:
            return OPERATOR
    if torch._C._len_torch_dispatch_stack() or torch._C._are_functorch_transforms_active():
        return OPERATOR
    if torch.is_grad_enabled():
        for x in arrays:
            if x.requires_grad:
                return AUTOGRAD
    return None


def torch_ops():
    """kernels/torch_ops.py, imported (and its operators registered) on first use."""
    if not _TORCH_OPS:
        from . import torch_ops

        _TORCH_OPS.append(torch_ops)
    return _TORCH_OPS[0]


_TORCH_OPS: list = []  # [kernels/torch_ops.py] once imported
