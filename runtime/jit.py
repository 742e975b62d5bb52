"""The kernel dispatcher: what `@lowlevel.jit` returns.

`kernel[grid](*args, num_warps=4, **constexprs)` reads the arguments, looks their key up
in an in-memory table, and launches; only an unseen key compiles (through the injected
`compile_fn`, via the disk cache) or routes to the CPU emulator (the injected
`emulate_fn`).

Injected callables (the compiler and emulator are wired in by whoever builds the
JITFunction, never imported here):

    compile_fn(jit: JITFunction, signature: dict[str, str], constexprs: dict[str, object],
               specialization: dict[str, str], options: dict) -> CompiledKernel

        `signature` maps each runtime parameter to "*fp32", "i32", ...; `specialization`
        maps it to "equal_to_1", "divisible_by_16" or ""; `options` holds num_warps,
        target ("sm_90a", or "emulator" when the result goes to emulate_fn) and any extra
        launch options given at the call (num_stages, maxnreg, cluster, ...).
        For target "emulator" it may return whatever emulate_fn takes (e.g. the
        `layout`-stage IR); such results are kept in memory only.

    emulate_fn(compiled_or_ir, grid: tuple[int, int, int], args: tuple) -> None

        `args` are the caller's runtime arguments (constexprs removed) in parameter
        order, unconverted: numpy arrays, torch tensors, ints, ... Outputs are written
        in place.
"""

from __future__ import annotations

import functools
import inspect
import logging
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from ..compiler import config
from ..compiler.compiled import CompiledKernel
from ..compiler.frontend_expr import record_resolved_globals
from . import arguments, cache, dependencies
from . import made_tensor_descriptor as made
from .arguments import HOST, LaunchError
from .launcher import LaunchPlan, Launcher, PreparedLaunch

_log = logging.getLogger("weft.jit")

DEFAULT_TARGET = "sm_90a"
EMULATOR_TARGET = "emulator"
# Keywords of a launch that are options, not kernel parameters.
OPTION_NAMES = ("num_warps", "num_stages", "maxnreg", "cluster", "target", "issue_dots_early", "dot_ahead",
                "sink_waits", "fit_rings", "hoist_slot_loads", "pingpong", "block_pointer_tma", "pointer_tma")
# Options a kernel may also take as a parameter (Triton's softmax tutorial passes
# `num_stages` to its kernel): `num_stages=` at a launch sets both.
PARAMETER_OPTIONS = ("num_stages",)
_RESERVED = tuple(n for n in OPTION_NAMES if n not in PARAMETER_OPTIONS) + ("stream", "grid")
_MISSING = object()


class constexpr:
    """Marks a kernel parameter as compile-time (`BLOCK: constexpr`): each distinct value
    compiles its own kernel. Calling it wraps a value, which kernels unwrap."""

    def __init__(self, value: Any):
        self.value = value.value if isinstance(value, constexpr) else value

    def __repr__(self) -> str:
        return f"constexpr({self.value!r})"

    def __eq__(self, other) -> bool:
        return isinstance(other, constexpr) and type(self.value) is type(other.value) \
            and self.value == other.value

    def __hash__(self) -> int:
        return hash((constexpr, self.value))


def _is_constexpr_annotation(annotation) -> bool:
    if annotation is constexpr:
        return True
    if isinstance(annotation, type):
        return annotation.__name__ == "constexpr"
    if isinstance(annotation, str):  # `from __future__ import annotations`
        return annotation.replace(" ", "").rsplit(".", 1)[-1] == "constexpr"
    return False


@dataclass(frozen=True)
class _GpuEntry:
    launcher: Launcher
    plan: LaunchPlan
    staged: tuple = ()  # the recipes of its pointer loads' tensor maps (made.staged_pointer_recipes)


@dataclass(frozen=True)
class _EmulatorEntry:
    kernel: Any  # what compile_fn returned for the emulator target
    staged: tuple = ()


