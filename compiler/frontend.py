"""The frontend: a @jit kernel's Python AST -> IR at its language's entry stage (`build_kernel`).

A strict walker over a declared subset of Python (STYLE.md 7); anything else is refused
with a CompilationError at its line.

- Statements: assignment (names, tuple unpacking), `x op= y`, annotated assignment,
  expression statements, `if`/`elif`/`else`, `for` over `range(...)`/`ll.range(...)`
  (an `ir.For`), `ll.static_range(...)` or a tuple (unrolled), `while` (an `ir.While`),
  `return`, `pass`, `assert`.
- Compile-time values (constexpr parameters, numbers, tuples, layouts, dtypes) are plain
  Python values: arithmetic on them runs now, `if` on them picks a branch now, and ops
  receive them as they are. Runtime values are the language's wrappers of IR values.
- Runtime control flow: variables that exist before a runtime loop and are reassigned in
  it are carried through the loop (their type must not change); variables reassigned in
  a runtime `if` are yielded by it. Names first bound inside such a region end with it.
- Calls: @jit functions are inlined (errors inside show the call chain), weft ops build
  IR, compile-time helpers run on constexprs.

Each op is stamped with the Loc of the innermost user expression being evaluated, and
any exception escaping an op becomes a CompilationError there.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import types
from typing import Any, Mapping, Optional, Sequence, Union

from . import ir
from .aggregates import (differing_leaves, fields_of, is_aggregate, leaf_at, split_key,
                         with_leaves)
from .builder import (Builder, DynamicValue, dynamic_range, language_prefix, language_stage,
                      language_wrapper, unwrap_constexpr)
from .builder import condition as loop_condition
from .errors import CompilationError, Loc
from .frontend_expr import (BINARY_OPERATORS, ExpressionVisitor, FunctionFrame, ReturnSignal,
                            assigned_names, changed, is_constexpr_annotation, number_type,
                            python_function, type_text)
from .types import PointerType, ScalarType, TensorType, Type, fp32, i1, i32, i64, parse_signature_type

_MISSING = object()
MAX_INLINE_DEPTH = 64


def build_kernel(fn: Any, signature: Mapping[str, str], constexprs: Mapping[str, Any],
                 num_warps: int, specialization: Optional[Union[Mapping[str, str], Sequence[str]]] = None,
                 *, language: str = "lowlevel", cluster: Optional[Sequence[int]] = None,
                 max_registers: Optional[int] = None) -> ir.Kernel:
    """The IR of kernel `fn` (a @jit object or its Python function) at the stage its
    language enters at (`layout` for lowlevel, `tile` for highlevel).

    `signature` maps each runtime parameter to a Triton signature string ("*fp32", "i32",
    ...); `constexprs` gives every compile-time parameter's value (defaults fill gaps);
    `specialization` maps runtime parameters (or lists them in order) to "equal_to_1",
    "divisible_by_16" or "". `cluster`: the CTAs per cluster it launches in (checked by the
    runtime; None for one), a launch fact it carries to the compiled kernel and the emulator.
    `max_registers`: the launch option maxnreg (checked by the runtime), registers a thread
    may hold at most.
    """
    function = python_function(fn) or fn
    if not isinstance(function, types.FunctionType):
        raise TypeError(f"build_kernel needs a Python function or @jit kernel, got {fn!r}")
    if not isinstance(num_warps, int) or num_warps < 1 or num_warps > 32 or num_warps & (num_warps - 1):
        raise ValueError(f"num_warps must be a power of two from 1 to 32, got {num_warps!r}")
    builder = Builder(num_warps, language_wrapper(language), language_prefix(language))
    builder.max_registers = max_registers
    kernel = KernelBuilder(builder).build(function, dict(signature), dict(constexprs), specialization)
    return dataclasses.replace(kernel, stage=language_stage(language), language=language,
                               cluster=tuple(cluster or (1, 1, 1)), max_registers=max_registers)


class KernelBuilder(ExpressionVisitor):
    """Walks one kernel (and the functions it calls) into the builder's blocks."""

    def __init__(self, builder: Builder):
        self.builder = builder
        self.frames: list[FunctionFrame] = []
        self.scope: dict[str, Any] = {}
        self.region_locals: dict[str, Loc] = {}
        self.assigned_at: dict[str, Loc] = {}
        self.dynamic_depth = 0
        self.sources: dict[Any, str] = {}
        self.frame_cache: dict[Any, FunctionFrame] = {}
        self.discarded_call: Optional[ast.Call] = None  # an expression statement's call
        self.constructing: set[int] = set()  # aggregates whose @jit __init__ is running
        builder.inline_function = self.inline_partition

    # ------------------------------------------------------------------ the kernel
    def build(self, fn, signature: dict, constexprs: dict, specialization) -> ir.Kernel:
        frame = self.frame_of(fn)
        self.frames = [frame]
        tree = frame.tree
        parameters = inspect.signature(fn).parameters
        if not isinstance(specialization, Mapping):
            runtime = [n for n in parameters if n in signature]
            specialization = dict(zip(runtime, specialization or ()))
        params, divisibility, bound = [], [], []
        with self.builder.activate(), self.builder.at(frame.loc(tree)):
            nodes = {a.arg: a for a in tree.args.args + tree.args.posonlyargs + tree.args.kwonlyargs}
            if tree.args.vararg or tree.args.kwarg:
                raise self.builder.error("kernel parameters must be plain names (no *args/**kwargs)")
            for name, parameter in parameters.items():
                with self.builder.at(frame.loc(nodes.get(name, tree))):
                    value = self.parameter(name, parameter, signature, constexprs, specialization)
                if isinstance(value, ir.Value):
                    params.append(value)
                    self.builder.kernel_params[name] = value
                    divisibility.append(16 if specialization.get(name) == "divisible_by_16" else 1)
                    value = 1 if specialization.get(name) == "equal_to_1" and \
                        isinstance(value.type, ScalarType) and value.type.is_int else self.builder.wrap(value)
                else:
                    bound.append((name, value))
                self.scope[name] = value
            unknown = sorted((set(signature) | set(constexprs)) - set(parameters))
            if unknown:
                raise self.builder.error(f"the kernel has no parameters {unknown}",
                                         expected=f"parameters {list(parameters)}")
            try:
                self.visit_body(tree.body)
            except ReturnSignal:
                pass
        body = ir.Block((), tuple(self.builder.top_ops))
        # Hidden parameters (desc.shape reads) follow the caller's, in parameter order.
        order = {name: i for i, name in enumerate(parameters)}
        hidden = sorted(self.builder.hidden_params.items(), key=lambda item: (order[item[0][0]], item[0][1:]))
        return ir.Kernel(fn.__name__, tuple(params) + tuple(v for _, v in hidden), body, self.builder.num_warps,
                         source="\n".join(self.sources.values()), constexprs=tuple(bound),
                         param_divisibility=tuple(divisibility) + (1,) * len(hidden),
                         hidden_params=tuple(key for key, _ in hidden),
                         block_pointer_loads=tuple(self.builder.block_pointer_loads))

    def parameter(self, name: str, parameter: inspect.Parameter, signature: dict,
                  constexprs: dict, specialization: Mapping) -> Any:
        """A constexpr parameter's Python value, or a runtime parameter's ir.Value."""
        if name == "num_warps" and (is_constexpr_annotation(parameter.annotation) or name in constexprs):
            return self.num_warps_parameter(constexprs)
        if name in constexprs:
            return unwrap_constexpr(constexprs[name])
        if is_constexpr_annotation(parameter.annotation) or signature.get(name) == "constexpr":
            if parameter.default is not inspect.Parameter.empty:
                return unwrap_constexpr(parameter.default)
            raise self.builder.error(f"constexpr parameter '{name}' has no value",
                                     suggestion=f"pass {name}=... when launching or compiling")
        if name not in signature:
            raise self.builder.error(f"parameter '{name}' is neither in the signature nor a constexpr",
                                     expected="a signature entry such as \"*fp32\" or \"i32\", "
                                              "or a constexpr value")
        try:
            type_ = parse_signature_type(str(signature[name]))
        except ValueError as error:
            raise self.builder.error(f"bad signature type for '{name}': {error}")
        return ir.Value(type_, name)

    def num_warps_parameter(self, constexprs: dict) -> int:
        """A kernel parameter named num_warps is the launch's warp count (as in Gluon): given
        or not, it must agree with the num_warps the kernel compiles for."""
        value = unwrap_constexpr(constexprs.get("num_warps", self.builder.num_warps))
        if value != self.builder.num_warps:
            raise self.builder.error(f"the kernel parameter num_warps={value!r} differs from the "
                                     f"launch option num_warps={self.builder.num_warps}",
                                     suggestion="pass num_warps once, as a keyword of the launch")
        return value

    def frame_of(self, fn) -> FunctionFrame:
        if fn not in self.frame_cache:
            self.frame_cache[fn] = FunctionFrame.of(fn)
            self.sources.setdefault(fn, self.frame_cache[fn].source)
        return self.frame_cache[fn]

    # ------------------------------------------------------------------ inlining
    def inline_call(self, fn, args: list, kwargs: dict, node: ast.AST) -> Any:
        call_loc = self.builder.loc
        if len(self.frames) >= MAX_INLINE_DEPTH:
            raise self.builder.error(f"@jit calls nest more than {MAX_INLINE_DEPTH} deep "
                                     f"(unbounded recursion in {fn.__name__}?)")
        frame = self.frame_of(fn)
        signature = inspect.signature(fn)
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as error:
            raise self.builder.error(f"{fn.__name__}(): {error}")
        bound.apply_defaults()
        # A runtime value passed to a constexpr-annotated parameter of a helper is bound
        # as it is (Triton allows it); only kernel parameters must be compile-time.
        scope = {name: unwrap_constexpr(value) for name, value in bound.arguments.items()}
        saved = (self.scope, self.dynamic_depth, self.region_locals, self.assigned_at)
        self.frames.append(frame)
        self.scope, self.dynamic_depth, self.region_locals, self.assigned_at = scope, 0, {}, {}
        try:
            self.visit_body(frame.tree.body)
            return None
        except ReturnSignal as signal:
            return signal.value
        except CompilationError as error:
            note = f"in {fn.__qualname__}(), inlined from {call_loc}: {call_loc.source_line.strip()}"
            raise CompilationError(error.message, error.loc, expected=error.expected,
                                   found=error.found, suggestion=error.suggestion,
                                   notes=error.notes + (note,)) from error.__cause__
        finally:
            self.frames.pop()
            self.scope, self.dynamic_depth, self.region_locals, self.assigned_at = saved

    def inline_partition(self, fn, args: list, kwargs: dict) -> Any:
        """Inline a @jit function (given as the object users pass) into the current block,
        as a region of its own: the caller's local scope is restored afterwards."""
        jitted = python_function(fn)
        if jitted is None:
            raise self.builder.error(f"expected a @jit function, found {fn!r}")
        saved = self.scope
        try:
            return self.inline_call(jitted, args, kwargs, None)
        finally:
            self.scope = saved

    # ------------------------------------------------------------------ simple statements
    def visit_body(self, statements: Sequence[ast.stmt]) -> None:
        for statement in statements:
            self.visit(statement)

    def visit_Expr(self, node: ast.Expr) -> None:
        if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            return  # a docstring
        self.discarded_call = node.value if isinstance(node.value, ast.Call) else None
        self.visit(node.value)

    def visit_Pass(self, node: ast.Pass) -> None:
        return None

    def visit_Assign(self, node: ast.Assign) -> None:
        value = self.visit(node.value)
        for target in node.targets:
            self.assign(target, value)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is None:
            self.unsupported(node, "a bare annotation")
        self.assign(node.target, self.visit(node.value))

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        if not isinstance(node.target, ast.Name):
            self.unsupported(node, "augmented assignment to an attribute or item")
        op = BINARY_OPERATORS.get(type(node.op))
        if op is None:
            self.unsupported(node, type(node.op).__name__)
        value = op(self.lookup(node.target.id), self.visit(node.value))
        self.assign(node.target, value)

    def assign(self, target: ast.AST, value: Any) -> None:
        with self.builder.at(self.frame.loc(target)):
            if isinstance(target, ast.Name):
                if isinstance(value, DynamicValue) and not value.handle.hint:
                    # Values are created before Python binds a name to them; naming them now
                    # only changes how dumps print them.
                    object.__setattr__(value.handle, "hint", target.id)
                self.scope[target.id] = value
                self.assigned_at[target.id] = self.builder.loc
                self.region_locals.pop(target.id, None)
            elif isinstance(target, (ast.Tuple, ast.List)):
                if isinstance(value, DynamicValue) or not isinstance(value, (tuple, list)):
                    raise self.builder.error(f"cannot unpack {value!r}: expected a tuple")
                if len(value) != len(target.elts):
                    raise self.builder.error(f"cannot unpack {len(value)} values into "
                                             f"{len(target.elts)} names")
                for element, item in zip(target.elts, value):
                    self.assign(element, item)
            elif isinstance(target, ast.Attribute) and self.is_constructing(target.value):
                instance = self.visit(target.value)
                if target.attr not in fields_of(instance):
                    raise self.builder.error(f"{type(instance).__name__} has no field '{target.attr}'",
                                             expected=f"one of its fields {list(fields_of(instance))}")
                instance.__dict__[target.attr] = value
            elif isinstance(target, ast.Attribute) and is_aggregate(self.visit(target.value)):
                raise self.builder.error(
                    f"cannot assign to a field of {type(self.visit(target.value)).__name__}: "
                    f"aggregates do not change in place",
                    suggestion="build a new instance (a method can return one) and bind it to the name")
            elif isinstance(target, (ast.Subscript, ast.Attribute)):
                raise self.builder.error(
                    "cannot assign to an item or attribute: kernel values are immutable",
                    suggestion="build a new tensor (e.g. with ll.where) and bind it to a name")
            else:
                self.unsupported(target, "this assignment target")

    def is_constructing(self, node: ast.expr) -> bool:
        """Whether `node` names an aggregate whose @jit __init__ is running (the only place
        fields are assigned)."""
        return isinstance(node, ast.Name) and id(self.scope.get(node.id)) in self.constructing

    def visit_Return(self, node: ast.Return) -> None:
        value = self.visit(node.value) if node.value is not None else None
        if self.dynamic_depth:
            raise self.builder.error("return inside a runtime if/for/while is not supported",
                                     suggestion="assign the result to a variable and return "
                                                "it at the end of the function")
        if len(self.frames) == 1 and value is not None:
            raise self.builder.error("a kernel cannot return a value",
                                     suggestion="store results through a pointer with ll.store")
        raise ReturnSignal(value)

    def visit_Assert(self, node: ast.Assert) -> None:
        condition = self.visit(node.test)
        message = str(self.visit(node.msg)) if node.msg is not None else ast.unparse(node.test)
        if not isinstance(condition, DynamicValue):
            if not condition:
                raise self.builder.error(f"assertion failed: {message}")
            return
        if _element(condition.type) != i1:
            condition = condition != 0
        self.builder.emit(ir.DeviceAssert(condition=condition.handle, message=message, loc=self.builder.loc))

    # ------------------------------------------------------------------ if
    def visit_If(self, node: ast.If) -> None:
        condition = self.visit(node.test)
        if not isinstance(condition, DynamicValue):
            self.visit_body(node.body if condition else node.orelse)
            return
        per_warp = condition.handle in self.builder.warp_uniform  # `if ll.warp_any(...)`
        if not per_warp:
            condition = self.scalar_condition(condition, "if")
        loc = self.builder.loc
        before = self.scope
        then_ops, then_scope = self.region(node.body, before)
        else_ops, else_scope = self.region(node.orelse, before)
        names, same = [], {}
        for name in list(then_scope) + [n for n in else_scope if n not in then_scope]:
            then_value = then_scope.get(name, _MISSING)
            else_value = else_scope.get(name, _MISSING)
            if then_value is _MISSING or else_value is _MISSING:
                continue  # bound in one branch only: ends with the if
            same[name] = then_value
            names.extend(key for key, _, _ in self.differing(name, then_value, else_value))
        merged = [self.merged_type(key, leaf_at(then_scope, key), leaf_at(else_scope, key))
                  for key in names]
        if per_warp:
            self.check_per_warp_branch(then_ops + else_ops, names, merged)
        for ops, scope in ((then_ops, then_scope), (else_ops, else_scope)):
            self.builder.push_block(ops)
            values = tuple(self.as_handle(key, leaf_at(scope, key), type_) for key, type_ in zip(names, merged))
            self.builder.emit(ir.Yield(values=values, loc=loc))
            self.builder.pop_block()
        results = tuple(ir.Value(t, name) for name, t in zip(names, merged))
        self.builder.emit(ir.If(results=results, condition=condition.handle,
                                then_body=ir.Block((), tuple(then_ops)),
                                else_body=ir.Block((), tuple(else_ops)), per_warp=per_warp, loc=loc))
        self.scope = dict(before)
        self.scope.update(same)
        self.scope.update(with_leaves(same, {key: self.builder.wrap(r) for key, r in zip(names, results)}))
        for name in set(then_scope) ^ set(else_scope):
            if name not in before:
                self.region_locals[name] = loc

    def check_per_warp_branch(self, ops: list, names: list, types: list) -> None:
        """A branch taken warp by warp holds register arithmetic (and reductions within
        each warp) only and changes tensors only (ir.If's per_warp)."""
        op = ir.first_non_register_op([ir.Block((), tuple(ops))])
        if op is not None:
            raise CompilationError(
                f"`{op.NAME}` in a branch taken warp by warp (`if ll.warp_any(...)`)", op.loc,
                suggestion="only register arithmetic (elementwise math, ll.where, casts, "
                           "broadcasts) and reductions along an axis each warp holds whole may "
                           "run there: the warps that skip the branch would leave a memory "
                           "access, barrier, cross-warp reduction or layout conversion short of "
                           "threads. Compute it before the `if`")
        for name, type_ in zip(names, types):
            if not isinstance(type_, TensorType):
                raise self.builder.error(
                    f"'{name}' is a scalar assigned in a branch taken warp by warp "
                    f"(`if ll.warp_any(...)`)",
                    suggestion="a scalar is one value for every warp of the partition: change "
                               "only tensors there, or branch on a scalar")

    def region(self, statements, before: dict, bindings: Optional[dict] = None,
               ops: Optional[list] = None) -> tuple[list, dict]:
        """Walk `statements` into a new block, starting from a copy of `before`."""
        ops = self.builder.push_block(ops)
        self.scope = dict(before)
        self.scope.update(bindings or {})
        self.dynamic_depth += 1
        try:
            self.visit_body(statements)
            return ops, self.scope
        finally:
            self.dynamic_depth -= 1
            self.builder.pop_block()

    def merged_type(self, name: str, a: Any, b: Any) -> Type:
        dynamic = [v for v in (a, b) if isinstance(v, DynamicValue)]
        if len(dynamic) == 2 and _ir_type(a) != _ir_type(b):
            raise self.builder.error(
                f"'{name}' has different types in the two branches of this if",
                expected=f"one type in both branches: {type_text(_ir_type(a))}",
                found=f"{type_text(_ir_type(b))} in the else branch",
                suggestion="convert one of them (x.to(...), ll.convert_layout) before the end "
                           "of its branch")
        for value in (a, b):
            if not isinstance(value, DynamicValue) and number_type(value) is None:
                raise self.builder.error(
                    f"'{name}' holds a compile-time value that differs between the branches "
                    f"of a runtime if ({a!r} and {b!r})",
                    suggestion="only numbers and tensors can be chosen at run time")
        if dynamic:
            return _ir_type(dynamic[0])
        types_ = {number_type(a), number_type(b)}
        return fp32 if fp32 in types_ else max(types_, key=lambda t: t.bits)

    def as_handle(self, name: str, value: Any, type_: Type) -> ir.Value:
        """`value` as an IR value of `type_` in the current block (numbers become constants)."""
        if isinstance(value, DynamicValue):
            if _ir_type(value) != type_:
                loc = self.assigned_at.get(_root(name), self.builder.loc)
                raise CompilationError(
                    f"loop-carried variable '{name}' changes type inside the loop",
                    loc, expected=f"{type_text(type_)} (its type before the loop)",
                    found=f"{type_text(_ir_type(value))} at the end of the loop body",
                    suggestion="keep the type fixed: convert with .to(...) or ll.convert_layout "
                               "before assigning, or initialise it with the final type")
            return value.handle
        element = _element(type_)
        if number_type(value) is None or isinstance(element, PointerType):
            raise self.builder.error(f"'{name}' holds {value!r}, which cannot become a "
                                     f"runtime value of type {type_}")
        converted = bool(value) if element.is_bool else float(value) if element.is_float else int(value)
        result = ir.Value(type_, name)
        self.builder.emit(ir.Constant(result=result, value=converted, loc=self.builder.loc))
        return result

    def scalar_condition(self, value: DynamicValue, what: str) -> DynamicValue:
        if isinstance(value.type, TensorType):
            suggestion = "reduce it (e.g. ll.max(mask, 0)) or select elementwise with ll.where"
            if what == "if" and value.type.layout is not None:  # explicit layouts: warps are known
                suggestion += "; to branch warp by warp, write `if ll.warp_any(mask):`"
            raise self.builder.error(f"the condition of `{what}` must be a scalar, found {type_text(value.type)}",
                                     suggestion=suggestion)
        if isinstance(value.type, PointerType):
            raise self.builder.error(f"the condition of `{what}` is a pointer ({value.type})")
        return value if value.type == i1 else value != 0

    # ------------------------------------------------------------------ loops
    def visit_For(self, node: ast.For) -> None:
        if node.orelse:
            self.unsupported(node, "for ... else")
        iterable = self.visit(node.iter)
        if isinstance(iterable, dynamic_range):
            self.dynamic_for(node, iterable)
            return
        if isinstance(iterable, DynamicValue):
            raise self.builder.error("cannot iterate over a runtime value",
                                     suggestion="loop with range(...) and index with offsets")
        if isinstance(iterable, str) or not hasattr(iterable, "__iter__"):
            raise self.builder.error(f"for loops run over range(...), ll.static_range(...) or a "
                                     f"tuple, found {iterable!r}")
        for value in iterable:
            self.assign(node.target, value)
            self.visit_body(node.body)

    def dynamic_for(self, node: ast.For, bounds: dynamic_range) -> None:
        loc = self.builder.loc
        if not isinstance(node.target, ast.Name):
            raise self.builder.error("the variable of a runtime loop must be a single name")
        if isinstance(bounds.step, int) and not isinstance(bounds.step, bool) and bounds.step == 0:
            raise self.builder.error("range() step must not be 0")
        if not isinstance(bounds.rematerialize, bool):
            raise self.builder.error(f"range(..., rematerialize=) takes True or False, found "
                                     f"{bounds.rematerialize!r}")
        index_type = self.index_type((bounds.start, bounds.stop, bounds.step))
        lower, upper, step = (self.index_value(v, index_type) for v in
                              (bounds.start, bounds.stop, bounds.step))
        induction = node.target.id
        before = self.scope
        iv_probe = self.builder.wrap(ir.Value(index_type, induction))
        carried = self.carried(node.body, before, {induction: iv_probe})
        if induction in before:
            carried.append(self.carried_loop_variable(induction, before, iv_probe))
        inits = tuple(self.as_handle(key, leaf_at(before, key), t) for key, t in carried)
        iv = ir.Value(index_type, induction)
        args = tuple(ir.Value(t, key) for key, t in carried)
        bindings = with_leaves(before, {key: self.builder.wrap(a) for (key, _), a in zip(carried, args)})
        bindings[induction] = self.builder.wrap(iv)  # in the body, the name is the loop's index
        ops, after = self.region(node.body, before, bindings)
        self.builder.push_block(ops)
        with self.builder.at(loc):
            yields = tuple(self.as_handle(key, leaf_at(after, key), t) for key, t in carried)
            self.builder.emit(ir.Yield(values=yields, loc=loc))
        self.builder.pop_block()
        results = tuple(ir.Value(t, name) for name, t in carried)
        self.builder.emit(ir.For(results=results, lower=lower, upper=upper, step=step, inits=inits,
                                 body=ir.Block((iv,) + args, tuple(ops)), rematerialize=bounds.rematerialize,
                                 schedule=bounds.schedule, loc=loc))
        self.finish_loop(before, after, carried, results, loc, exclude={induction})

    def carried_loop_variable(self, name: str, before: dict, iv_probe) -> tuple[str, Type]:
        """A runtime loop's variable bound before the loop is carried through it, as Python
        has it: after the loop it holds the last iteration's value, or, if the loop did not
        run, its value from before. Its old value must be a number or a scalar of the
        index's type."""
        old = before[name]
        if isinstance(old, DynamicValue):
            fits, held = _ir_type(old) == iv_probe.type, type_text(_ir_type(old))
        else:
            fits, held = isinstance(old, int) and not isinstance(old, bool), repr(old)
        if not fits:
            raise self.builder.error(
                f"'{name}', the variable of this runtime loop, holds {held} before it; after the "
                f"loop it holds the last {type_text(iv_probe.type)} index, or that old value if "
                f"the loop did not run, and a variable carried through a loop keeps one type",
                suggestion=f"name the loop variable differently, or give '{name}' an int before the loop")
        return name, iv_probe.type

    def visit_While(self, node: ast.While) -> None:
        if node.orelse:
            self.unsupported(node, "while ... else")
        loc = self.builder.loc
        before = self.scope
        carried = self.carried(node.body, before, {}, test=node.test)
        if carried is None:
            return  # a compile-time false condition: the loop never runs
        inits = tuple(self.as_handle(key, leaf_at(before, key), t) for key, t in carried)
        before_args = tuple(ir.Value(t, name) for name, t in carried)
        after_args = tuple(ir.Value(t, name) for name, t in carried)

        def bind(values):
            return with_leaves(before, {key: self.builder.wrap(v) for (key, _), v in zip(carried, values)})

        condition_ops = self.builder.push_block()
        self.scope = dict(before)
        self.scope.update(bind(before_args))
        self.dynamic_depth += 1
        try:
            condition, rematerialize = self.while_test(node.test)
            if not isinstance(condition, DynamicValue):
                condition = self.builder.wrap(self.as_handle("condition", bool(condition), i1))
            condition = self.scalar_condition(condition, "while")
            self.builder.emit(ir.Condition(condition=condition.handle, values=before_args, loc=loc))
        finally:
            self.dynamic_depth -= 1
            self.builder.pop_block()
        ops, after = self.region(node.body, before, bind(after_args))
        self.builder.push_block(ops)
        with self.builder.at(loc):
            yields = tuple(self.as_handle(key, leaf_at(after, key), t) for key, t in carried)
            self.builder.emit(ir.Yield(values=yields, loc=loc))
        self.builder.pop_block()
        results = tuple(ir.Value(t, name) for name, t in carried)
        self.builder.emit(ir.While(results=results, inits=inits,
                                   before=ir.Block(before_args, tuple(condition_ops)),
                                   after=ir.Block(after_args, tuple(ops)), rematerialize=rematerialize,
                                   loc=loc))
        self.finish_loop(before, after, carried, results, loc)

    def while_test(self, test: ast.expr) -> tuple[Any, bool]:
        """(condition, rematerialize) of a while loop's test, `ll.condition(...)` or not."""
        condition = self.visit(test)
        if not isinstance(condition, loop_condition):
            return condition, False
        if not isinstance(condition.rematerialize, bool):
            raise self.builder.error(f"ll.condition(..., rematerialize=) takes True or False, found "
                                     f"{condition.rematerialize!r}")
        return condition.test, condition.rematerialize

    def carried(self, body, before: dict, bindings: dict, test: Optional[ast.expr] = None):
        """The (name, type) of each variable a runtime loop carries, found by walking the
        body once into a discarded block. Variables keep their values for that walk, so a
        number that becomes a tensor in the body takes the tensor's type; if the walk fails
        (e.g. a tensor method called on a number), it is retried with the reassigned
        numbers as runtime scalars of their default types. For a `while` whose condition
        is a compile-time value: None when false.

        A number the walk saw unchanged may still change in the real loop, computed from a
        carried one (`y = i * 64` with `i` carried and 0 at the walk's end as before it):
        while such numbers remain, the body is walked again with the carried numbers as
        runtime scalars, and what changes then is carried too."""
        try:
            result = self.probe_loop(body, before, bindings, test, convert_numbers=False)
        except CompilationError:
            return self.probe_loop(body, before, bindings, test, convert_numbers=True)
        numbers = {n for n in assigned_names(body) if n in before and n not in bindings
                   and number_type(before[n]) is not None}
        while result:
            found = {key for key, _ in result}
            if not numbers - found or not numbers & found:
                break
            again = self.probe_loop(body, before, bindings, test, convert_numbers=False,
                                    runtime_names=numbers & found)
            new = [(key, type_) for key, type_ in again if key not in found]
            if not new:
                break
            result = result + new
        return result

    def probe_loop(self, body, before: dict, bindings: dict, test: Optional[ast.expr],
                   convert_numbers: bool, runtime_names: frozenset = frozenset()):
        loc = self.builder.loc
        reassigned = [n for n in sorted(assigned_names(body)) if n in before and n not in bindings]
        scratch = self.builder.push_block()
        probes = {}
        for name in reassigned if convert_numbers else sorted(runtime_names):
            if number_type(before[name]) is not None:
                probes[name] = self.builder.wrap(self.as_handle(name, before[name], number_type(before[name])))
        self.builder.pop_block()
        saved_scope = self.scope
        # Hidden parameters made in the discarded walk are made again in the real one (a
        # tensor map written in the loop takes its template parameter there).
        saved_hidden = dict(self.builder.hidden_params)
        self.builder.probing += 1
        try:
            if test is not None:
                self.builder.push_block(scratch)
                self.scope = dict(before)
                self.scope.update(probes)
                try:
                    condition = self.while_test(test)[0]
                finally:
                    self.builder.pop_block()
                if not isinstance(condition, DynamicValue):
                    if condition:
                        raise self.builder.error("this while loop's condition is a compile-time true "
                                                 "value, so it would never end",
                                                 suggestion="loop on a runtime condition")
                    return None
            _, after = self.region(body, before, {**probes, **bindings}, ops=scratch)
        finally:
            self.scope = saved_scope
            self.builder.hidden_params = saved_hidden
            self.builder.probing -= 1
        result = []
        with self.builder.at(loc):
            for name, old in before.items():
                if name in bindings:
                    continue
                start = probes.get(name, old)
                for key, _, new in self.differing(name, start, after.get(name, start)):
                    result.append((key, self.carried_type(key, leaf_at(before, key), new)))
        return result

    def differing(self, name: str, old: Any, new: Any) -> list:
        """(key, old leaf, new leaf) for each part of variable `name` that differs between
        two points of runtime control flow (aggregates and tuples are looked through)."""
        try:
            return differing_leaves(name, old, new, changed)
        except TypeError as error:
            raise CompilationError(str(error), self.assigned_at.get(name, self.builder.loc),
                                   suggestion=f"give '{name}' the same kind of value on every path")

    def carried_type(self, name: str, old: Any, new: Any) -> Type:
        if isinstance(old, DynamicValue):
            if isinstance(new, DynamicValue) and _ir_type(new) != _ir_type(old):
                self.as_handle(name, new, _ir_type(old))  # raises the type-change error
            return _ir_type(old)
        if number_type(old) is None:
            raise self.builder.error(
                f"'{name}' holds the compile-time value {old!r} and is reassigned inside a "
                f"runtime loop", suggestion="only numbers and tensors can change from one "
                                            "iteration to the next")
        if isinstance(new, DynamicValue):
            return _ir_type(new)  # a number before the loop adopts the body's type
        types_ = {number_type(old), number_type(new)}
        if None in types_:
            raise self.builder.error(f"'{name}' becomes {new!r} inside a runtime loop")
        return fp32 if fp32 in types_ else max(types_, key=lambda t: t.bits)

    def finish_loop(self, before: dict, after: dict, carried, results, loc: Loc,
                    exclude: frozenset = frozenset()) -> None:
        keys = {key for key, _ in carried}
        self.scope = dict(before)
        self.scope.update(with_leaves(before, {key: self.builder.wrap(r) for (key, _), r in zip(carried, results)}))
        for name in set(after) - set(before) | set(exclude):
            self.region_locals[name] = loc
        for name in before:
            missed = [key for key, _, _ in self.differing(name, before[name], after.get(name, before[name]))
                      if key not in keys]
            if missed:
                raise CompilationError(
                    f"'{missed[0]}' is reassigned in this loop only in the real walk of its body; "
                    f"weft could not carry it", self.assigned_at.get(name, loc),
                    suggestion=f"give '{name}' its final type before the loop")

    def index_type(self, bounds) -> ScalarType:
        result = i32
        for bound in bounds:
            if isinstance(bound, DynamicValue):
                type_ = bound.type
                if not isinstance(type_, ScalarType) or not type_.is_int or type_.is_bool:
                    raise self.builder.error(f"range() bounds must be integer scalars, found {type_text(type_)}")
                if type_.bits == 64:
                    result = i64
            elif isinstance(bound, bool) or not isinstance(bound, int):
                raise self.builder.error(f"range() bounds must be ints, found {bound!r}")
            elif number_type(bound) == i64:
                result = i64
        return result

    def index_value(self, bound: Any, type_: ScalarType) -> ir.Value:
        if not isinstance(bound, DynamicValue):
            return self.as_handle("", bound, type_)
        if bound.type == type_:
            return bound.handle
        result = ir.Value(type_)
        self.builder.emit(ir.Cast(result=result, operand=bound.handle, loc=self.builder.loc))
        return result


def _root(key: str) -> str:
    """The variable a carried key belongs to ('state' for 'state.acc')."""
    return split_key(key)[0] if key[:1].isidentifier() else key


def _ir_type(value: DynamicValue) -> Type:
    """The IR type of a runtime value. A language may show user code another view of it
    (a shared buffer's `.type` is Gluon's, holding the user's layout object); values carried
    through control flow are rebuilt from the IR type, so the wrapper the language gives them
    back is the one they had."""
    return value.handle.type


def _element(type_: Type):
    return type_.element if isinstance(type_, TensorType) else type_
