"""`weft.autotune`, `weft.Config` and `weft.heuristics`: Triton's autotuning surface, for
lowlevel and highlevel kernels alike (both launch through runtime/jit.py).

    @weft.autotune(configs=[weft.Config({"BLOCK": 256}, num_warps=4),
                            weft.Config({"BLOCK": 1024}, num_warps=8)], key=["n"])
    @ll.jit
    def add(x_ptr, y_ptr, out_ptr, n, BLOCK: ll.constexpr): ...

    add[lambda meta: (ll.cdiv(meta["n"], meta["BLOCK"]),)](x, y, out, n)

A launch reads the values of the `key` arguments (and the element types of the arrays, and
the constexprs given at the launch); the first launch with a new key times every config
and launches the fastest, later ones launch it directly. What happens on that first launch:

- `prune_configs_by={"early_config_prune": f, "perf_model": m, "top_k": k}` narrows the
  list first: `f(configs, args, **launch_kwargs)` returns the configs to keep;
  `m(**args, **config.all_kwargs())` estimates each one's time and the `k` fastest
  estimates stay (`k` an int, or a fraction of the list when a float <= 1).
- Each remaining config is timed by `do_bench(kernel_call, quantiles=(0.5, 0.2, 0.8))`:
  by default runtime/benchmark.py's, with CUDA events, `warmup` and `rep` milliseconds.
  `kernel_call.config` is the Config being timed. Arguments named by `reset_to_zero` are
  zeroed before every timed call and before the launch that follows them; those named by
  `restore_value` are put back as they were after every timed call, so the real launch
  sees the caller's values.
- A config that fails to compile (too much shared memory, a ptxas error, ...) is skipped
  and its error kept (`autotuner.failures`); when every config fails, one AutotuneError
  lists each config and why, at the line of the decorator.
- Timings are written to the disk cache (runtime/autotune_cache.py) per (kernel, key,
  device, toolchain) and per config: another process reads them instead of timing, and a
  config added to the list later is the only one timed.
- A line on stderr says what is being timed (a progress line on a terminal, a summary
  otherwise); WEFT_AUTOTUNE_QUIET=1 silences it.

On the CPU emulator (host arrays, or WEFT_EMULATE=1) nothing is timed, as emulated time
says nothing about the GPU: the first config left after pruning is launched, the same one
every time. Pass `do_bench` to time on the emulator anyway (tests do, with made-up times).

`weft.heuristics({"EVEN": lambda args: args["n"] % args["BLOCK"] == 0})` computes
constexprs from the other arguments at each launch; it goes between @autotune and @jit
(seeing the config's values) or above @autotune.
"""

from __future__ import annotations

import functools
import sys
import time
from typing import Any, Callable, Mapping, Optional, Sequence

from ..compiler import config as flags
from . import arguments, autotune_cache, benchmark
from .arguments import HOST, LaunchError
from .jit import OPTION_NAMES, JITFunction

_PRUNE_KEYS = ("perf_model", "top_k", "early_config_prune")
_QUANTILES = (0.5, 0.2, 0.8)


class AutotuneError(ValueError):
    """An @autotune or @heuristics decorator that cannot work as written, or a launch where
    no config compiled; the message starts at the decorator's line."""


class Config:
    """One candidate: constexpr values (`kwargs`) and launch options. `num_stages` is
    passed to the launch as an option (weft's pipelined kernels take stage counts as
    constexprs); `cluster=(x, y, z)` launches thread-block clusters, as `num_ctas` does in
    Triton. `pre_hook(args)` runs before each launch with this config."""

    def __init__(self, kwargs: Mapping[str, Any], num_warps: int = 4, num_stages: int = 3,
                 num_ctas: int = 1, maxnreg: Optional[int] = None, pre_hook: Optional[Callable] = None,
                 cluster: Optional[Sequence[int]] = None):
        if not isinstance(kwargs, Mapping):
            raise TypeError(f"Config takes a dict of constexpr values first, got {type(kwargs).__name__}; "
                            "write Config({'BLOCK': 128}, num_warps=4)")
        if num_ctas != 1:
            raise ValueError(f"Config(num_ctas={num_ctas}): weft launches thread-block clusters with "
                             f"cluster=(x, y, z); write Config(..., cluster=({num_ctas}, 1, 1))")
        self.kwargs = dict(kwargs)
        self.num_warps = num_warps
        self.num_stages = num_stages
        self.num_ctas = num_ctas
        self.maxnreg = maxnreg
        self.cluster = None if cluster is None else tuple(cluster)
        self.pre_hook = pre_hook

    def all_kwargs(self) -> dict:
        """The constexprs and launch options a launch with this config passes."""
        options = {"num_warps": self.num_warps, "num_stages": self.num_stages}
        if self.maxnreg is not None:
            options["maxnreg"] = self.maxnreg
        if self.cluster is not None:
            options["cluster"] = self.cluster
        return {**self.kwargs, **options}

    def _identity(self) -> tuple:
        return tuple(sorted(self.all_kwargs().items(), key=lambda item: item[0]))

    def __eq__(self, other) -> bool:
        return isinstance(other, Config) and self._identity() == other._identity()

    def __hash__(self) -> int:
        return hash(tuple((k, repr(v)) for k, v in self._identity()))

    def __str__(self) -> str:
        return ", ".join(f"{k}: {v}" for k, v in self.all_kwargs().items())

    def __repr__(self) -> str:
        return f"Config({self})"


