"""What the frontend and a language's ops share while one kernel is being built.

- `Builder`: the op lists being filled (one per open region), the location of the user's
  expression being evaluated, and the kernel's launch facts. Ops reach it through
  `current_builder()`, so their Python signatures stay the ones users see.
- `builtin`: marks a function (or method) as an op the frontend may call inside a kernel.
- `constexpr_function`: marks a plain Python function the frontend may call at compile
  time, on compile-time values only.
- `DynamicValue`: base of the objects a language hands to user code for IR values
  (tensors, shared-memory buffers); the frontend only needs their `handle`.
- `static_range` / `dynamic_range`: the iterables the frontend unrolls or turns into
  `ir.For`.

Languages register how to wrap an `ir.Value` (`register_language`); the compiler never
imports a language (docs/design.md, compiler/).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from typing import Any, Callable, Iterator, Optional

from . import ir
from .errors import CompilationError, Loc, UNKNOWN_LOC
from .types import Type

_CURRENT: contextvars.ContextVar[Optional["Builder"]] = contextvars.ContextVar(
    "weft_builder", default=None)


class DynamicValue:
    """A value known only when the kernel runs: an IR value plus its language's methods."""

    __slots__ = ("handle",)

    def __init__(self, handle: ir.Value):
        self.handle = handle

    @property
    def type(self) -> Type:
        return self.handle.type

    def __bool__(self):
        raise CompilationError(
            "a tensor has no truth value at compile time",
            current_builder().loc if current_builder() else None,
            suggestion="use `if` on a scalar, ll.where(cond, a, b) elementwise, and & | ~ "
                       "instead of and / or / not")


_LANGUAGES: dict[str, Callable[[ir.Value], DynamicValue]] = {}
_STAGES: dict[str, str] = {}
_PREFIXES: dict[str, str] = {}


def register_language(name: str, wrap: Callable[[ir.Value], DynamicValue], *,
                      stage: str = "layout", prefix: str = "ll") -> None:
    """Tell the frontend how language `name` presents IR values to user code.

    `stage` is the stage its kernels enter at (`tile` when tensors start without layouts);
    `prefix` is how kernels conventionally import it (`ll`, `tl`), so the frontend's
    suggestions name ops as the user writes them. (Layouts are no part of a language: the
    inference passes describe the layouts they choose with layouts/'s classes.)
    """
    _LANGUAGES[name] = wrap
    _STAGES[name] = stage
    _PREFIXES[name] = prefix


def language_wrapper(name: str) -> Callable[[ir.Value], DynamicValue]:
    if name not in _LANGUAGES:
        raise ValueError(f"no language {name!r} is registered (import weft.{name} first); "
                         f"registered: {sorted(_LANGUAGES)}")
    return _LANGUAGES[name]


def language_stage(name: str) -> str:
    """The stage kernels of language `name` enter at."""
    language_wrapper(name)
    return _STAGES[name]


def language_prefix(name: str) -> str:
    """How kernels of language `name` spell its ops in suggestions (`ll`, `tl`)."""
    language_wrapper(name)
    return _PREFIXES[name]


class Builder:
    """Collects ops into nested blocks and knows where in the user's source we are."""

    def __init__(self, num_warps: int, wrap: Callable[[ir.Value], DynamicValue], prefix: str = "ll"):
        self.num_warps = num_warps
        self.loc: Loc = UNKNOWN_LOC
        self.wrap = wrap
        self.prefix = prefix  # the language's import alias, for suggestions (`tl.device_print`)
        self.max_registers: Optional[int] = None  # the launch option maxnreg, where given
        self._blocks: list[list[ir.Op]] = [[]]
        # Set by the frontend: inline_function(fn, args, kwargs) walks a @jit function into
        # the current block and returns its result (ops that take functions, such as
        # warp_specialize, build their regions with it).
        self.inline_function: Optional[Callable[[Any, list, dict], Any]] = None
        # Tensors uniform over each warp (WarpAny results): what `if` may branch on per warp.
        self.warp_uniform: set[ir.Value] = set()
        # The kernel's runtime parameters by name (set by the frontend), and the hidden ones
        # made so far for reads of a descriptor's run-time fields (`hidden_param`).
        self.kernel_params: dict[str, ir.Value] = {}
        self.hidden_params: dict[tuple[str, str, int], ir.Value] = {}
        # Block pointers whose loads may go by TMA (highlevel/block_pointer.py): where each
        # one's tensor map is made, and the loads built both ways for stage_block_pointers.
        self.block_pointer_maps: dict[tuple, Any] = {}
        self.block_pointer_loads: list = []
        # Nonzero while the frontend walks a loop body into a discarded block to find its
        # carried values: ops placed outside the current block then would outlive the walk.
        self.probing = 0

    def hidden_param(self, descriptor: ir.Value, field: str, dim: int, type_: Type) -> ir.Value:
        """The scalar parameter holding `field[dim]` (a global shape or stride) of the
        descriptor parameter `descriptor`, made on first use. A descriptor value inside a
        warp_specialize partition is a copy of the parameter under the same name."""
        name = descriptor.hint
        if name is None or self.kernel_params.get(name) is None or \
                self.kernel_params[name].type != descriptor.type:
            raise self.error(f"`.{field}` of a tensor descriptor needs the kernel's own descriptor "
                             f"parameter, found {descriptor!r}")
        key = (name, field, dim)
        if key not in self.hidden_params:
            self.hidden_params[key] = ir.Value(type_, f"{name}.{field}[{dim}]")
        return self.hidden_params[key]

    # ------------------------------------------------------------------ emission
    def emit(self, op: ir.Op) -> ir.Op:
        self._blocks[-1].append(op)
        return op

    def create(self, op_class: type, result_type: Type, **fields) -> ir.Value:
        """Emit `op_class(result=<new value>, **fields)` at the current location."""
        result = ir.Value(result_type)
        self.emit(op_class(result=result, loc=self.loc, **fields))
        return result

    def push_block(self, ops: Optional[list] = None) -> list:
        """Start filling `ops` (a new list when None); `pop_block` returns to the outer one."""
        ops = [] if ops is None else ops
        self._blocks.append(ops)
        return ops

    def pop_block(self) -> list:
        if len(self._blocks) == 1:
            raise RuntimeError("internal: pop_block without push_block")
        return self._blocks.pop()

    @property
    def top_ops(self) -> list:
        return self._blocks[0]

    # ------------------------------------------------------------------ errors
    def error(self, message: str, *, expected: str = "", found: str = "",
              suggestion: str = "", notes: tuple[str, ...] = ()) -> CompilationError:
        """A CompilationError at the user's current expression (raise it)."""
        return CompilationError(message, self.loc, expected=expected, found=found,
                                suggestion=suggestion, notes=notes)

    @contextlib.contextmanager
    def at(self, loc: Loc) -> Iterator[None]:
        saved, self.loc = self.loc, loc
        try:
            yield
        finally:
            self.loc = saved

    @contextlib.contextmanager
    def activate(self) -> Iterator["Builder"]:
        token = _CURRENT.set(self)
        try:
            yield self
        finally:
            _CURRENT.reset(token)


