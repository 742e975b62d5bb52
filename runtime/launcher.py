"""Launch one CompiledKernel on the GPU, with a fast path for repeated launches.

Everything that does not change between launches is decided once: per parameter a
ctypes holder and a packer (`arguments.make_packers`), per argument type a reader
(`arguments.read_all`), per distinct argument *key tuple* the checked launch plan (device,
stream source), per device the loaded CUfunction, per thread a CUlaunchConfig and the
void*[] the driver reads parameters through. A repeated launch is then: read the
arguments, one dict lookup, fill the holders, set the grid, call cuLaunchKernelEx.
"""

from __future__ import annotations

import ctypes
import sys
import threading
from dataclasses import dataclass
from typing import Optional, Sequence

from ..compiler.compiled import CompiledKernel
from ..compiler.hardware import STATIC_SHARED_LIMIT
from . import made_tensor_descriptor as made
from . import arguments, driver
from .arguments import LaunchError

# CUresult codes after which a launch is retried with the right context current:
# CUDA_ERROR_INVALID_CONTEXT (no or another context current), CUDA_ERROR_INVALID_HANDLE.
_CONTEXT_ERRORS = (201, 400)


@dataclass(frozen=True)
class LaunchPlan:
    """What one argument key tuple means for a launch, checked once."""

    device: Optional[int]  # CUDA ordinal; None: the thread's current device
    torch_stream: bool  # a torch CUDA tensor is among the arguments


class _ThreadState:
    """Per-thread launch buffers: cuLaunchKernelEx releases the GIL, so two threads must
    never share the holders the driver is reading."""

    def __init__(self, launcher: "Launcher"):
        self.holders = arguments.make_holders(launcher.param_types)
        pointers = (ctypes.c_void_p * max(1, len(self.holders)))(
            *[ctypes.addressof(h) for h in self.holders])
        self.pointers = pointers  # keeps the array alive
        self.params_address = ctypes.addressof(pointers) if self.holders else 0
        self.config = driver.make_launch_config(
            (launcher.compiled.num_threads, 1, 1), launcher.dynamic_shared,
            launcher.compiled.cluster)
        self.stream = 0
        self.grid = None  # the last grid tuple, already checked and set on `config`
        self.launch = driver.cuda().cuLaunchKernelEx