def _caller() -> str:
    """file:line of the code that called the decorator factory (the decorator's line)."""
    frame = sys._getframe(2)
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


def _kernel_of(fn: Any, where: str, decorator: str) -> JITFunction:
    inner = fn
    while not isinstance(inner, JITFunction):
        inner = getattr(inner, "fn", None) if isinstance(inner, _KernelWrapper) else None
        if inner is None:
            raise AutotuneError(f"{where}: error: @{decorator} wraps a kernel, got "
                                f"{getattr(fn, '__name__', type(fn).__name__)!r}; put @jit "
                                f"(ll.jit or tl.jit) below @{decorator}")
    return inner


class _KernelWrapper:
    """What @autotune and @heuristics return: launched as `kernel[grid](...)`, like a
    JITFunction."""

    fn: Any
    kernel: JITFunction

    @property
    def arg_names(self) -> tuple:
        return self.kernel.arg_names

    @property
    def __name__(self) -> str:
        return self.kernel.__name__

    def __getitem__(self, grid) -> Callable:
        return functools.partial(self.run, grid)

    def __call__(self, *args, **kwargs):
        raise TypeError(f"kernel '{self.__name__}' is launched as {self.__name__}[grid](...), "
                        "not called directly")

    def _bind(self, args: tuple, kwargs: dict) -> dict:
        """Every kernel argument the launch gives or defaults, by name."""
        named = dict(self.kernel.defaults)
        named.update(zip(self.kernel.arg_names, args))
        named.update((k, v) for k, v in kwargs.items() if k in self.kernel.arg_names)
        return named

    def _check_names(self, names, what: str, allowed: Sequence[str], hint: str) -> None:
        for name in names:
            if name not in allowed:
                raise AutotuneError(
                    f"{self.where}: error: {what} names {name!r}, which is not "
                    f"{hint} of kernel '{self.kernel.__name__}' (those are: "
                    f"{', '.join(allowed) or 'none'})")


class Heuristics(_KernelWrapper):
    """`kernel` with constexprs computed at each launch (see `heuristics`)."""

    def __init__(self, fn: Any, values: Mapping[str, Callable[[dict], Any]], *, where: str = "<unknown>"):
        self.where = where
        self.fn = fn
        self.kernel = _kernel_of(fn, where, "heuristics")
        if not isinstance(values, Mapping):
            raise AutotuneError(f"{where}: error: @heuristics takes a dict of name -> function "
                                f"of the arguments, got {type(values).__name__}")
        self._check_names(values, "@heuristics", self.kernel.arg_names, "a parameter")
        self.values = dict(values)

    def run(self, grid, *args, **kwargs) -> None:
        for name, rule in self.values.items():
            kwargs[name] = rule({**self._bind(args, kwargs), **kwargs})
        return self.fn.run(grid, *args, **kwargs)


def heuristics(values: Mapping[str, Callable[[dict], Any]]) -> Callable[[Any], Heuristics]:
    """`@heuristics({name: fn(args)})`: each launch sets constexpr `name` to `fn(args)`,
    where `args` maps every argument name (given, defaulted, or set by a config or an
    earlier rule) to its value."""
    where = _caller()
    return lambda fn: Heuristics(fn, values, where=where)


def autotune(configs: Sequence[Config], key: Sequence[str], prune_configs_by: Optional[dict] = None,
             reset_to_zero: Optional[Sequence[str]] = None, restore_value: Optional[Sequence[str]] = None,
             warmup: float = 25, rep: float = 100, do_bench: Optional[Callable] = None) -> Callable[[Any], "Autotuner"]:
    """`@autotune(configs=[Config(...)], key=[...])` above `@jit`: see the module docstring."""
    where = _caller()
    return lambda fn: Autotuner(fn, configs, key, prune_configs_by, reset_to_zero, restore_value,
                                warmup, rep, do_bench, where=where)


