"""The CUDA driver, through `cuda.bindings.driver`: the only module that imports it.

The import is lazy so `import weft` works on machines with no driver. Contexts are the
devices' *primary* contexts (cuDevicePrimaryCtxRetain), the same ones the CUDA runtime and
hence PyTorch and CuPy use, so pointers and streams from those libraries are valid here.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from dataclasses import dataclass
from typing import Optional, Sequence

_cuda = None  # the cuda.bindings.driver module once imported
_init_lock = threading.Lock()
_initialized = False
_primary: dict[int, object] = {}  # device ordinal -> retained primary CUcontext


class DriverError(RuntimeError):
    """A driver call failed: `call` names it, `code`/`name` are the CUresult."""

    def __init__(self, call: str, code: int, name: str, detail: str = "", log: str = ""):
        message = f"{call} failed: {name} ({code})"
        if detail:
            message += f": {detail}"
        if log:
            message += f"\n{log}"
        super().__init__(message)
        self.call, self.code, self.name, self.log = call, code, name, log


def cuda():
    """The `cuda.bindings.driver` module; DriverError when cuda-python is missing."""
    global _cuda
    if _cuda is None:
        try:
            from cuda.bindings import driver as module
        except ImportError as exc:
            raise DriverError("import cuda.bindings.driver", -1, "ImportError",
                              f"{exc}; install cuda-python (pip install cuda-python)") from exc
        _cuda = module
    return _cuda


def _error_text(err) -> tuple[str, str]:
    d = cuda()
    try:
        name = d.cuGetErrorName(err)[1]
        text = d.cuGetErrorString(err)[1]
        return (name.decode() if name else str(err)), (text.decode() if text else "")
    except Exception:  # the driver itself may be unusable; fall back to the enum
        return str(err), ""


def check(result, call: str):
    """Unpack a cuda-python result `(err, *values)`; raise DriverError naming `call`.

    Returns None, the single value, or the tuple of values.
    """
    if isinstance(result, tuple):
        err, values = result[0], result[1:]
    else:
        err, values = result, ()
    if err != 0:  # CUresult is an IntEnum-like enum; 0 is CUDA_SUCCESS
        name, text = _error_text(err)
        raise DriverError(call, int(err), name, text)
    if not values:
        return None
    return values[0] if len(values) == 1 else values


def memset_d32_async(address: int, words: int, stream) -> None:
    """Zero `words` 32-bit words at `address`, queued on `stream` (capturable in a graph)."""
    check(cuda().cuMemsetD32Async(address, 0, words, stream), "cuMemsetD32Async")


def memset_d32_async_entry():
    """The driver's cuMemsetD32Async itself, for a prepared launch's hot path, where the
    wrapper above would be one more Python frame a call: call it as
    `f(address, 0, words, stream)` and `check` its result."""
    return cuda().cuMemsetD32Async


def memset_d8_async(address: int, nbytes: int, stream) -> None:
    """Zero `nbytes` bytes at `address`, queued on `stream`."""
    check(cuda().cuMemsetD8Async(address, 0, nbytes, stream), "cuMemsetD8Async")


def copy_device_to_device_async(destination: int, source: int, nbytes: int, stream) -> None:
    check(cuda().cuMemcpyDtoDAsync(destination, source, nbytes, stream), "cuMemcpyDtoDAsync")


def allocate(nbytes: int) -> int:
    """`nbytes` of device memory in the current context (device 0's primary when none);
    its address. Give it back with `free`."""
    if current_context() is None:
        set_current(0)
    return int(check(cuda().cuMemAlloc(int(nbytes)), f"cuMemAlloc({nbytes})"))


def free(address: int) -> None:
    check(cuda().cuMemFree(address), "cuMemFree")


def create_event():
    """A CUevent that records timestamps (for timing launches with `elapsed_ms`)."""
    if current_context() is None:
        set_current(0)
    d = cuda()
    return check(d.cuEventCreate(d.CUevent_flags.CU_EVENT_DEFAULT), "cuEventCreate")


def record_event(event, stream) -> None:
    check(cuda().cuEventRecord(event, stream), "cuEventRecord")


def elapsed_ms(start, end) -> float:
    """Milliseconds between two recorded events, waiting for `end` to complete."""
    check(cuda().cuEventSynchronize(end), "cuEventSynchronize")
    return float(check(cuda().cuEventElapsedTime(start, end), "cuEventElapsedTime"))


def destroy_event(event) -> None:
    check(cuda().cuEventDestroy(event), "cuEventDestroy")


def init() -> None:
    """cuInit once per process (thread-safe)."""
    global _initialized
    if _initialized:
        return
    with _init_lock:
        if not _initialized:
            d = cuda()
            try:
                result = d.cuInit(0)
            except Exception as exc:  # cuda-python raises when libcuda.so is absent
                raise DriverError("cuInit", -1, type(exc).__name__, str(exc)) from exc
            check(result, "cuInit")
            _initialized = True


@functools.lru_cache(maxsize=1)
def has_gpu() -> bool:
    """True when the driver loads and reports at least one device; never raises."""
    try:
        init()
        return check(cuda().cuDeviceGetCount(), "cuDeviceGetCount") > 0
    except Exception:
        return False


def device_count() -> int:
    init()
    return check(cuda().cuDeviceGetCount(), "cuDeviceGetCount")


def primary_context(device: int):
    """The retained primary context of `device` (retained once, kept for the process)."""
    ctx = _primary.get(device)
    if ctx is None:
        init()
        d = cuda()
        handle = check(d.cuDeviceGet(device), f"cuDeviceGet({device})")
        ctx = check(d.cuDevicePrimaryCtxRetain(handle), f"cuDevicePrimaryCtxRetain({device})")
        _primary[device] = ctx
    return ctx


def current_context():
    """The calling thread's current CUcontext, or None."""
    init()
    ctx = check(cuda().cuCtxGetCurrent(), "cuCtxGetCurrent")
    return ctx if int(ctx) else None


def set_current(device: int):
    """Make `device`'s primary context current on this thread; return it."""
    ctx = primary_context(device)
    check(cuda().cuCtxSetCurrent(ctx), f"cuCtxSetCurrent(device {device})")
    return ctx


def make_address_context_current(address: int) -> None:
    """Make the primary context of the device holding `address` current on this thread when
    none is. A thread that only ever ran CUDA runtime calls (torch's autograd threads, which
    call cudaSetDevice only when the device differs from the runtime's default) has no
    current driver context, and driver calls such as cuTensorMapEncodeTiled then fail with
    CUDA_ERROR_INVALID_CONTEXT."""
    if current_context() is not None:
        return
    d = cuda()
    device = check(d.cuPointerGetAttribute(d.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, address),
                   f"cuPointerGetAttribute(DEVICE_ORDINAL, {address:#x})")
    set_current(int(device))


def current_device() -> int:
    """The device of this thread's current context; device 0's primary when none."""
    ctx = current_context()
    if ctx is None:
        set_current(0)
        return 0
    return int(check(cuda().cuCtxGetDevice(), "cuCtxGetDevice"))


# ----------------------------------------------------------------------------- modules

def load_module(kind: str, data):
    """Load a module into the current context. `kind` is "cubin" or "ptx".

    PTX goes through cuModuleLoadDataEx with error and info log buffers so a JIT failure
    reports the driver's own compiler log.
    """
    d = cuda()
    if current_context() is None:
        set_current(0)
    if kind == "cubin":
        return check(d.cuModuleLoadData(bytes(data)), "cuModuleLoadData")
    if kind != "ptx":
        raise ValueError(f"module kind must be 'cubin' or 'ptx', got {kind!r}")
    image = data.encode() if isinstance(data, str) else bytes(data)
    if not image.endswith(b"\0"):
        image += b"\0"  # the driver reads PTX as a C string
    size = 1 << 16
    error_log, info_log = bytearray(size), bytearray(size)
    opt = d.CUjit_option
    options = [opt.CU_JIT_ERROR_LOG_BUFFER, opt.CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
               opt.CU_JIT_INFO_LOG_BUFFER, opt.CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES]
    values = [error_log, size, info_log, size]
    err, module = d.cuModuleLoadDataEx(image, len(options), options, values)
    if err != 0:
        name, text = _error_text(err)
        log = "\n".join(x for x in (_c_string(error_log), _c_string(info_log)) if x)
        raise DriverError("cuModuleLoadDataEx (PTX JIT)", int(err), name, text,
                          log=f"JIT log:\n{log}" if log else "")
    return module


def _c_string(buffer: bytearray) -> str:
    return bytes(buffer).split(b"\0", 1)[0].decode(errors="replace").strip()


def unload_module(module) -> None:
    check(cuda().cuModuleUnload(module), "cuModuleUnload")


def get_function(module, name: str):
    """The CUfunction `name` in `module`."""
    return check(cuda().cuModuleGetFunction(module, name.encode()),
                 f"cuModuleGetFunction({name!r})")


def function_attribute(function, name: str) -> int:
    """A CU_FUNC_ATTRIBUTE_* value, e.g. "NUM_REGS", "MAX_DYNAMIC_SHARED_SIZE_BYTES"."""
    d = cuda()
    attr = getattr(d.CUfunction_attribute, f"CU_FUNC_ATTRIBUTE_{name}")
    return check(d.cuFuncGetAttribute(attr, function), f"cuFuncGetAttribute({name})")


def set_max_dynamic_shared(function, nbytes: int) -> None:
    """Opt `function` into `nbytes` of dynamic shared memory; needed above 48 KB."""
    d = cuda()
    attr = d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    check(d.cuFuncSetAttribute(function, attr, int(nbytes)),
          f"cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES={nbytes})")


def max_active_ctas(function, threads: int, dynamic_shared: int) -> int:
    """CTAs of `function` one SM holds at once with `threads` per CTA and `dynamic_shared`
    bytes of dynamic shared memory (the driver's occupancy calculator: registers, shared
    memory and warps all count)."""
    return int(check(cuda().cuOccupancyMaxActiveBlocksPerMultiprocessor(function, int(threads),
                                                                         int(dynamic_shared)),
                     "cuOccupancyMaxActiveBlocksPerMultiprocessor"))


def max_active_clusters(function, threads: int, dynamic_shared: int, cluster: Sequence[int]) -> int:
    """Clusters of `cluster` CTAs of `function` the device holds at once (a cluster's CTAs
    share a GPC, so this can be less than the SMs / cluster size)."""
    config = make_launch_config((threads, 1, 1), dynamic_shared, cluster)
    config.gridDimX, config.gridDimY, config.gridDimZ = _dim3(cluster)
    return int(check(cuda().cuOccupancyMaxActiveClusters(function, config), "cuOccupancyMaxActiveClusters"))


# ----------------------------------------------------------------------------- devices

@dataclass(frozen=True)
class DeviceProperties:
    """What the launcher and autotuner need to know about one device."""

    ordinal: int
    name: str
    compute_capability: tuple[int, int]
    sm_count: int
    max_shared_optin: int  # bytes of shared memory one block may opt into
    max_shared_per_sm: int
    max_threads_per_block: int
    warp_size: int


@functools.lru_cache(maxsize=None)
def device_properties(device: int = 0) -> DeviceProperties:
    init()
    d = cuda()
    handle = check(d.cuDeviceGet(device), f"cuDeviceGet({device})")
    attr = d.CUdevice_attribute

    def get(name):
        return check(d.cuDeviceGetAttribute(getattr(attr, f"CU_DEVICE_ATTRIBUTE_{name}"),
                                            handle), f"cuDeviceGetAttribute({name})")

    raw_name = check(d.cuDeviceGetName(256, handle), "cuDeviceGetName")
    return DeviceProperties(
        ordinal=device,
        name=raw_name.split(b"\0", 1)[0].decode(),
        compute_capability=(get("COMPUTE_CAPABILITY_MAJOR"), get("COMPUTE_CAPABILITY_MINOR")),
        sm_count=get("MULTIPROCESSOR_COUNT"),
        max_shared_optin=get("MAX_SHARED_MEMORY_PER_BLOCK_OPTIN"),
        max_shared_per_sm=get("MAX_SHARED_MEMORY_PER_MULTIPROCESSOR"),
        max_threads_per_block=get("MAX_THREADS_PER_BLOCK"),
        warp_size=get("WARP_SIZE"),
    )


# ----------------------------------------------------------------------------- launch

def make_launch_config(block: Sequence[int], shared_bytes: int,
                       cluster: Optional[Sequence[int]] = None):
    """A CUlaunchConfig with block, dynamic smem and (optionally) cluster dims set;
    grid and stream are filled per launch. Reusable: the driver copies it at launch."""
    d = cuda()
    config = d.CUlaunchConfig()
    config.blockDimX, config.blockDimY, config.blockDimZ = _dim3(block)
    config.sharedMemBytes = int(shared_bytes)
    if cluster is not None and tuple(cluster) != (1, 1, 1):
        attr = d.CUlaunchAttribute()
        attr.id = d.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = \
            _dim3(cluster)
        config.attrs = [attr]
        config.numAttrs = 1
    else:
        config.numAttrs = 0
    return config


def launch_prepared(config, function, params_address: int) -> None:
    """cuLaunchKernelEx with a prepared config and the address of a void*[] holding one
    pointer per kernel parameter. The hot path: no argument checking here."""
    err = _cuda.cuLaunchKernelEx(config, function, params_address, 0)[0]
    if err != 0:
        raise_launch_error(err, config)


def raise_launch_error(err, config) -> None:
    name, text = _error_text(err)
    raise DriverError(
        "cuLaunchKernelEx", int(err), name,
        f"{text} (grid ({config.gridDimX}, {config.gridDimY}, {config.gridDimZ}), "
        f"block ({config.blockDimX}, {config.blockDimY}, {config.blockDimZ}), "
        f"{config.sharedMemBytes} bytes dynamic shared memory)")


def launch(function, grid: Sequence[int], block: Sequence[int], shared_bytes: int,
           stream, arg_values: Sequence[ctypes._SimpleCData],
           cluster: Optional[Sequence[int]] = None) -> None:
    """Launch `function` once: the convenient, slower form of `launch_prepared`.

    `arg_values` are ctypes scalars, one per kernel parameter (c_uint64 for pointers);
    `stream` is a CUstream, an int handle, or None for the legacy default stream.
    """
    init()
    config = make_launch_config(block, shared_bytes, cluster)
    config.gridDimX, config.gridDimY, config.gridDimZ = _dim3(grid)
    config.hStream = cuda().CUstream(0 if stream is None else int(stream))
    pointers = (ctypes.c_void_p * max(1, len(arg_values)))(
        *[ctypes.addressof(v) for v in arg_values])
    launch_prepared(config, function, ctypes.addressof(pointers) if arg_values else 0)


def synchronize() -> None:
    """Wait for all work in the current context."""
    check(cuda().cuCtxSynchronize(), "cuCtxSynchronize")


def _dim3(dims: Sequence[int]) -> tuple[int, int, int]:
    dims = tuple(int(x) for x in dims)
    if not 1 <= len(dims) <= 3:
        raise ValueError(f"expected 1 to 3 dimensions, got {dims}")
    return dims + (1,) * (3 - len(dims))