class Launcher:
    """Launches `compiled`. `arg_names` names the arguments callers pass, in order, when
    they differ from the compiled parameters (the compiler may drop parameters it
    specialized away, e.g. an int equal to 1); arguments not among the parameters are
    read and checked but not passed."""

    def __init__(self, compiled: CompiledKernel, arg_names: Optional[Sequence[str]] = None):
        self.compiled = compiled
        self.name = compiled.name
        params = compiled.params
        self.param_names = tuple(p.name for p in params)
        self.param_types = tuple(p.type for p in params)
        passed = tuple(p.name for p in params if p.hidden is None)
        self.arg_names = tuple(arg_names) if arg_names is not None else passed
        position = {n: i for i, n in enumerate(self.arg_names)}
        missing = [n for n in passed if n not in position]
        if missing:
            raise ValueError(f"kernel '{self.name}' has parameters {missing} that are not "
                             f"among the arguments {list(self.arg_names)}")
        # Which argument feeds each parameter the caller passes; None when it is the identity.
        select = tuple(position[n] for n in passed)
        self._select = None if select == tuple(range(len(self.arg_names))) else select
        # Hidden parameters (desc.shape reads): (passed parameter, field, dim) each, read
        # from that descriptor's encoded tensor map (tensor_descriptor.EncodedTensorMap).
        self._hidden = tuple((passed.index(p.hidden[0]), p.hidden[1], p.hidden[2]) for p in params if p.hidden)
        # Tensor maps the kernel makes from its arguments (made_tensor_descriptor.py).
        self._made = {(passed.index(p.hidden[0]), p.hidden[2]): p.type
                      for p in params if p.hidden and p.hidden[1] == made.FIELD}
        # Tensor maps the kernel writes itself: a workspace and a template per call site.
        templates = tuple(p.type for p in params if p.hidden and p.hidden[1] == made.TEMPLATE_FIELD)
        self._workspace = made.TensorMapWorkspace(templates) if templates else None
        self._passed_names = passed
        self._passed = len(passed)
        self._packers = arguments.make_packers(self.name, self.param_names, self.param_types)
        self._nargs = len(self.arg_names)
        static = int(compiled.metadata.get("static_shared", 0))
        self.dynamic_shared = max(0, compiled.shared - static)
        self._plans: dict[tuple, LaunchPlan] = {}
        self._functions: dict[int, object] = {}
        self._load_lock = threading.Lock()
        self._tls = threading.local()
        self._streams: dict[int, object] = {}
        self._torch_stream_fn = None

    # ------------------------------------------------------------------ slow paths

    def plan(self, keys: tuple) -> LaunchPlan:
        """The checked plan for argument keys (cached); raises on bad arguments."""
        plan = self._plans.get(keys)
        if plan is None:
            chosen = keys if self._select is None else tuple(keys[i] for i in self._select)
            device = arguments.check_keys(self.name, self.param_names[:self._passed],
                                          self.param_types[:self._passed], chosen)
            torch_stream = any(arguments.on_torch_stream(k) for k in keys)
            plan = LaunchPlan(device if device is not None and device >= 0 else None,
                              torch_stream)
            if torch_stream and self._torch_stream_fn is None:
                self._torch_stream_fn = _torch_stream_getter()
            self._plans[keys] = plan
        return plan

    def function(self, device: int):
        """The CUfunction on `device`, loading the module into its primary context the
        first time (and opting into > 48 KB of dynamic shared memory)."""
        function = self._functions.get(device)
        if function is not None:
            return function
        with self._load_lock:
            function = self._functions.get(device)
            if function is None:
                function = self._functions[device] = self._load(device)
        return function

    def resident_ctas(self, device: int) -> int:
        """CTAs of this kernel one SM of `device` holds at once (for persistent grids)."""
        return driver.max_active_ctas(self.function(device), self.compiled.num_threads, self.dynamic_shared)

    def resident_clusters(self, device: int) -> int:
        """Clusters of this kernel (its compiled `cluster` dims) `device` holds at once."""
        return driver.max_active_clusters(self.function(device), self.compiled.num_threads, self.dynamic_shared,
                                          self.compiled.cluster or (1, 1, 1))

    def _load(self, device: int):
        previous = driver.current_context()
        target = driver.primary_context(device)
        switch = previous is None or int(previous) != int(target)
        if switch:
            driver.set_current(device)
        try:
            limit = driver.device_properties(device).max_shared_optin
            if self.compiled.shared > limit:
                raise LaunchError(
                    f"kernel '{self.name}' needs {self.compiled.shared} bytes of shared "
                    f"memory but device {device} allows {limit} per block; use smaller "
                    "tiles or fewer pipeline stages")
            kind, data = self.compiled.binary
            module = driver.load_module(kind, data)
            function = driver.get_function(module, self.name)
            if self.dynamic_shared > STATIC_SHARED_LIMIT:
                driver.set_max_dynamic_shared(function, self.dynamic_shared)
        finally:
            if switch and previous is not None:
                driver.check(driver.cuda().cuCtxSetCurrent(previous), "cuCtxSetCurrent")
        return function

    def _state(self) -> _ThreadState:
        state = getattr(self._tls, "state", None)
        if state is None:
            state = self._tls.state = _ThreadState(self)
        return state

    def _stream_object(self, handle: int):
        stream = self._streams.get(handle)
        if stream is None:
            stream = self._streams[handle] = driver.cuda().CUstream(handle)
        return stream

    # ------------------------------------------------------------------ fast path

    def __call__(self, grid, args: Sequence, stream=None) -> None:
        """Launch on `grid` (1-3 ints) with `args` in `arg_names` order. `stream` is an
        int handle, a CUstream, an object with `.cuda_stream` (torch, CuPy) or None: the
        current torch stream when torch CUDA tensors are passed, else the default
        stream."""
        if len(args) != self._nargs:
            arguments.check_count(self.name, self.arg_names, args)
        keys, values = arguments.read_all(args)
        plan = self._plans.get(keys)
        if plan is None:
            plan = self.plan(keys)
        self.launch_values(grid, values, plan, stream)

    def launch_values(self, grid, values: list, plan: LaunchPlan, stream=None) -> None:
        """Launch with already-read argument values and their plan (the JIT calls this
        after its own dispatch lookup)."""
        device = plan.device
        if device is None:
            device = driver.current_device()
        function = self._functions.get(device)
        if function is None:
            function = self.function(device)
        state = getattr(self._tls, "state", None)
        if state is None:
            state = self._state()
        config = state.config
        if grid != state.grid:
            gx, gy, gz = arguments.check_grid(self.name, grid, self.compiled.cluster)
            config.gridDimX, config.gridDimY, config.gridDimZ = gx, gy, gz
            # Lists are not remembered: one could change in place between launches.
            state.grid = grid if type(grid) is tuple or type(grid) is int else None
        if stream is None:
            handle = self._torch_stream_fn(device) if plan.torch_stream else 0
        else:
            handle = _stream_handle(stream)
        if handle != state.stream:
            config.hStream = self._stream_object(handle)
            state.stream = handle
        if self._select is not None:
            values = [values[i] for i in self._select]
        if self._hidden:
            values = self._with_hidden(values, device, grid, handle)
        for holder, pack, value in zip(state.holders, self._packers, values):
            holder.value = value if pack is None else pack(value)
        err = state.launch(config, function, state.params_address, 0)[0]
        if err != 0:
            self._retry(int(err), device, config, function, state.params_address)

    def prepare(self, grid, values: list, plan: LaunchPlan, stream=None) -> "PreparedLaunch":
        """A launch of these already-read values kept packed in holders of its own, to be
        repeated as is or with some parameters changed (`PreparedLaunch.holder`). The
        stream is fixed now: with None, the current torch stream (torch arguments) or the
        default stream."""
        device = plan.device if plan.device is not None else driver.current_device()
        if stream is None:
            if plan.torch_stream and self._torch_stream_fn is None:
                self._torch_stream_fn = _torch_stream_getter()
            handle = self._torch_stream_fn(device) if plan.torch_stream else 0
        else:
            handle = _stream_handle(stream)
        if self._select is not None:
            values = [values[i] for i in self._select]
        if self._hidden:
            values = self._with_hidden(values, device, grid, handle)
        return PreparedLaunch(self, self.function(device), device, grid, values, handle)

    def _with_hidden(self, values: list, device: Optional[int] = None, grid=None, stream: int = 0) -> list:
        """`values` followed by the hidden parameters' (a descriptor's global shape or
        strides, which its encoded tensor map carries)."""
        if self._workspace is not None:
            return [*values, *self._workspace_values(values, device, grid, stream)]
        if self._made:
            return [*values, *(self._made_tensor_map(values, i, dim) if field == made.FIELD
                               else getattr(values[i], field)[dim] for i, field, dim in self._hidden)]
        return [*values, *(getattr(values[i], field)[dim] for i, field, dim in self._hidden)]

    def _workspace_values(self, values: list, device: int, grid, stream: int) -> list:
        workspace = self._workspace.address(device, stream, grid)
        return [workspace if field == made.WORKSPACE_FIELD
                else self._workspace.template(dim, workspace) if field == made.TEMPLATE_FIELD
                else self._made_tensor_map(values, i, dim) if field == made.FIELD
                else getattr(values[i], field)[dim] for i, field, dim in self._hidden]

    def _made_tensor_map(self, values: list, base: int, recipe: str) -> bytes:
        lookup = dict(zip(self._passed_names, values)).__getitem__
        return made.encoded_tensor_map(values[base], recipe, self._made[base, recipe], lookup)

    def _retry(self, code: int, device: int, config, function, params_address) -> None:
        """A launch failed: if the wrong (or no) context was current, launch again in
        the device's primary context, then restore the caller's context."""
        if code not in _CONTEXT_ERRORS:
            driver.raise_launch_error(code, config)
        previous = driver.current_context()
        target = driver.primary_context(device)
        if previous is not None and int(previous) == int(target):
            driver.raise_launch_error(code, config)
        driver.set_current(device)
        try:
            driver.launch_prepared(config, function, params_address)
        finally:
            if previous is not None:
                driver.check(driver.cuda().cuCtxSetCurrent(previous), "cuCtxSetCurrent")