class Autotuner(_KernelWrapper):
    """A kernel that picks its config per key; `cache` (key -> Config), `timings` (key ->
    {Config: ms quantiles}) and `failures` (key -> {Config: error}) show what it chose."""

    def __init__(self, fn: Any, configs: Sequence[Config], key: Sequence[str],
                 prune_configs_by: Optional[dict] = None, reset_to_zero: Optional[Sequence[str]] = None,
                 restore_value: Optional[Sequence[str]] = None, warmup: float = 25, rep: float = 100,
                 do_bench: Optional[Callable] = None, *, where: str = "<unknown>"):
        self.where = where
        self.fn = fn
        self.kernel = _kernel_of(fn, where, "autotune")
        self.configs = self._checked_configs(configs)
        self.keys = self._checked_names(key, "key", self.kernel.arg_names, "a parameter")
        self.tuned_names = frozenset(name for c in self.configs for name in c.all_kwargs())
        tuned_keys = [k for k in self.keys if k in self.tuned_names]
        if tuned_keys:
            raise AutotuneError(f"{where}: error: key names {tuned_keys}, which the configs set; "
                                "key names the arguments whose values select a config")
        self.reset_to_zero = self._checked_names(reset_to_zero or (), "reset_to_zero",
                                                 self.kernel.runtime_names, "a runtime (pointer) parameter")
        self.restore_value = self._checked_names(restore_value or (), "restore_value",
                                                 self.kernel.runtime_names, "a runtime (pointer) parameter")
        prune = dict(prune_configs_by or {})
        unknown = sorted(set(prune) - set(_PRUNE_KEYS))
        if unknown:
            raise AutotuneError(f"{where}: error: prune_configs_by has {unknown}; it takes "
                                f"{', '.join(_PRUNE_KEYS)}")
        self.perf_model = prune.get("perf_model")
        self.early_config_prune = prune.get("early_config_prune")
        self.top_k = prune.get("top_k", 1.0)
        if not (isinstance(self.top_k, int) and self.top_k >= 1) and \
                not (isinstance(self.top_k, float) and 0 < self.top_k <= 1):
            raise AutotuneError(f"{where}: error: prune_configs_by top_k={self.top_k!r}; use a count "
                                "(an int >= 1) or a fraction of the configs (a float in (0, 1])")
        self.warmup, self.rep, self.do_bench = warmup, rep, do_bench
        self.cache: dict = {}
        self.timings: dict = {}
        self.failures: dict = {}
        self.best_config: Optional[Config] = None

    def _checked_configs(self, configs) -> list:
        configs = list(configs or ())
        if not configs:
            raise AutotuneError(f"{self.where}: error: @autotune needs at least one Config")
        for config in configs:
            if not isinstance(config, Config):
                raise AutotuneError(f"{self.where}: error: configs must be weft.Config values, got "
                                    f"{type(config).__name__}; write Config({{'BLOCK': 128}}, num_warps=4)")
            for name in config.kwargs:
                if name in self.kernel.runtime_names:
                    raise AutotuneError(
                        f"{self.where}: error: {config!r} sets {name!r}, a runtime parameter of kernel "
                        f"'{self.kernel.__name__}'; configs set constexprs: annotate it "
                        f"`{name}: constexpr` or take it out of the Config")
            self._check_names(config.kwargs, f"{config!r}", self.kernel.constexpr_names,
                              "a constexpr parameter")
        return configs

    def _checked_names(self, names, what: str, allowed: Sequence[str], hint: str) -> tuple:
        if isinstance(names, str) or not all(isinstance(n, str) for n in names):
            raise AutotuneError(f"{self.where}: error: {what} must be a list of parameter names, "
                                f"got {names!r}; e.g. {what}=['n']")
        self._check_names(names, what, allowed, hint)
        return tuple(names)

    # ------------------------------------------------------------------ launching

    def run(self, grid, *args, **kwargs) -> None:
        """Launch with the config chosen for these arguments (timing the configs first when
        this key is new)."""
        conflicts = sorted(set(kwargs) & self.tuned_names)
        if conflicts:
            raise AutotuneError(f"{self.where}: error: kernel '{self.__name__}' got {conflicts} at the "
                                "launch, but @autotune's configs set them; take them out of the launch "
                                "(or out of the configs)")
        named = self._bind(args, kwargs)
        self._check_arguments(args, kwargs, named)
        if len(self.configs) == 1:
            config = self.configs[0]
        else:
            key, emulate = self._key(named)
            config = self.cache.get(key)
            if config is None:
                config = self.cache[key] = self._choose(key, emulate, grid, args, kwargs, named)
        self.best_config = config
        if config.pre_hook is not None:
            config.pre_hook({**named, **config.all_kwargs()})
        self.fn.run(grid, *args, **kwargs, **config.all_kwargs())

    def _check_arguments(self, args: tuple, kwargs: dict, named: dict) -> None:
        """The launch's mistakes, said before timing starts (inside a timed call they would
        read as every config failing)."""
        kernel = self.kernel
        if len(args) > len(kernel.arg_names):
            raise LaunchError(f"kernel '{self.__name__}' takes {len(kernel.arg_names)} arguments "
                              f"({', '.join(kernel.arg_names)}), got {len(args)}")
        unknown = [k for k in kwargs if k not in kernel.arg_names and k not in OPTION_NAMES + ("stream",)]
        if unknown:
            raise LaunchError(f"kernel '{self.__name__}' has no parameters {unknown}; its parameters "
                              f"are {', '.join(kernel.arg_names)}")
        missing = [n for n in kernel.runtime_names if n not in named]
        if missing:
            raise LaunchError(f"kernel '{self.__name__}' is missing arguments {missing}")

    def _key(self, named: dict) -> tuple[tuple, bool]:
        """(in-memory cache key, whether the launch runs on the emulator)."""
        missing = [k for k in self.keys if k not in named]
        if missing:
            raise LaunchError(f"kernel '{self.__name__}' launched without {missing}, which "
                              f"@autotune's key names ({self.where})")
        kinds, emulate = [], flags.emulate()
        for name in self.kernel.runtime_names:
            value = named.get(name)
            if value is None or isinstance(value, (bool, int, float)):
                continue
            try:
                _, signature, _, place = arguments.read(value)[0]
            except LaunchError:
                continue
            kinds.append((name, signature))
            emulate = emulate or place == HOST
        constexprs = tuple((n, _key_value(named[n])) for n in self.kernel.constexpr_names
                           if n in named and n not in self.tuned_names)
        values = tuple(_key_value(named[k]) for k in self.keys)
        return (values, tuple(kinds), constexprs, emulate), emulate

    def prune_configs(self, named: dict, extra: dict) -> list:
        """The configs left after `early_config_prune`, then `perf_model` and `top_k`."""
        configs = self.configs
        if self.early_config_prune is not None:
            configs = list(self.early_config_prune(configs, named, **extra))
            if not configs:
                raise AutotuneError(f"{self.where}: error: early_config_prune kept none of the "
                                    f"{len(self.configs)} configs of kernel '{self.__name__}'")
        if self.perf_model is not None:
            top_k = self.top_k if isinstance(self.top_k, int) else max(1, int(len(self.configs) * self.top_k))
            if len(configs) > top_k:
                estimates = {c: self.perf_model(**{**named, **extra, **c.all_kwargs()}) for c in configs}
                configs = sorted(configs, key=estimates.__getitem__)[:top_k]
        return configs

    def _choose(self, key: tuple, emulate: bool, grid, args: tuple, kwargs: dict, named: dict) -> Config:
        extra = {k: v for k, v in kwargs.items() if k not in named}
        configs = self.prune_configs(named, extra)
        if emulate and self.do_bench is None:
            return configs[0]  # nothing is timed on the emulator (see the module docstring)
        bench = self.do_bench or functools.partial(benchmark.do_bench, warmup=self.warmup, rep=self.rep)
        device = _device_name(emulate)
        disk_key = autotune_cache.entry_key({
            "kernel": self.kernel.fingerprint(), "compiler": _qualified(self.kernel.compile_fn),
            "name": self.__name__, "key": key, "device": device,
            "timing": "cuda-events" if self.do_bench is None else _qualified(self.do_bench)})
        known = autotune_cache.load(disk_key)
        ids = {config: autotune_cache.config_id(config.all_kwargs()) for config in configs}
        untimed = [config for config in configs if ids[config] not in known]
        progress = _Progress(self.__name__, key[0], total=len(configs), timing=len(untimed))
        fresh = self._time_all(untimed, bench, progress, grid, args, kwargs, named)
        autotune_cache.store(disk_key, {ids[c]: record for c, (record, cacheable) in fresh.items() if cacheable},
                             {"kernel": self.__name__, "key": key, "device": device})
        records = {config: fresh[config][0] if config in fresh else known[ids[config]] for config in configs}
        timings = {config: tuple(r["timing"]) for config, r in records.items() if "timing" in r}
        failures = {config: r["error"] for config, r in records.items() if "timing" not in r}
        self.timings[key], self.failures[key] = timings, failures
        if not timings:
            lines = "\n".join(f"  {c!r}: " + why.replace("\n", "\n    ") for c, why in failures.items())
            raise AutotuneError(f"{self.where}: error: no config of kernel '{self.__name__}' compiled "
                                f"for key {key[0]}:\n{lines}\n  suggestion: add configs with smaller "
                                "blocks, fewer stages or fewer warps, or fix the errors above")
        best = min(timings, key=lambda c: timings[c])
        progress.done(best, timings[best], failed=len(failures))
        if untimed:  # the timed runs wrote into these
            for name in self.reset_to_zero:
                benchmark.zero(named[name])
        return best

    def _time_all(self, configs: list, bench: Callable, progress: "_Progress", grid, args: tuple,
                  kwargs: dict, named: dict) -> dict:
        """Config -> (record, whether it may be cached) for each of `configs`, timed in turn;
        afterwards the arguments restore_value names hold the caller's values again."""
        if not configs:
            return {}
        snapshots = {name: benchmark.snapshot(named[name]) for name in self.restore_value}
        results = {}
        try:
            for index, config in enumerate(configs):
                progress.timing(index, config)
                results[config] = self._time(config, bench, grid, args, kwargs, named, snapshots)
        finally:
            for restore in snapshots.values():
                restore()
                getattr(restore, "release", lambda: None)()
        return results

    def _time(self, config: Config, bench: Callable, grid, args: tuple, kwargs: dict, named: dict,
              snapshots: dict) -> tuple[dict, bool]:
        """({"timing": [ms...]} or {"error": why}, whether the record may be cached)."""
        failures, deterministic = _config_failures()
        launch = {**kwargs, **config.all_kwargs()}
        full = {**named, **config.all_kwargs()}

        def kernel_call() -> None:
            if config.pre_hook is not None:
                config.pre_hook(full)
            for name in self.reset_to_zero:
                benchmark.zero(named[name])
            try:
                self.fn.run(grid, *args, **launch)
            finally:
                for restore in snapshots.values():
                    restore()
        kernel_call.config = config
        try:
            result = bench(kernel_call, quantiles=_QUANTILES)
        except failures as error:
            message = f"{type(error).__name__}: {error}"
            return {"error": message}, isinstance(error, deterministic)
        values = list(result) if isinstance(result, (list, tuple)) else [result]
        return {"timing": [float(v) for v in values]}, True