def current_builder() -> Optional[Builder]:
    return _CURRENT.get()


def require_builder(what: str) -> Builder:
    builder = _CURRENT.get()
    if builder is None:
        raise RuntimeError(f"{what} is a weft op: call it inside a @jit kernel")
    return builder


def builtin(fn: Callable) -> Callable:
    """Mark `fn` as a kernel op: the frontend calls it with the evaluated arguments."""

    @functools.wraps(fn)
    def op(*args, **kwargs):
        require_builder(f"{fn.__qualname__}()")
        return fn(*args, **kwargs)

    op.__weft_builtin__ = True
    return op


def constexpr_function(fn: Callable) -> Callable:
    """Mark a Python function as callable from kernels on compile-time values."""
    fn.__weft_constexpr__ = True
    return fn


def is_builtin(obj: Any) -> bool:
    return bool(getattr(obj, "__weft_builtin__", False))


def is_constexpr_callable(obj: Any) -> bool:
    """Functions and classes marked for compile-time use, and methods of such objects."""
    if getattr(obj, "__weft_constexpr__", False):
        return True
    owner = getattr(obj, "__self__", None)
    return owner is not None and bool(getattr(owner, "__weft_constexpr__", False))


def unwrap_constexpr(value: Any) -> Any:
    """The value inside a runtime `constexpr(...)` wrapper (duck-typed: the runtime owns the
    class), else the value itself."""
    if type(value).__name__ == "constexpr" and hasattr(value, "value"):
        return value.value
    return value


class static_range:
    """`for i in ll.static_range(a, b, step)`: unrolled at compile time; bounds are constexprs."""

    __weft_constexpr__ = True

    def __init__(self, start, stop=None, step=1):
        if stop is None:
            start, stop = 0, start
        for name, bound in (("start", start), ("stop", stop), ("step", step)):
            if isinstance(bound, bool) or not isinstance(bound, int):
                raise CompilationError(
                    f"static_range {name} must be a compile-time int, found {_describe(bound)}",
                    _loc(), suggestion="use range(...) for a loop with runtime bounds")
        if step == 0:
            raise CompilationError("static_range step must not be 0", _loc())
        self.values = range(start, stop, step)

    def __iter__(self):
        return iter(self.values)


class dynamic_range:
    """`for i in range(a, b, step)` (or `ll.range`): one `ir.For`, bounds known at run time.

    `ll.range(..., rematerialize=True)` recomputes values derived from the thread's position
    (lane and warp indices, each register's shared-memory offsets, mask columns) at the top
    of every iteration instead of holding them in registers from the kernel's entry: for
    a persistent kernel's tile loop, whose inner loops need every register (flash attention
    spilled without it). Off by default: moving those values can cost elsewhere (ptxas
    serialized a pipelined matmul's wgmma with it)."""

    __weft_constexpr__ = True
    schedule = None  # highlevel's range records its pipelining keywords here (ir.LoopSchedule)

    def __init__(self, start, stop=None, step=1, rematerialize=False):
        if stop is None:
            start, stop = 0, start
        self.start, self.stop, self.step = start, stop, step
        self.rematerialize = rematerialize


class condition:
    """`while ll.condition(test, rematerialize=True):` a runtime while loop whose body
    recomputes thread-position values in every iteration, as `ll.range(...,
    rematerialize=True)` does for a for loop: for a persistent kernel whose tiles come
    from a dynamic scheduler, so their number is not known when the loop starts."""

    __weft_constexpr__ = True

    def __init__(self, test, rematerialize=False):
        self.test, self.rematerialize = test, rematerialize


def _loc() -> Optional[Loc]:
    builder = _CURRENT.get()
    return builder.loc if builder else None


def _describe(value: Any) -> str:
    if isinstance(value, DynamicValue):
        return f"a runtime value of type {value.type}"
    return repr(value)