class JITFunction:
    """A Python kernel function plus its compiled variants, launched as `fn[grid](...)`."""

    def __init__(self, fn: Callable, compile_fn: Optional[Callable] = None,
                 emulate_fn: Optional[Callable] = None, *,
                 constexpr_names: Sequence[str] = ()):
        self.fn = fn
        self.compile_fn = compile_fn
        self.emulate_fn = emulate_fn
        functools.update_wrapper(self, fn)
        # A constexpr parameter named num_warps (Gluon's spelling) is the launch option
        # itself: the frontend binds it, so launches pass it only as the option.
        parameters = {n: p for n, p in inspect.signature(fn).parameters.items()
                      if not (n == "num_warps" and _is_constexpr_annotation(p.annotation))}
        for name, p in parameters.items():
            if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
                raise TypeError(f"kernel '{fn.__name__}': parameter '{name}' must be a plain "
                                "positional parameter (no *args, **kwargs or keyword-only)")
            if name in _RESERVED:
                raise TypeError(f"kernel '{fn.__name__}': parameter name '{name}' is "
                                f"reserved for launch options ({', '.join(_RESERVED)})")
        unknown = set(constexpr_names) - set(parameters)
        if unknown:
            raise TypeError(f"kernel '{fn.__name__}' has no parameters {sorted(unknown)}")
        self.arg_names = tuple(parameters)
        self._parameter_options = frozenset(PARAMETER_OPTIONS) & frozenset(parameters)
        self.constexpr_names = tuple(
            n for n, p in parameters.items()
            if n in constexpr_names or _is_constexpr_annotation(p.annotation))
        self.runtime_names = tuple(n for n in self.arg_names if n not in self.constexpr_names)
        self.defaults = {n: p.default for n, p in parameters.items()
                         if p.default is not inspect.Parameter.empty}
        self._index = {n: i for i, n in enumerate(self.arg_names)}
        self._constexpr_idx = tuple(self._index[n] for n in self.constexpr_names)
        self._runtime_idx = tuple(self._index[n] for n in self.runtime_names)
        # The common call passes runtime arguments positionally and constexprs by
        # keyword; when the runtime parameters come first, `run` binds that without
        # building the full argument list.
        self._runtime_first = self._runtime_idx == tuple(range(len(self.runtime_names)))
        self._constexpr_keys = frozenset(self.constexpr_names)
        self._constexpr_defaults = tuple((n, self.defaults.get(n, _MISSING))
                                         for n in self.constexpr_names)
        self._dispatch: dict[tuple, object] = {}
        self._fallbacks: dict[tuple, object] = {}  # pointer_tma=False variants (_without_pointer_tma)
        self._bound: dict = {}  # grid -> bound launcher (see __getitem__)
        self._compiled: dict[tuple, Any] = {}
        self._launchers: dict[int, Launcher] = {}  # id(compiled) -> its launcher
        self._lock = threading.RLock()
        self._source: Optional[str] = None

    def __repr__(self) -> str:
        return f"JITFunction({self.fn.__module__}.{self.fn.__qualname__})"

    def __call__(self, *args, **kwargs):
        raise TypeError(f"kernel '{self.__name__}' is launched as "
                        f"{self.__name__}[grid](...), not called directly")

    # ------------------------------------------------------------------ sources

    @property
    def source(self) -> str:
        """The kernel's Python source (what the frontend parses and the cache keys on)."""
        if self._source is None:
            try:
                self._source = inspect.getsource(self.fn)
            except (OSError, TypeError):  # defined in a REPL: fall back to the bytecode
                code = self.fn.__code__
                self._source = f"<bytecode {code.co_code.hex()} {code.co_consts!r}>"
        return self._source

    def fingerprint(self) -> str:
        """The kernel function's own part of its disk-cache key: its bytecode (comments
        and blank lines do not count), defaults, annotations and closure values. What it
        reads from globals is recorded while it compiles (runtime/dependencies.py)."""
        return dependencies.fingerprint(self.fn)

    def _namespaces(self, constexprs: dict) -> dict:
        """Module name -> namespace, for resolving recorded dependencies as this kernel
        sees them: its module's globals, and those of functions it holds or is given."""
        known: dict = {}
        dependencies.learn_namespaces(self.fn, known)
        for cell in self.fn.__closure__ or ():
            try:
                dependencies.learn_namespaces(cell.cell_contents, known)
            except ValueError:  # an empty cell
                pass
        for value in constexprs.values():
            dependencies.learn_namespaces(value, known)
        return known

    # ------------------------------------------------------------------ compiling

    def compile(self, signature, constexprs: Optional[dict] = None, num_warps: int = 4,
                target: str = DEFAULT_TARGET, specialization: Optional[dict] = None,
                **options) -> Any:
        """Compile for `signature` (dict name -> "*fp32"/"i32"/..., or a tuple in
        runtime-parameter order); consults memory, then the disk cache. Returns the
        CompiledKernel (for target "emulator", whatever compile_fn returns)."""
        if not isinstance(signature, dict):
            signature = tuple(signature)
            if len(signature) != len(self.runtime_names):
                raise LaunchError(
                    f"kernel '{self.__name__}' has {len(self.runtime_names)} runtime "
                    f"parameters ({', '.join(self.runtime_names)}), signature has "
                    f"{len(signature)} entries")
            signature = dict(zip(self.runtime_names, signature))
        missing = [n for n in self.runtime_names if n not in signature]
        extra = [n for n in signature if n not in self.runtime_names]
        if missing or extra:
            raise LaunchError(f"signature of kernel '{self.__name__}' must name exactly "
                              f"{list(self.runtime_names)}; missing {missing}, "
                              f"unexpected {extra}")
        signature = {n: self._canonical_type(n, t) for n, t in signature.items()}
        constexprs = self._complete_constexprs(dict(constexprs or {}))
        specialization = {n: (specialization or {}).get(n, "") for n in self.runtime_names}
        options = {"num_warps": int(num_warps), **options, "target": target}
        return self._compile(signature, constexprs, specialization, options)

    def _canonical_type(self, name: str, text) -> str:
        """Descriptor types spelled as launched descriptors spell them, so a kernel
        compiled ahead of time accepts them ("tensordesc<bf16[128,64]>" ->
        "tensordesc<bf16[128,64],swizzle=128>"); other types as given."""
        if not isinstance(text, str) or not arguments.is_descriptor_type(text.strip()):
            return text
        try:
            return arguments.canonical_descriptor_type(text)
        except ValueError as error:
            raise LaunchError(f"kernel '{self.__name__}': signature of '{name}': "
                              f"{error}") from None

    def _complete_constexprs(self, given: dict) -> dict:
        extra = [n for n in given if n not in self.constexpr_names]
        if extra:
            raise LaunchError(f"kernel '{self.__name__}' has no constexpr parameters "
                              f"{extra}; its constexprs are {list(self.constexpr_names)}")
        result = {}
        for name in self.constexpr_names:
            value = given.get(name, self.defaults.get(name, _MISSING))
            if value is _MISSING:
                raise LaunchError(f"kernel '{self.__name__}' needs a value for constexpr "
                                  f"'{name}'")
            result[name] = value.value if isinstance(value, constexpr) else value
        return result

    def _compile(self, signature: dict, constexprs: dict, specialization: dict,
                 options: dict) -> Any:
        memory_key = (tuple(signature.items()),
                      tuple((n, type(v), _hashable(v)) for n, v in constexprs.items()),
                      tuple(specialization.items()), tuple(sorted(options.items(), key=repr)))
        compiled = self._compiled.get(memory_key)
        if compiled is not None:
            return compiled
        with self._lock:
            compiled = self._compiled.get(memory_key)
            if compiled is None:
                compiled = self._compile_uncached(signature, constexprs, specialization,
                                                  options)
                self._compiled[memory_key] = compiled
        return compiled

    def _compile_uncached(self, signature, constexprs, specialization, options):
        if self.compile_fn is None:
            raise LaunchError(f"kernel '{self.__name__}' has no compiler: build the "
                              "JITFunction with compile_fn (the frontend's @jit does)")
        target = options["target"]
        settings = config.current()
        use_disk = settings.cache_enabled and target != EMULATOR_TARGET
        key = None
        if use_disk:
            # The compiler's name is keyed too: the same source may go through different
            # pipelines (highlevel vs lowlevel) and must not share entries.
            compiler = getattr(self.compile_fn, "__qualname__", type(self.compile_fn).__qualname__)
            extra = {k: v for k, v in options.items() if k not in ("num_warps", "target")}
            key = cache.make_key(
                self.fingerprint(), constexprs, specialization, options["num_warps"],
                {**extra, "compiler": f"{getattr(self.compile_fn, '__module__', '')}.{compiler}"},
                target, signature=signature)
            namespaces = self._namespaces(constexprs)
            hit = cache.get(key, settings.cache_dir,
                            accept=lambda recorded: dependencies.all_match(recorded, namespaces))
            if hit is not None:
                _dump_cached(settings, hit)
                return hit
        with record_resolved_globals() as resolved:
            compiled = self.compile_fn(self, dict(signature), dict(constexprs),
                                       dict(specialization), dict(options))
        if use_disk and isinstance(compiled, CompiledKernel):
            try:
                cache.put(key, compiled, settings.cache_dir, dependencies.describe(resolved),
                          settings.cache_max_bytes)
            except (cache.CacheError, OSError) as exc:  # caching is best effort
                _log.warning("weft: not caching kernel '%s': %s", self.__name__, exc)
        return compiled

    def launcher(self, compiled: CompiledKernel) -> Launcher:
        """The (one) Launcher of a compiled variant, taking runtime arguments in order."""
        launcher = self._launchers.get(id(compiled))
        if launcher is None or launcher.compiled is not compiled:
            launcher = Launcher(compiled, arg_names=self.runtime_names)
            self._launchers[id(compiled)] = launcher
        return launcher

    # ------------------------------------------------------------------ launching

    def __getitem__(self, grid) -> Callable:
        """`fn[grid]`: grid is 1-3 ints or a callable meta -> grid, where meta maps every
        argument name (runtime and constexpr) and num_warps to its value."""
        # One bound launcher per grid: `kernel[(n,)](...)` in a hot loop then costs a dict
        # lookup, not a new partial object per call.
        try:
            return self._bound[grid]
        except KeyError:
            bound = self._bound[grid] = functools.partial(self.run, grid)
            if len(self._bound) > 256:  # grids that change every call: keep memory bounded
                self._bound.clear()
            return bound
        except TypeError:  # an unhashable grid (a list, or a callable that is not hashable)
            return functools.partial(self.run, grid)

    def run(self, grid, *args, **kwargs) -> None:
        """Launch with `grid`; kwargs are kernel arguments by name plus launch options
        (num_warps, num_stages, maxnreg, cluster, target) and `stream`."""
        stream = None
        options = ()
        num_warps = 4
        if kwargs:
            stream = kwargs.pop("stream", None)
            num_warps = kwargs.pop("num_warps", 4)
            if not kwargs.keys().isdisjoint(OPTION_NAMES):
                options = self._options(kwargs)
        if kwargs and self._runtime_first and len(args) == len(self.runtime_names) and \
                kwargs.keys() <= self._constexpr_keys:
            runtime = args
            cx = tuple([kwargs.get(n, d) for n, d in self._constexpr_defaults])
            if len(kwargs) < len(cx) and any(v is _MISSING for v in cx):
                self._bind(args, kwargs)  # raises the missing-argument error
        else:
            if kwargs or len(args) != len(self.arg_names):
                bound = self._bind(args, kwargs)
            else:
                bound = args
            if self._constexpr_idx:
                cx = tuple([bound[i] for i in self._constexpr_idx])
                runtime = [bound[i] for i in self._runtime_idx]
            else:
                cx, runtime = (), bound
        keys, values = arguments.read_all(runtime)
        emulate = config.emulate()
        key = (keys, cx, tuple(map(type, cx)), num_warps, options, emulate)
        try:
            entry = self._dispatch.get(key)
        except TypeError:  # an unhashable constexpr value: no fast path, but it works
            entry = None
        if entry is None:
            entry = self._resolve(keys, cx, num_warps, options, emulate)
            try:
                self._dispatch[key] = entry
            except TypeError:
                pass
        entry = self._taken_by_tma(entry, runtime, keys, cx, num_warps, options, emulate)
        if callable(grid):
            meta = dict(zip(self.runtime_names, runtime))
            meta.update(zip(self.constexpr_names, cx))
            meta["num_warps"] = num_warps
            grid = grid(meta)
        if type(entry) is _GpuEntry:
            entry.launcher.launch_values(grid, values, entry.plan, stream)
        else:
            self._emulate(entry, grid, tuple(runtime))

    def prepare(self, grid, *args, **kwargs) -> Optional[PreparedLaunch]:
        """The launch `fn[grid](*args, **kwargs)` would make, packed and ready to repeat
        (runtime/launcher.py PreparedLaunch), without launching; None when it would
        run on the CPU emulator. `grid` is 1-3 ints; `stream=` fixes the stream (default:
        the current torch stream for torch arguments)."""
        kwargs = dict(kwargs)
        stream = kwargs.pop("stream", None)
        found = self._gpu_entry(args, kwargs)
        if found is None:
            return None
        entry, values = found
        return entry.launcher.prepare(grid, values, entry.plan, stream)

    def resident_ctas(self, *args, **kwargs) -> int:
        """How many CTAs of this kernel, compiled for these arguments (as a launch would
        take them), one SM holds at once: the driver's occupancy answer, for sizing a
        persistent grid. Compiles without launching; 1 when the launch would emulate."""
        found = self._gpu_launcher(args, kwargs)
        return 1 if found is None else found[0].resident_ctas(found[1])

    def resident_clusters(self, *args, **kwargs) -> int:
        """How many clusters of this kernel (launched with these arguments and `cluster=`)
        the whole device holds at once: a persistent grid of clusters must not be larger,
        or the clusters beyond it wait for others to finish. 1 when the launch would emulate."""
        found = self._gpu_launcher(args, kwargs)
        return 1 if found is None else found[0].resident_clusters(found[1])

    def _gpu_launcher(self, args: tuple, kwargs: dict):
        """(launcher, device) of the variant these launch arguments compile to; None when
        the launch would emulate."""
        kwargs = dict(kwargs)
        kwargs.pop("stream", None)
        found = self._gpu_entry(args, kwargs)
        if found is None:
            return None
        entry = found[0]
        device = entry.plan.device
        if device is None:
            from . import driver

            device = driver.current_device()
        return entry.launcher, device

    def _gpu_entry(self, args: tuple, kwargs: dict):
        """(GPU dispatch entry, read argument values) for launch arguments (no stream);
        None when the launch would emulate."""
        num_warps = kwargs.pop("num_warps", 4)
        options = self._options(kwargs)
        bound = self._bind(args, kwargs)
        cx = tuple(bound[i] for i in self._constexpr_idx)
        runtime = [bound[i] for i in self._runtime_idx]
        keys, values = arguments.read_all(runtime)
        emulate = config.emulate()
        entry = self._resolve(keys, cx, num_warps, options, emulate)
        entry = self._taken_by_tma(entry, runtime, keys, cx, num_warps, options, emulate)
        return (entry, values) if type(entry) is _GpuEntry else None

    def _options(self, kwargs: dict) -> tuple:
        """The launch options among `kwargs`, taken out of it, except those that are also
        kernel parameters: they stay, to be bound as arguments too."""
        return tuple((k, kwargs[k] if k in self._parameter_options else kwargs.pop(k))
                     for k in OPTION_NAMES if k in kwargs)

    def _bind(self, args: Sequence, kwargs: dict) -> list:
        names = self.arg_names
        if len(args) > len(names):
            raise LaunchError(f"kernel '{self.__name__}' takes {len(names)} arguments "
                              f"({', '.join(names)}), got {len(args)}")
        bound = list(args) + [_MISSING] * (len(names) - len(args))
        for name, value in kwargs.items():
            i = self._index.get(name)
            if i is None:
                raise LaunchError(f"kernel '{self.__name__}' has no parameter '{name}'; "
                                  f"its parameters are {', '.join(names)}")
            if bound[i] is not _MISSING:
                raise LaunchError(f"kernel '{self.__name__}' got two values for '{name}'")
            bound[i] = value
        for i, value in enumerate(bound):
            if value is _MISSING:
                bound[i] = self.defaults.get(names[i], _MISSING)
        missing = [n for n, v in zip(names, bound) if v is _MISSING]
        if missing:
            raise LaunchError(f"kernel '{self.__name__}' is missing argument"
                              f"{'s' if len(missing) > 1 else ''} "
                              f"{', '.join(repr(m) for m in missing)}")
        return bound

    def _resolve(self, keys: tuple, cx: tuple, num_warps: int, options: tuple,
                 emulate: bool):
        """Slow path for an unseen argument key: pick GPU or emulator, compile, check."""
        host = [n for n, k in zip(self.runtime_names, keys) if k[3] == HOST]
        device = [n for n, k in zip(self.runtime_names, keys)
                  if k[3] is not None and k[3] != HOST]
        if host and device and not emulate:
            raise LaunchError(
                f"kernel '{self.__name__}' got host arrays ({', '.join(host)}) and device "
                f"arrays ({', '.join(device)}); pass all arrays on the GPU, or all on the "
                "host to run on the CPU emulator")
        emulate = emulate or bool(host)
        constexprs = self._complete_constexprs(dict(zip(self.constexpr_names, cx)))
        signature = {n: k[1] for n, k in zip(self.runtime_names, keys)}
        specialization = {n: arguments.specialization_names(k[2])
                          for n, k in zip(self.runtime_names, keys)}
        opts = {"num_warps": int(num_warps), **dict(options)}
        if emulate:
            opts["target"] = EMULATOR_TARGET
            kernel = self._compile(signature, constexprs, specialization, opts)
            return _EmulatorEntry(kernel, made.staged_pointer_recipes(kernel))
        opts.setdefault("target", DEFAULT_TARGET)
        compiled = self._compile(signature, constexprs, specialization, opts)
        launcher = self.launcher(compiled)
        return _GpuEntry(launcher, launcher.plan(keys), made.staged_pointer_recipes(compiled))

    def _taken_by_tma(self, entry, runtime, keys: tuple, cx: tuple, num_warps: int, options: tuple, emulate: bool):
        """`entry`, or its pointer_tma=False variant where these arguments give one of its
        staged pointer loads' tensor maps a stride TMA cannot take."""
        if entry.staged and not made.tma_takes(entry.staged, dict(zip(self.runtime_names, runtime)).__getitem__):
            return self._without_pointer_tma(keys, cx, num_warps, options, emulate)
        return entry

    def _without_pointer_tma(self, keys: tuple, cx: tuple, num_warps: int, options: tuple, emulate: bool):
        """The variant compiled with pointer_tma=False, for a launch whose arguments give a
        staged pointer load's tensor map a stride TMA cannot take (made.tma_takes): the
        pointer loads then read as they are written, by cp.async."""
        options = tuple(option for option in options if option[0] != "pointer_tma") + (("pointer_tma", False),)
        key = (keys, cx, num_warps, options, emulate)
        try:
            entry = self._fallbacks.get(key)
        except TypeError:  # an unhashable constexpr value: resolved each time (_compile caches)
            return self._resolve(keys, cx, num_warps, options, emulate)
        if entry is None:
            entry = self._fallbacks[key] = self._resolve(keys, cx, num_warps, options, emulate)
        return entry

    def _emulate(self, entry: _EmulatorEntry, grid, args: tuple) -> None:
        if self.emulate_fn is None:
            raise LaunchError(
                f"kernel '{self.__name__}' must run on the CPU emulator (host arrays or "
                "WEFT_EMULATE=1), but this JITFunction has no emulate_fn; pass device "
                "arrays for a GPU launch, or build it with emulate_fn")
        grid3 = arguments.check_grid(self.__name__, grid, getattr(entry.kernel, "cluster", None))
        self.emulate_fn(entry.kernel, grid3, args)