def _key_value(value: Any) -> Any:
    """A key argument as a hashable value: arrays by shape and element type."""
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return ("array", tuple(value.shape), str(value.dtype))
    try:
        hash(value)
        return value
    except TypeError:
        return repr(value)


def _qualified(function: Any) -> str:
    return f"{getattr(function, '__module__', '')}.{getattr(function, '__qualname__', type(function).__qualname__)}"


def _device_name(emulate: bool) -> str:
    if emulate:
        return "emulator"
    from . import driver

    properties = driver.device_properties(driver.current_device())
    return f"{properties.name} sm_{properties.compute_capability[0]}{properties.compute_capability[1]}"


def _config_failures() -> tuple[tuple, tuple]:
    """(errors that make a config fail rather than the launch, those of them that the
    same toolchain would raise again and so may be cached)."""
    from ..compiler.cuda_tools import PtxasError
    from ..compiler.errors import CompilationError
    from .driver import DriverError
    from .emulator.errors import EmulationError

    return (CompilationError, PtxasError, DriverError, LaunchError, EmulationError), \
        (CompilationError, PtxasError)


class _Progress:
    """The stderr line while timing: rewritten in place on a terminal, one summary line
    otherwise; nothing with WEFT_AUTOTUNE_QUIET=1."""

    def __init__(self, kernel: str, key: tuple, total: int, timing: int):
        self.quiet = flags.current().autotune_quiet
        self.terminal = sys.stderr.isatty()
        self.prefix = f"weft.autotune: {kernel} key={key}"
        self.total, self.count = total, timing
        self.started = time.perf_counter()

    def timing(self, index: int, config: Config) -> None:
        if not self.quiet and self.terminal:
            sys.stderr.write(f"\r\x1b[K{self.prefix} timing config {index + 1}/{self.count} ({config})")
            sys.stderr.flush()

    def done(self, best: Config, timing: tuple, failed: int) -> None:
        if self.quiet:
            return
        seconds = time.perf_counter() - self.started
        line = (f"{self.prefix}: best ({best}) {timing[0]:.4g} ms; of {self.total} configs {self.count} "
                f"timed in {seconds:.1f} s, {self.total - self.count} from the cache, {failed} failed")
        sys.stderr.write(("\r\x1b[K" if self.terminal else "") + line + "\n")
        sys.stderr.flush()
