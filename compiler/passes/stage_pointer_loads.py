"""stage_pointer_loads: pointer loads that axis facts prove to be TMA boxes go by TMA.

Triton's tutorial matmul reads A and B through pointer tiles a loop advances:

    a_ptrs = a_ptr + rows[:, None] * stride_am + cols[None, :] * stride_ak
    for k in range(...):
        a = tl.load(a_ptrs, mask=(rows[:, None] < M) & (cols[None, :] < K - k * BLOCK_K), other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak

Such a load is a box of the tensor [M, K] at `a_ptr`: this pass replaces it by `desc.load`
of a tensor map the host encodes at each launch (a hidden parameter, as
make_tensor_descriptor's), which the TMA pipeliner rings (pipeline_tma_loops,
pipeline_tma_warp_specialize), where the cp.async rings (pipeline_dot_loops) took it. A load
is a box when

- it sits in a loop's body, feeds only dots (directly or through a permute), and every dot
  of that loop reads only such loads (pipeline_tma_loops rings a loop whose dots' operands
  are all boxes);
- its pointer is base + rows[:, None] * s_r + cols[None, :] * s_c (the two terms in either
  order, base a pointer parameter), rows = r0 + arange(R), cols = c0 + arange(C): computed in
  the body (r0, c0 may hold the induction variable: `offs_k = k + tl.arange(0, BK)`), or
  carried by the loop from such a start and advanced each iteration by a constant times
  the stride of one dim (the contiguous dim's stride is 1: a constant number of elements),
  nothing else reading it (the carried tile is dropped);
- one of s_r, s_c is the constant 1 (a parameter specialized to 1 is) and the other an int
  parameter or constant whose bytes, like the base's address, axis analysis (launch
  specialization) proves a multiple of 16: the TMA unit faults on other tensor maps (the
  specialization does not tell a negative stride, which no tensor map has: a launch with
  one takes the variant compiled with pointer_tma=False, runtime/jit.py);
- its mask is absent or (rows[:, None] < R_bound) & (cols[None, :] < C_bound) (either or
  both terms, the same rows and cols), each bound in absolute coordinates, once the advance
  is added, the same every iteration (the tutorial's `cols < K - k * BLOCK_K` is
  absolute_col < K) and an expression of int parameters; `other` is 0 (TMA fills zeros).

The tensor map is then [R_bound, C_bound] over the base with the strided dim's stride; a
dim without a mask has the extent of every coordinate a box can take (TMA_MAX_COORDINATE):
every element the box reads there the pointer load reads too, so the program is as correct
as it was. The box's coordinates
are the tile's absolute ones, r0 and c0 plus the advance times the iterations done, from
the loop's induction variable. Rows that wrap (`rows % M`, as Triton's tutorial 03 writes
them) are not an arange plus a scalar: such loads keep the cp.async path, as every load
this pass does not prove a box does (silently).

The frontend's box (highlevel/pointer_tma.py) is made by a callback, so that the compiler
imports no language.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

from ..hardware import TMA_GLOBAL_ALIGN, TMA_MAX_COORDINATE
from ..ir import (AddPtr, Arange, Binary, Block, Broadcast, Compare, Constant, Dot, ExpandDims, For, Kernel, Load,
                  Op, Permute, Splat, Value)
from ..types import PointerType, i32, tensor_descriptor_type
from .pipeline_dot_loops import substitute
from .stage_block_pointers import _affine, _readers
from .rewrite import rewrite_kernel

# An absolute bound or stride as the host computes it from the arguments
# (runtime/made_tensor_descriptor.py's recipe expressions).
Expression = tuple


@dataclasses.dataclass(frozen=True, eq=False)
class PointerBox:
    """A pointer load proven a TMA box, in the load's dims (0: rows, 1: cols)."""

    load: Load = dataclasses.field(repr=False)
    loop: For = dataclasses.field(repr=False)
    carried: Optional[int]             # the pointer's index among the loop's carried values (None:
                                       # computed in the body, from the induction variable)
    base: Value                        # the pointer parameter the tensor map is over
    starts: tuple                      # per dim, the tile's first index (an i32 scalar, or None: 0)
    sizes: tuple[int, int]
    contiguous: int                    # the dim whose stride is 1
    stride: Expression                 # the other dim's stride (elements)
    advance: tuple[int, int]           # elements per iteration, per dim
    bounds: tuple[Expression, Expression]  # absolute extents of the tensor map, per dim