def _dump_cached(settings, compiled: CompiledKernel) -> None:
    """WEFT_DUMP for a kernel read from the disk cache: the kept stages it asks for; the
    passes ran when the kernel was first compiled, so asking for one says how to see it."""
    if not settings.dump:
        return
    from ..compiler.pipeline import STAGES  # the stages a CompiledKernel keeps, in order

    for name in STAGES:
        if name in compiled.asm and settings.should_dump(name):
            text = compiled.asm[name]
            print(f"// ----- weft dump: {name} ----- (from the disk cache)", file=sys.stderr)
            print(text if isinstance(text, str) else f"<{len(text)} bytes>", file=sys.stderr)
    for name in sorted(settings.dump - set(STAGES) - {"all"}):
        print(f"// ----- weft dump: {name} -----\n(kernel '{compiled.name}' came from the disk "
              "cache, which keeps stages, not passes; WEFT_NO_CACHE=1 recompiles it)", file=sys.stderr)


def _hashable(value: Any) -> Any:
    try:
        hash(value)
        return value
    except TypeError:
        return repr(value)


def jit(fn: Optional[Callable] = None, *, compile_fn: Optional[Callable] = None,
        emulate_fn: Optional[Callable] = None, constexpr_names: Sequence[str] = ()):
    """`@jit` or `@jit(compile_fn=..., emulate_fn=...)`: wrap a kernel function."""
    def wrap(f: Callable) -> JITFunction:
        return JITFunction(f, compile_fn, emulate_fn, constexpr_names=constexpr_names)
    return wrap(fn) if fn is not None else wrap