class PreparedLaunch:
    """One kernel launch with its arguments packed, its grid and stream set: calling it
    is one cuLaunchKernelEx. Its holders are its own, so a caller may rewrite a
    parameter between calls (`holder(name)`: a new output's address); never from two
    threads at once (the driver reads the holders while the GIL is released)."""

    __slots__ = ("launcher", "function", "device", "stream", "holders", "_pointers", "params_address",
                 "config", "_launch")

    def __init__(self, launcher: Launcher, function, device: int, grid, values: list, stream: int):
        self.launcher, self.function, self.device, self.stream = launcher, function, device, stream
        self.holders = arguments.make_holders(launcher.param_types)
        for holder, pack, value in zip(self.holders, launcher._packers, values):
            holder.value = value if pack is None else pack(value)
        self._pointers = (ctypes.c_void_p * max(1, len(self.holders)))(
            *[ctypes.addressof(h) for h in self.holders])
        self.params_address = ctypes.addressof(self._pointers) if self.holders else 0
        compiled = launcher.compiled
        self.config = driver.make_launch_config((compiled.num_threads, 1, 1), launcher.dynamic_shared,
                                                compiled.cluster)
        self.config.gridDimX, self.config.gridDimY, self.config.gridDimZ = \
            arguments.check_grid(launcher.name, grid, compiled.cluster)
        self.config.hStream = launcher._stream_object(stream)
        self._launch = driver.cuda().cuLaunchKernelEx

    def holder(self, name: str):
        """The ctypes holder of parameter `name` (pointer: c_uint64; descriptor: 128
        bytes), or None when the compiled kernel dropped that parameter."""
        try:
            return self.holders[self.launcher.param_names.index(name)]
        except ValueError:
            return None

    def packed(self) -> list[bytes]:
        """The bytes each parameter's holder passes (what the driver reads)."""
        return [ctypes.string_at(ctypes.addressof(h), ctypes.sizeof(h)) for h in self.holders]

    def __call__(self) -> None:
        err = self._launch(self.config, self.function, self.params_address, 0)[0]
        if err != 0:
            self.launcher._retry(int(err), self.device, self.config, self.function, self.params_address)


def _torch_stream_getter():
    """device -> torch's current raw stream handle on it."""
    torch = sys.modules["torch"]
    # The private getter returns the raw handle; current_stream(d).cuda_stream builds a
    # Stream object first, at every launch.
    getter = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return getter or (lambda device: torch.cuda.current_stream(device).cuda_stream)


def _stream_handle(stream) -> int:
    """An int CUstream handle from an int, a CUstream, or a torch/CuPy stream object."""
    if type(stream) is int:
        return stream
    handle = getattr(stream, "cuda_stream", None)  # torch.cuda.Stream
    if handle is None:
        handle = getattr(stream, "ptr", None)  # cupy.cuda.Stream
    if handle is None and hasattr(stream, "__int__") and not isinstance(stream, float):
        handle = int(stream)  # CUstream and other int-like handles
    if handle is None:
        raise LaunchError(f"cannot use {type(stream).__qualname__} as a CUDA stream; "
                          "pass an int handle, a CUstream, or a torch/CuPy stream")
    return int(handle)