# (box, its coordinates in map order (outermost first), where) -> (ops, the tile in the
# load's dims, the tensor map's hidden parameter key and value).
BoxBuilder = Callable[[PointerBox, tuple, object], tuple]


def stage_pointer_loads(kernel: Kernel, build_box: BoxBuilder) -> Kernel:
    boxes = pointer_boxes(kernel)
    if not boxes:
        return kernel
    definitions = {result: op for op in kernel.walk() for result in op.defines()}
    replaced: dict[Value, Value] = {}
    replacement: dict[int, list[Op]] = {}
    dropped_carried: dict[Value, set[int]] = {}
    params, keys = list(kernel.params), list(kernel.hidden_params)
    divisibility = list(kernel.param_divisibility or (1,) * len(params))
    for box in boxes:
        ops: list[Op] = []
        coords = tuple(_coordinate(ops, box, dim, definitions) for dim in _map_dims(box))
        made, tile, key, param = build_box(box, coords, box.load.loc)
        if key not in keys:
            params.append(param)
            keys.append(key)
            divisibility.append(1)
        replaced[box.load.result] = tile
        replacement[id(box.load)] = ops + list(made)
        # By the induction variable: the loop is rebuilt (its body rewritten) before the rule sees it.
        if box.carried is not None:
            dropped_carried.setdefault(box.loop.body.args[0], set()).add(box.carried)

    def rule(op: Op):
        if id(op) in replacement:
            return replacement[id(op)]
        if isinstance(op, For) and op.body.args[0] in dropped_carried:
            return _without_carried(op, dropped_carried[op.body.args[0]])
        return substitute(op, replaced)

    kernel = rewrite_kernel(kernel, rule)
    kernel = dataclasses.replace(kernel, params=tuple(params), hidden_params=tuple(keys),
                                 param_divisibility=tuple(divisibility))
    return kernel.with_body(_without_dead_arithmetic(kernel.body))


def _map_dims(box: PointerBox) -> tuple[int, int]:
    """The load's dims in the tensor map's order, outermost first (the contiguous one last)."""
    return (1 - box.contiguous, box.contiguous)


def _coordinate(ops: list, box: PointerBox, dim: int, definitions: dict) -> Value:
    start = box.starts[dim]
    if start is None:
        start = Value(i32)
        ops.append(Constant(result=start, value=0, loc=box.load.loc))
    step = _constant_of(box.loop.step, definitions)
    return _affine(ops, box.loop, start, box.advance[dim], step, box.load.loc)


def _without_carried(loop: For, indices: set[int]) -> For:
    keep = [i for i in range(len(loop.inits)) if i not in indices]
    yields = loop.body.ops[-1]
    body = Block((loop.body.args[0], *(loop.body.args[1 + i] for i in keep)),
                 loop.body.ops[:-1] + (dataclasses.replace(yields, values=tuple(yields.values[i] for i in keep)),))
    return dataclasses.replace(loop, inits=tuple(loop.inits[i] for i in keep),
                               results=tuple(loop.results[i] for i in keep), body=body)


# Ops without effects: dropped once nothing reads them (the pointer tiles and masks of the
# loads this pass replaced).
_PURE = (AddPtr, Arange, Binary, Broadcast, Compare, Constant, ExpandDims, Splat)


def _without_dead_arithmetic(block: Block) -> Block:
    while True:
        read = {value for op in block.walk() for value in op.uses()}
        dead = {id(op) for op in block.walk()
                if isinstance(op, _PURE) and not any(value in read for value in op.defines())}
        if not dead:
            return block
        block = _drop(block, dead)


def _drop(block: Block, dead: set[int]) -> Block:
    ops = [op.map_regions(lambda region: _drop(region, dead)) for op in block.ops if id(op) not in dead]
    return Block(block.args, tuple(ops))


