"""Expression evaluation for the frontend: one visitor method per supported expression.

An expression evaluates to a Python value (a compile-time constant: number, tuple,
layout, dtype, function, ...) or a `DynamicValue` (an IR value wrapped by the language).
Python operators are applied as they are: on compile-time values they compute now, on
dynamic values the language's operator methods build IR.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import contextvars
import inspect
import linecache
import operator
import textwrap
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from .aggregates import field_annotation, fields_of, is_aggregate, is_aggregate_class
from .builder import (Builder, DynamicValue, dynamic_range, is_builtin, is_constexpr_callable,
                      unwrap_constexpr)
from .builder import condition as loop_condition
from .errors import CompilationError, Loc
from .types import ScalarType, TensorType, Type, element_of, fp32, i1, i32, i64

BINARY_OPERATORS: dict[type, Callable] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
    ast.Pow: operator.pow, ast.LShift: operator.lshift, ast.RShift: operator.rshift,
    ast.BitOr: operator.or_, ast.BitXor: operator.xor, ast.BitAnd: operator.and_,
}
COMPARE_OPERATORS: dict[type, Callable] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge, ast.Is: operator.is_, ast.IsNot: operator.is_not,
    ast.In: lambda a, b: operator.contains(b, a), ast.NotIn: lambda a, b: not operator.contains(b, a),
}
# Python built-ins kernels may call on compile-time values (`range` becomes a loop).
PYTHON_BUILTINS = {name: getattr(builtins, name) for name in (
    "len", "min", "max", "abs", "int", "float", "bool", "str", "tuple", "list", "isinstance",
    "enumerate", "zip", "reversed", "sorted", "sum", "any", "all", "divmod", "pow", "round",
    "getattr", "hasattr", "repr", "slice", "print",
)}
PYTHON_BUILTINS["range"] = dynamic_range
# Built-ins that only rearrange values, so tuples of runtime values may pass through them.
STRUCTURAL_BUILTINS = ("len", "tuple", "list", "enumerate", "zip", "reversed", "isinstance",
                       "getattr", "hasattr")
SYNTAX_NAMES = {
    "FunctionDef": "a nested function definition", "AsyncFunctionDef": "async def",
    "ClassDef": "a class definition", "Try": "try/except", "TryStar": "try/except*",
    "With": "with", "AsyncWith": "async with", "AsyncFor": "async for", "Global": "global",
    "Nonlocal": "nonlocal", "Break": "break", "Continue": "continue", "Raise": "raise",
    "Import": "import", "ImportFrom": "import", "Delete": "del", "Match": "match",
    "Lambda": "lambda", "ListComp": "a list comprehension", "SetComp": "a set comprehension",
    "DictComp": "a dict comprehension", "GeneratorExp": "a generator expression",
    "Dict": "a dict literal", "Set": "a set literal", "NamedExpr": "the := operator",
    "Await": "await", "Yield": "yield", "YieldFrom": "yield from", "MatMult": "@",
}
SUPPORTED_EXPRESSIONS = ("names, constants, attributes, calls, operators, comparisons, "
                         "tuples/lists, x[...] indexing, conditional expressions on constexprs, "
                         "f-strings")


@dataclass
class FunctionFrame:
    """One Python function being walked: where its lines are and what names it sees."""

    fn: types.FunctionType
    tree: ast.FunctionDef
    file: str
    first_line: int  # file line of the `def` (or its first decorator)
    indent: int  # columns removed by dedenting the source
    source: str
    closure: dict = field(default_factory=dict)

    @classmethod
    def of(cls, fn: types.FunctionType) -> "FunctionFrame":
        try:
            lines, first_line = inspect.getsourcelines(fn)
        except (OSError, TypeError) as error:
            raise CompilationError(
                f"cannot read the source of {fn.__qualname__}: {error}",
                suggestion="define kernels and the functions they call in a .py file") from None
        source = "".join(lines)
        dedented = textwrap.dedent(source)
        indent = len(lines[0]) - len(lines[0].lstrip()) if dedented != source else 0
        module = ast.parse(dedented)
        tree = next(node for node in module.body
                    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)))
        file = inspect.getsourcefile(fn) or fn.__code__.co_filename
        closure = dict(inspect.getclosurevars(fn).nonlocals) if fn.__closure__ else {}
        return cls(fn, tree, file, first_line, indent, source, closure)

    def loc(self, node: ast.AST) -> Loc:
        line = self.first_line + getattr(node, "lineno", 1) - 1
        text = linecache.getline(self.file, line)
        return Loc(self.file, line, getattr(node, "col_offset", 0) + self.indent, text)


# The module-level names the frontend resolves while it builds a kernel, for the disk
# cache: {(module name, name): (value, the module's namespace)}. Set by
# `record_resolved_globals`; None when nobody asks.
_resolved: contextvars.ContextVar[Optional[dict]] = contextvars.ContextVar("weft_resolved", default=None)


@contextlib.contextmanager
def record_resolved_globals():
    """Collects every global name and module attribute the frontend resolves inside the
    `with` block (through all inlined functions), as {(module, name): (value, namespace)}:
    what the compiled code depends on beyond the kernel's own source and arguments.
    Closure variables are not listed: they belong to the function value that holds them."""
    resolved: dict = {}
    token = _resolved.set(resolved)
    try:
        yield resolved
    finally:
        _resolved.reset(token)


def _record(module: Any, name: str, value: Any, namespace: Any) -> None:
    resolved = _resolved.get()
    if resolved is not None:
        resolved[(module, name)] = (value, namespace)


@dataclass(frozen=True)
class BoundMethod:
    """`instance.method` for a @jit function defined in an aggregate's class: calling it
    inlines the function with the instance as its first argument."""

    fn: types.FunctionType
    instance: Any


def must_use_result(fn: Any = None, reason: str = "") -> Any:
    """Mark a @jit helper (or a compile-time function) whose result must be used: a kernel
    statement that calls it and drops what it returns is an error. Written `@must_use_result`
    or `@must_use_result("why")`, above or below `@jit`."""
    if isinstance(fn, str):
        return lambda f: must_use_result(f, fn)
    target = python_function(fn) or fn
    target.__weft_must_use__ = reason or "its result must be used"
    return fn


def must_use_reason(fn: Any) -> Optional[str]:
    if isinstance(fn, BoundMethod):
        fn = fn.fn
    return getattr(fn, "__weft_must_use__", None) or \
        getattr(python_function(fn), "__weft_must_use__", None)


class ReturnSignal(Exception):
    """Carries a `return` value out of the statements of an inlined function."""

    def __init__(self, value: Any):
        super().__init__("return")
        self.value = value


def contains_dynamic(value: Any) -> bool:
    if isinstance(value, DynamicValue):
        return True
    if isinstance(value, (tuple, list)):
        return any(contains_dynamic(v) for v in value)
    if isinstance(value, dict):
        return any(contains_dynamic(v) for v in value.values())
    return False


def python_function(obj: Any) -> Optional[types.FunctionType]:
    """The Python function of a @jit kernel object (duck-typed: the runtime owns the class)."""
    fn = getattr(obj, "fn", None)
    if isinstance(fn, types.FunctionType) and hasattr(obj, "compile_fn"):
        return fn
    return None


class ExpressionVisitor:
    """Evaluates expressions; the statement visitor (frontend.py) extends it."""

    builder: Builder
    frames: list[FunctionFrame]
    scope: dict[str, Any]
    region_locals: dict[str, Loc]
    discarded_call: Optional[ast.Call]
    constructing: set[int]

    @property
    def frame(self) -> FunctionFrame:
        return self.frames[-1]

    # ------------------------------------------------------------------ dispatch
    def visit(self, node: ast.AST) -> Any:
        """Evaluate/execute `node` with the builder's location set to it; a stray
        exception becomes a CompilationError here (the innermost user line)."""
        method = getattr(self, "visit_" + type(node).__name__, None)
        loc = self.frame.loc(node)
        with self.builder.at(loc):
            if method is None:
                self.unsupported(node)
            try:
                return method(node)
            except (CompilationError, ReturnSignal):
                raise
            except RecursionError:
                raise self.builder.error("the kernel nests too deeply (recursive @jit calls?)") from None
            except Exception as error:
                raise self.stray_error(error) from error

    def stray_error(self, error: Exception) -> CompilationError:
        if isinstance(error, (ValueError, TypeError, AttributeError, IndexError, KeyError,
                              ZeroDivisionError, OverflowError, NameError)):
            message = str(error) if type(error).__name__ == "LayoutError" else \
                f"{type(error).__name__}: {error}"
        else:
            message = f"internal error ({type(error).__name__}: {error})"
        return self.builder.error(message)

    def unsupported(self, node: ast.AST, what: str = ""):
        kind = what or SYNTAX_NAMES.get(type(node).__name__, type(node).__name__)
        supported = SUPPORTED_EXPRESSIONS if isinstance(node, ast.expr) else \
            "assignments, expressions, if/elif/else, for over range/static_range/tuples, " \
            "while, return, pass, assert"
        raise self.builder.error(f"unsupported Python syntax in a kernel: {kind}",
                                 expected=f"kernels support {supported}",
                                 found=_node_text(node))

    # ------------------------------------------------------------------ leaves
    def visit_Constant(self, node: ast.Constant) -> Any:
        return node.value

    def visit_Name(self, node: ast.Name) -> Any:
        if not isinstance(node.ctx, ast.Load):
            self.unsupported(node, "assignment target here")
        return self.lookup(node.id)

    def lookup(self, name: str) -> Any:
        if name in self.scope:
            return self.scope[name]
        if name in self.region_locals:
            raise self.builder.error(
                f"'{name}' is defined only inside the runtime loop or if at "
                f"line {self.region_locals[name].line}, not after it",
                suggestion=f"assign '{name}' before the loop/if so it is carried out of it")
        frame = self.frame
        if name in frame.closure:
            return unwrap_constexpr(frame.closure[name])
        namespace = frame.fn.__globals__
        if name in namespace:
            value = namespace[name]
            _record(namespace.get("__name__", frame.fn.__module__), name, value, namespace)
            return unwrap_constexpr(value)
        if name in PYTHON_BUILTINS:
            return PYTHON_BUILTINS[name]
        if hasattr(builtins, name):
            raise self.builder.error(f"the Python built-in '{name}' is not supported in kernels",
                                     expected="one of " + ", ".join(sorted(PYTHON_BUILTINS)))
        raise self.builder.error(f"name '{name}' is not defined",
                                 suggestion="define it before use, pass it as a parameter, or "
                                            "import it in the kernel's module")

    def visit_Attribute(self, node: ast.Attribute) -> Any:
        value = self.visit(node.value)
        if is_aggregate(value):
            method = python_function(getattr(type(value), node.attr, None))
            if method is not None:
                return BoundMethod(method, value)
        result = getattr(value, node.attr)
        if isinstance(value, types.ModuleType):
            _record(value.__name__, node.attr, result, vars(value))
        return unwrap_constexpr(result)

    def visit_Tuple(self, node: ast.Tuple) -> tuple:
        return tuple(self.sequence(node.elts))

    def visit_List(self, node: ast.List) -> list:
        return self.sequence(node.elts)

    def sequence(self, elements) -> list:
        items = []
        for element in elements:
            if isinstance(element, ast.Starred):
                items.extend(self.iterable(self.visit(element.value)))
            else:
                items.append(self.visit(element))
        return items

    def iterable(self, value: Any) -> Any:
        if isinstance(value, DynamicValue) or not hasattr(value, "__iter__"):
            raise self.builder.error(f"cannot unpack {value!r} with *: expected a tuple or list")
        return value

    def visit_Slice(self, node: ast.Slice) -> slice:
        parts = [self.visit(p) if p is not None else None for p in (node.lower, node.upper, node.step)]
        return slice(*parts)

    def visit_Subscript(self, node: ast.Subscript) -> Any:
        value = self.visit(node.value)
        index = self.visit(node.slice)
        return unwrap_constexpr(value[index])

    def visit_JoinedStr(self, node: ast.JoinedStr) -> str:
        return "".join(str(self.visit(v)) for v in node.values)

    def visit_FormattedValue(self, node: ast.FormattedValue) -> str:
        value = self.visit(node.value)
        if isinstance(value, DynamicValue):
            raise self.builder.error("f-strings format compile-time values only",
                                     suggestion=f"print runtime values with {self.builder.prefix}.device_print")
        spec = self.visit(node.format_spec) if node.format_spec else ""
        converted = {-1: value, 115: str(value), 114: repr(value), 97: ascii(value)}[node.conversion]
        return format(converted, spec)

    # ------------------------------------------------------------------ operators
    def visit_BinOp(self, node: ast.BinOp) -> Any:
        op = BINARY_OPERATORS.get(type(node.op))
        if op is None:
            self.unsupported(node, SYNTAX_NAMES.get(type(node.op).__name__, type(node.op).__name__))
        return op(self.visit(node.left), self.visit(node.right))

    def visit_UnaryOp(self, node: ast.UnaryOp) -> Any:
        operand = self.visit(node.operand)
        if isinstance(node.op, ast.Not):
            if isinstance(operand, DynamicValue):
                raise self.builder.error("`not` needs a compile-time value",
                                         suggestion="use ~x (bitwise not) or x == 0 on tensors")
            return not operand
        return {ast.USub: operator.neg, ast.UAdd: operator.pos,
                ast.Invert: operator.invert}[type(node.op)](operand)

    def visit_BoolOp(self, node: ast.BoolOp) -> Any:
        """Python's `and`/`or` on compile-time values; with runtime values (Triton's rule),
        each is taken as a boolean (x != 0) and they combine elementwise with & or |. Every
        runtime operand is evaluated (no short circuit at run time); a compile-time operand
        that decides the answer (False in `and`, True in `or`) still does."""
        is_and = isinstance(node.op, ast.And)
        result = None
        runtime = []
        for operand in node.values:
            result = self.visit(operand)
            if isinstance(result, DynamicValue):
                element = element_of(result.type)
                if not isinstance(element, ScalarType):
                    raise self.builder.error(f"`{'and' if is_and else 'or'}` needs boolean or number "
                                             f"operands, found a {result.type}")
                runtime.append(result if element == i1 else result != 0)
            elif bool(result) != is_and:
                return result
        if not runtime:
            return result
        combined = runtime[0]
        for value in runtime[1:]:
            combined = (combined & value) if is_and else (combined | value)
        return combined

    def visit_Compare(self, node: ast.Compare) -> Any:
        left = self.visit(node.left)
        result = True
        for op, comparator in zip(node.ops, node.comparators):
            right = self.visit(comparator)
            dynamic = isinstance(left, DynamicValue) or isinstance(right, DynamicValue)
            if dynamic and len(node.ops) > 1:
                raise self.builder.error("chained comparisons need compile-time operands",
                                         suggestion="write (a < b) & (b < c) for tensors")
            if dynamic and isinstance(op, (ast.In, ast.NotIn)):
                raise self.builder.error("`in` needs compile-time operands")
            result = COMPARE_OPERATORS[type(op)](left, right)
            if not dynamic and not result:
                return result
            left = right
        return result

    def visit_IfExp(self, node: ast.IfExp) -> Any:
        condition = self.visit(node.test)
        if isinstance(condition, DynamicValue):
            raise self.builder.error("a conditional expression needs a compile-time condition",
                                     suggestion="use ll.where(cond, a, b) for runtime selection")
        return self.visit(node.body if condition else node.orelse)

    # ------------------------------------------------------------------ calls
    def visit_Call(self, node: ast.Call) -> Any:
        function = self.visit(node.func)
        if node is self.discarded_call:
            self.check_result_used(function)
        args = self.sequence(node.args)
        kwargs = {}
        for keyword in node.keywords:
            if keyword.arg is None:
                value = self.visit(keyword.value)
                if not isinstance(value, dict):
                    raise self.builder.error(f"** needs a dict of compile-time values, found {value!r}")
                kwargs.update(value)
            else:
                kwargs[keyword.arg] = self.visit(keyword.value)
        return self.call(function, args, kwargs, node)

    def call(self, function: Any, args: list, kwargs: dict, node: ast.AST) -> Any:
        jitted = python_function(function)
        if jitted is not None:
            return self.inline_call(jitted, args, kwargs, node)
        if isinstance(function, BoundMethod):
            return self.inline_call(function.fn, [function.instance, *args], kwargs, node)
        if is_aggregate_class(function):
            return self.construct(function, args, kwargs, node)
        if (function is builtins.min or function is builtins.max) and contains_dynamic(args):
            return self.runtime_extreme(function, args, kwargs)
        if is_builtin(function):
            return function(*args, **kwargs)
        if isinstance(function, type) and issubclass(function, (dynamic_range, loop_condition)):
            return function(*args, **kwargs)  # bounds and tests may be runtime values
        if function is abs and len(args) == 1 and isinstance(args[0], DynamicValue):
            return abs(args[0])
        if self.compile_time_callable(function):
            structural = any(function is PYTHON_BUILTINS[n] for n in STRUCTURAL_BUILTINS)
            if not structural and (contains_dynamic(args) or contains_dynamic(kwargs)):
                name = getattr(function, "__name__", repr(function))
                prefix = self.builder.prefix
                hint = {"min": f"{prefix}.minimum", "max": f"{prefix}.maximum",
                        "print": f"{prefix}.device_print", "sum": f"{prefix}.sum", "len": "x.shape[d]",
                        "static_range": "range(...), whose bounds may be runtime values"}.get(name, "a weft op")
                raise self.builder.error(
                    f"{name}() runs at compile time on constexpr values, but an argument is a "
                    f"runtime value", suggestion=f"use {hint} for runtime values")
            return unwrap_constexpr(function(*args, **kwargs))
        name = getattr(function, "__qualname__", None) or repr(function)
        raise self.builder.error(
            f"cannot call {name} from a kernel",
            expected="a @jit function, a weft op (ll.*), a layout or dtype constructor, a "
                     "function marked @ll.constexpr_function, a math.* function, or one of the "
                     "Python built-ins " + ", ".join(sorted(PYTHON_BUILTINS)),
            found=f"{type(function).__name__} {name}",
            suggestion="decorate the function with @ll.jit to inline it")

    def check_result_used(self, function: Any) -> None:
        reason = must_use_reason(function)
        if reason:
            name = getattr(getattr(function, "fn", function), "__name__", repr(function))
            raise self.builder.error(f"the result of {name}() is dropped: {reason}",
                                     suggestion="assign it to a name (e.g. `x = ...`)")

    def construct(self, cls: type, args: list, kwargs: dict, node: ast.AST) -> Any:
        """An instance of aggregate `cls`: its __init__ runs now, in Python when it is a
        compile-time function and inlined when it is a @jit function."""
        instance = object.__new__(cls)
        init = python_function(cls.__dict__.get("__init__"))
        if init is not None:
            self.constructing.add(id(instance))
            try:
                self.inline_call(init, [instance, *args], kwargs, node)
            finally:
                self.constructing.discard(id(instance))
        else:
            cls.__init__(instance, *args, **kwargs)
        for name in fields_of(instance):
            if name not in instance.__dict__:
                raise self.builder.error(f"{cls.__name__}.__init__ did not set the name '{name}'",
                                         suggestion=f"assign self.{name} in __init__")
            value = unwrap_constexpr(instance.__dict__[name])
            if is_constexpr_annotation(field_annotation(cls, name)) and contains_dynamic(value):
                raise self.builder.error(
                    f"{cls.__name__}.{name} is annotated constexpr but holds a runtime value "
                    f"({type_text(value.type) if isinstance(value, DynamicValue) else value!r})",
                    suggestion=f"annotate it with the runtime type (ll.tensor, ...) or pass a "
                               f"compile-time value")
            instance.__dict__[name] = value
        extra = set(instance.__dict__) - set(fields_of(instance))
        if extra:
            raise self.builder.error(f"{cls.__name__}.__init__ set {sorted(extra)}, which are not "
                                     f"declared fields", suggestion="annotate every field in the class body")
        return instance

    def runtime_extreme(self, function: Any, args: list, kwargs: dict) -> Any:
        """Python's min/max over runtime values: elementwise minimum/maximum of the arguments
        (or of one tuple's items), as the language's `minimum`/`maximum` computes them."""
        items = list(args[0]) if len(args) == 1 and isinstance(args[0], (tuple, list)) else list(args)
        name = function.__name__
        if kwargs or len(items) < 2:
            raise self.builder.error(f"{name}() of runtime values takes two or more values (no key= or default=)")
        result = items[0]
        for item in items[1:]:
            value, other = (result, item) if isinstance(result, DynamicValue) else (item, result)
            method = getattr(value, f"python_{name}", None)
            if method is None:
                raise self.builder.error(f"{name}() is not defined on {value!r}")
            result = method(other)
        return result

    @staticmethod
    def compile_time_callable(function: Any) -> bool:
        if is_constexpr_callable(function):
            return True
        if any(function is f for f in PYTHON_BUILTINS.values()):
            return True
        if getattr(function, "__module__", None) == "math":
            return True
        owner = getattr(function, "__self__", None)
        # Methods of plain Python values: (1, 2).index, "a{}".format, ...
        return isinstance(owner, (int, float, str, tuple, list, dict)) and \
            isinstance(function, types.BuiltinMethodType)

    def inline_call(self, fn, args, kwargs, node) -> Any:  # pragma: no cover - frontend.py
        raise NotImplementedError


def is_constexpr_annotation(annotation: Any) -> bool:
    if isinstance(annotation, str):  # `from __future__ import annotations`
        return annotation.replace(" ", "").rsplit(".", 1)[-1] == "constexpr"
    return getattr(annotation, "__name__", None) == "constexpr"


def changed(old: Any, new: Any) -> bool:
    """Whether a variable's value differs (never calls a runtime value's `==`)."""
    if old is new:
        return False
    if isinstance(old, DynamicValue) or isinstance(new, DynamicValue):
        return not (isinstance(old, DynamicValue) and isinstance(new, DynamicValue)
                    and old.handle is new.handle)
    try:
        return not (type(old) is type(new) and bool(old == new))
    except Exception:  # values without a usable ==: treat as different
        return True


def number_type(value: Any) -> Optional[ScalarType]:
    """The IR type a Python number takes on its own; None for other values."""
    if isinstance(value, bool):
        return i1
    if isinstance(value, int):
        return i32 if -(1 << 31) <= value < (1 << 31) else i64
    if isinstance(value, float):
        return fp32
    return None


def type_text(type_: Type) -> str:
    if isinstance(type_, TensorType) and type_.layout is None:
        return str(type_)  # the tile stage: layouts are inferred later
    if isinstance(type_, TensorType):
        layout = type_.encoding if type_.encoding is not None else "an unnamed layout"
        return f"{type_} in {layout}"
    return str(type_)


def assigned_names(statements: Sequence[ast.stmt]) -> set[str]:
    """Names a block of statements binds (syntactically, nested blocks included)."""
    names = set()
    for statement in statements:
        for node in ast.walk(statement):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
    return names


def _node_text(node: ast.AST) -> str:
    try:
        text = ast.unparse(node)
    except Exception:  # some nodes (e.g. bare operators) do not unparse
        text = type(node).__name__
    text = text.splitlines()[0] if text else type(node).__name__
    return text if len(text) <= 60 else text[:57] + "..."