# ------------------------------------------------------------------ proving a box
def pointer_boxes(kernel: Kernel) -> list[PointerBox]:
    """The pointer loads this pass makes boxes, loop by loop (all of a loop's dot operands
    or none of them)."""
    definitions = {result: op for op in kernel.walk() for result in op.defines()}
    readers = _readers(kernel.body)
    hidden = len(kernel.hidden_params)
    own = kernel.params[:len(kernel.params) - hidden] if hidden else kernel.params
    names = {value: value.hint for value in own}
    divisibility = dict(zip(kernel.params, kernel.param_divisibility or ()))
    facts = _Facts(definitions, readers, names, divisibility)
    found = []
    for loop in (op for op in kernel.walk() if isinstance(op, For)):
        dots = [op for op in loop.body.ops if isinstance(op, Dot)]
        if not dots:
            continue
        loads = {op.result: op for op in loop.body.ops if isinstance(op, Load)}
        operands = [_through_permute(value, definitions) for dot in dots for value in (dot.a, dot.b)]
        if not all(value in loads for value in operands):
            continue
        boxes = [facts.box(loads[value], loop) for value in dict.fromkeys(operands)]
        if all(box is not None for box in boxes):
            found.extend(boxes)
    return found


def _through_permute(value: Value, definitions: dict) -> Value:
    op = definitions.get(value)
    return op.operand if isinstance(op, Permute) else value


def _constant_of(value: Value, definitions: dict) -> Optional[int]:
    op = definitions.get(value)
    return int(op.value) if isinstance(op, Constant) and not isinstance(op.value, float) else None


@dataclasses.dataclass
class _Facts:
    definitions: dict
    readers: dict
    names: dict          # the kernel's own parameters, by value
    divisibility: dict

    def op(self, value: Value) -> Optional[Op]:
        return self.definitions.get(value)

    def strip(self, value: Value) -> Value:
        while isinstance(self.op(value), Broadcast):
            value = self.op(value).operand
        return value

    def constant(self, value: Value) -> Optional[int]:
        op = self.op(self.strip(value))
        if isinstance(op, Splat):
            op = self.op(op.operand)
        if isinstance(op, Constant) and isinstance(op.value, int) and not isinstance(op.value, bool):
            return op.value
        return None

    def box(self, load: Load, loop: For) -> Optional[PointerBox]:
        if len(load.result.type.shape) != 2 or not self._feeds_dots(load.result):
            return None
        if load.mask is not None and not self._zero(load.other):
            return None
        args = loop.body.args
        carried = args.index(load.pointer) - 1 if load.pointer in args[1:] else None
        tile = self._tile(load.pointer if carried is None else loop.inits[carried])
        if tile is None:
            return None
        base, vectors, strides = tile
        element = base.type.pointee
        itemsize = element.bits // 8
        if 1 not in strides or strides == (1, 1) or self.divisibility.get(base, 1) % TMA_GLOBAL_ALIGN:
            return None
        contiguous = strides.index(1)
        try:  # a box TMA can copy: each dim at most 256, the contiguous one a multiple of 16 bytes
            tensor_descriptor_type(element, tuple(vectors[d][1] for d in (1 - contiguous, contiguous)))
        except ValueError:
            return None
        stride = strides[1 - contiguous]
        stride_expression = self._expression_of_stride(stride, itemsize)
        # A pointer computed in the body is at its absolute place already: its starts hold
        # the induction variable, and the pipeliner recomputes them for each copy's iteration.
        advance = (0, 0) if carried is None else self._advance(loop, carried, load, stride, contiguous)
        step, lower = _constant_of(loop.step, self.definitions), _constant_of(loop.lower, self.definitions)
        if stride_expression is None or advance is None or step is None or step <= 0 or lower is None:
            return None
        if any(a % step for a in advance):
            return None
        bounds = self._bounds(load.mask, vectors, advance, loop, lower, step)
        if bounds is None:
            return None
        return PointerBox(load=load, loop=loop, carried=carried, base=base, starts=tuple(v[0] for v in vectors),
                          sizes=tuple(v[1] for v in vectors), contiguous=contiguous, stride=stride_expression,
                          advance=advance, bounds=bounds)

    def _zero(self, value: Optional[Value]) -> bool:
        op = self.op(self.strip(value)) if value is not None else None
        return isinstance(op, Constant) and op.value == 0

    def _feeds_dots(self, tile: Value) -> bool:
        users = self.readers.get(tile, [])
        for op in users:
            if isinstance(op, Permute):
                if not all(isinstance(user, Dot) and op.result in (user.a, user.b)
                           for user in self.readers.get(op.result, [None])):
                    return False
            elif not isinstance(op, Dot) or tile not in (op.a, op.b):
                return False
        return bool(users)

    def _tile(self, pointers: Value):
        """(base parameter, per dim (start, size) of its index vector, per dim stride: 1, an
        int or a scalar value) of base + rows[:, None] * s_r + cols[None, :] * s_c."""
        terms: list = []
        base = None
        stack = [pointers]
        while stack:
            value = self.strip(stack.pop())
            op = self.op(value)
            if isinstance(op, AddPtr):
                stack.append(op.pointer)
                terms.extend(self._offset_terms(op.offset) or [None])
            elif isinstance(op, Splat) and op.operand in self.names and isinstance(op.operand.type, PointerType):
                if base is not None:
                    return None
                base = op.operand
            else:
                return None
        if base is None or None in terms or sorted(t[0] for t in terms) != [0, 1]:
            return None
        terms.sort(key=lambda t: t[0])
        vectors = tuple((*self._index_vector(t[1]), t[1]) for t in terms)
        if any(size is None for _, size, _ in vectors):
            return None
        return base, vectors, tuple(t[2] for t in terms)

    def _offset_terms(self, offset: Value) -> Optional[list]:
        value = self.strip(offset)
        op = self.op(value)
        if isinstance(op, Binary) and op.kind == "add":
            lhs, rhs = self._offset_terms(op.lhs), self._offset_terms(op.rhs)
            return None if lhs is None or rhs is None else lhs + rhs
        stride = 1
        if isinstance(op, Binary) and op.kind == "mul":
            for this, other in ((op.lhs, op.rhs), (op.rhs, op.lhs)):
                if isinstance(self.op(self.strip(this)), ExpandDims):
                    stride = self._stride(other)
                    op = self.op(self.strip(this))
                    break
        if not isinstance(op, ExpandDims) or stride is None or len(op.result.type.shape) != 2:
            return None
        return [(1 - op.axis, op.operand, stride)]

    def _stride(self, value: Value):
        number = self.constant(value)
        if number is not None:
            return number
        op = self.op(self.strip(value))
        return op.operand if isinstance(op, Splat) else None

    def _index_vector(self, vector: Value):
        """(start scalar or None for 0, size) of start + arange(0, size); size None: not that."""
        op = self.op(vector)
        if isinstance(op, Arange) and op.start == 0:
            return None, op.end
        if isinstance(op, Binary) and op.kind == "add":
            for this, other in ((op.lhs, op.rhs), (op.rhs, op.lhs)):
                arange, splat = self.op(this), self.op(other)
                if isinstance(arange, Arange) and arange.start == 0 and isinstance(splat, Splat):
                    return splat.operand, arange.end
        return None, None

    def _expression_of_stride(self, stride, itemsize: int) -> Optional[Expression]:
        if isinstance(stride, int):
            return ("const", stride) if stride > 0 and stride * itemsize % TMA_GLOBAL_ALIGN == 0 else None
        if stride not in self.names or (self.divisibility.get(stride, 1) * itemsize) % TMA_GLOBAL_ALIGN:
            return None
        return ("param", self.names[stride])

    def _advance(self, loop: For, carried: int, load: Load, stride, contiguous: int) -> Optional[tuple[int, int]]:
        """Elements per iteration along each dim of the loop's `pointer += delta`, where
        nothing but the load and the advance reads the pointer."""
        arg, yielded = loop.body.args[1 + carried], loop.body.ops[-1].values[carried]
        step = self.op(yielded)
        if not isinstance(step, AddPtr) or step.pointer is not arg:
            return None
        if {id(op) for op in self.readers.get(arg, [])} != {id(load), id(step)} or \
                [id(op) for op in self.readers.get(yielded, [])] != [id(loop.body.ops[-1])] or \
                self.readers.get(loop.results[carried]):
            return None
        delta = self.strip(step.offset)
        if isinstance(self.op(delta), Splat):
            delta = self.op(delta).operand
        advance = [0, 0]
        number = self.constant(delta)
        if number is not None:
            advance[contiguous] = number
            return tuple(advance)
        op = self.op(delta)
        if isinstance(op, Binary) and op.kind == "mul" and not isinstance(stride, int):
            for this, other in ((op.lhs, op.rhs), (op.rhs, op.lhs)):
                number = self.constant(other)
                if this is stride and number is not None:
                    advance[1 - contiguous] = number
                    return tuple(advance)
        return None

    def _bounds(self, mask: Optional[Value], vectors, advance, loop: For, lower: int, step: int):
        bounds: list = [("const", TMA_MAX_COORDINATE), ("const", TMA_MAX_COORDINATE)]
        masked: set[int] = set()
        pending = [] if mask is None else [mask]
        while pending:
            value = self.strip(pending.pop())
            op = self.op(value)
            if isinstance(op, Binary) and op.kind == "and":
                pending += [op.lhs, op.rhs]
                continue
            if not isinstance(op, Compare) or op.predicate != "lt":
                return None
            index, limit = self.op(self.strip(op.lhs)), self.op(self.strip(op.rhs))
            if not isinstance(index, ExpandDims) or not isinstance(limit, Splat):
                return None
            dim = 1 - index.axis
            if dim in masked or index.operand is not vectors[dim][2]:
                return None
            form = _linear(limit.operand, loop, self.definitions)
            if form is None:
                return None
            # index + trips * advance < limit(iv), trips = (iv - lower) / step.
            per_iv = advance[dim] // step
            form = _plus(form, {_IV: per_iv, _ONE: -lower * per_iv})
            if form.get(_IV, 0) or not all(atom is _ONE or atom in self.names for atom in form):
                return None
            bounds[dim] = _expression(form, self.names)
            masked.add(dim)
        return tuple(bounds)


_IV, _ONE = "iv", "one"


def _linear(value: Value, loop: For, definitions: dict) -> Optional[dict]:
    """`value` as {atom: coefficient} (atoms: _IV, _ONE, values defined outside the loop)."""
    if value is loop.body.args[0]:
        return {_IV: 1}
    op = definitions.get(value)
    if isinstance(op, Constant) and isinstance(op.value, int):
        return {_ONE: op.value}
    if isinstance(op, Binary) and op.kind in ("add", "sub", "mul"):
        lhs, rhs = _linear(op.lhs, loop, definitions), _linear(op.rhs, loop, definitions)
        if lhs is None or rhs is None:
            return None
        if op.kind == "add":
            return _plus(lhs, rhs)
        if op.kind == "sub":
            return _plus(lhs, {atom: -c for atom, c in rhs.items()})
        for this, other in ((lhs, rhs), (rhs, lhs)):
            if set(other) <= {_ONE}:
                return {atom: c * other.get(_ONE, 0) for atom, c in this.items()}
        return None
    if value in (arg for arg in loop.body.args) or any(value in op.defines() for op in loop.body.walk()):
        return None
    return {value: 1}


def _plus(a: dict, b: dict) -> dict:
    total = dict(a)
    for atom, c in b.items():
        total[atom] = total.get(atom, 0) + c
    return {atom: c for atom, c in total.items() if c}


def _expression(form: dict, names: dict) -> Expression:
    expression = ("const", form.get(_ONE, 0))
    for atom, c in form.items():
        if atom is _ONE:
            continue
        term = ("param", names[atom]) if c == 1 else ("mul", ("const", c), ("param", names[atom]))
        expression = term if expression == ("const", 0) else ("add", expression, term)
    return expression
