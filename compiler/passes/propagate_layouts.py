"""propagate_layouts: give every tensor a layout, with as few conversions as possible.

The anchors are the global accesses `coalesce` placed (and the cp.async copies that
`pipeline_dot_loops` made of some, in the same layouts) and the accumulators of the dots
`accelerate_dots` placed (their conversions are removed first). From them:

1. Forward propagation, to a fixpoint: an op whose operands have layouts gets a result
   layout from its rule (`LAYOUT_RULES`): elementwise ops keep their operands' layout
   (when operands disagree, the one that is cheapest to reach wins: a broadcast can be
   redone from its smaller operand), a reduction gives the slice of its operand's
   layout, expand_dims the parent of a slice, a broadcast the operand's layout
   description at the new shape, a reshape the operand's layout re-indexed. Loop-carried values take the layout of the value
   yielded back (converting it would cost every iteration), else of the initial value.
   A store keeps its anchor unless the value descends from a larger load (a reduction's
   result): then the store is made from the value's layout.
2. Free values (arange, splat, constants, and elementwise or shape ops on those only)
   get no layout of their own: each is rematerialized in every layout its consumers
   need. A value still without a layout that is not free (a loop-carried value nothing
   placed, a reduction of a free tensor) takes the layout its first consumer needs, or a
   default blocked layout; then step 1 runs again.
3. Rewriting: every consumer asks for its operand in the layout its rule needs. A value
   in another layout is converted once, right after its definition, or its op is redone
   there from operands in that layout: always for broadcast, expand_dims, permute and
   reshape (their operands are never larger), and for elementwise ops when that moves no more
   bits (the reduced column, not the tile it was broadcast to; a narrowing cast's result,
   not its wider operand: an fp32 accumulator stored as fp16 converts at 16 bits). Dead
   ops are dropped at the end.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Callable, Optional

from ...layouts import (DotOperandLayout, LayoutError, LinearDistributedLayout, LinearLayout, NVMMADistributedLayout,
                       slice_layout)
from ...layouts import rules as layout_rules
from ..errors import UNKNOWN_LOC, CompilationError
from ..ir import (ATOMICS, AddPtr, Arange, AsyncCopyGlobalToShared, AxisHint, Binary, Bitcast, Block, Broadcast, Cast,
                  Compare, Constant, ConvertLayout, ExpandDims, Fma, For, If, Kernel, Load, MmaV2, NumPrograms, Op,
                  Permute, ProgramId, Reduce, ReplicaIndex, Reshape, SharedLoad, SharedStore, Splat, Store, Unary, Value,
                  WarpgroupMma, WarpgroupMmaWait, WarpSpecialize, Where, While)
from ..types import TensorType
from .coalesce import Placement, default_blocked, map_operands, normalized, strip_anchors

NAME = "propagate_layouts"

ELEMENTWISE = (Binary, Unary, Compare, Fma, Where, Cast, Bitcast, AddPtr, AxisHint)
SOURCES = (Arange, Splat, Constant)  # tensors made from nothing: free in any layout
DERIVED = (ExpandDims, Broadcast, Permute, Reshape)  # no data moves: redone in another layout for free
CHEAP = SOURCES + ELEMENTWISE + DERIVED
# Ops redone from converted operands when that moves no more elements than converting the
# result (and always, for the derived ones: their operands are never larger).
REDONE = DERIVED + ELEMENTWISE
PURE = CHEAP + (Reduce, ConvertLayout, Load, SharedLoad, ProgramId, NumPrograms, ReplicaIndex)


@dataclasses.dataclass(frozen=True)
class Decision:
    """An op's layouts: its tensor result's (None for a scalar result) and the one each
    operand must arrive in (in `op.uses()` order; None where any will do)."""

    result: Optional[Placement]
    operands: tuple[Optional[Placement], ...]


class LayoutRules:
    """Per-op layout rules, registered with decorators next to each op family.

    forward(op, operand placements, ctx) -> Decision or None (no opinion yet);
    backward(op, result placement, ctx) -> Decision producing (about) that result.
    """

    def __init__(self, forward=None, backward=None):
        self.forward_rules: dict[type, Callable] = dict(forward or {})
        self.backward_rules: dict[type, Callable] = dict(backward or {})

    def forward(self, *op_types: type):
        return _registrar(self.forward_rules, op_types)

    def backward(self, *op_types: type):
        return _registrar(self.backward_rules, op_types)

    def copy(self) -> "LayoutRules":
        return LayoutRules(self.forward_rules, self.backward_rules)


def _registrar(table: dict, op_types: tuple):
    def register(fn):
        table.update({t: fn for t in op_types})
        return fn
    return register


LAYOUT_RULES = LayoutRules()


def _tensor(value: Value) -> bool:
    return isinstance(value.type, TensorType)


def _numel(value: Value) -> int:
    return value.type.num_elements


def _bits(value: Value) -> int:
    """What converting `value` moves: a narrowing cast converted after it moves less."""
    return value.type.num_elements * value.type.element.bits


def describe(layout: LinearLayout, candidates) -> Placement:
    """`layout` with the first candidate description that gives exactly it, else a
    LinearDistributedLayout of it."""
    layout = normalized(layout)
    shape = tuple(layout.out_dims.values())
    for encoding in candidates:
        if encoding is None:
            continue
        try:
            if normalized(encoding.to_linear(shape)) == layout:
                return Placement(layout, encoding)
        except (LayoutError, AttributeError, ValueError, TypeError):
            continue
    return Placement(layout, LinearDistributedLayout.from_linear(layout))


# ------------------------------------------------------------------ the rules
@LAYOUT_RULES.forward(*ELEMENTWISE)
def _elementwise_forward(op: Op, operands, ctx) -> Optional[Decision]:
    candidates = []
    for placement in operands:
        if placement is not None and placement not in candidates:
            candidates.append(placement)
    if not candidates:
        return None
    values = op.uses()
    # The layout the other operands reach most cheaply; earlier operands win ties.
    chosen = min(candidates, key=lambda p: sum(ctx.cost(v, p) for v in values if _tensor(v)))
    return _elementwise_backward(op, chosen, ctx)


@LAYOUT_RULES.backward(*ELEMENTWISE, *SOURCES)
def _elementwise_backward(op: Op, result: Placement, ctx) -> Decision:
    return Decision(result, tuple(result if _tensor(v) else None for v in op.uses()))


@LAYOUT_RULES.forward(*ATOMICS)
def _atomic_forward(op: Op, operands, ctx) -> Optional[Decision]:
    """Elementwise on its operands; never redone in another layout (it writes memory)."""
    return _elementwise_forward(op, operands, ctx)


LAYOUT_RULES.backward(*ATOMICS)(_elementwise_backward)


@LAYOUT_RULES.forward(Load, Store, AsyncCopyGlobalToShared)
def _access_forward(op: Op, operands, ctx) -> Optional[Decision]:
    """A load in its anchor. A store too, unless the value stored descends from a larger
    access (a reduction's result, say): then the store takes the value's layout, since
    converting the value would cost more than a less coalesced small store."""
    anchor = ctx.anchors.get(id(op))
    if anchor is None:  # an access coalesce did not place: elementwise on its operands
        return _elementwise_forward(op, operands, ctx)
    if isinstance(op, Store) and operands:
        value = operands[1]
        if value is not None and value != anchor and ctx.weight(op.value) > _numel(op.value):
            anchor = value
    return Decision(anchor if isinstance(op, Load) else None,
                    tuple(anchor if _tensor(v) else None for v in op.uses()))


@LAYOUT_RULES.backward(Load, Store, AsyncCopyGlobalToShared)
def _access_backward(op: Op, result: Placement, ctx) -> Decision:
    return _access_forward(op, (), ctx) if id(op) in ctx.anchors else _elementwise_backward(op, result, ctx)


@LAYOUT_RULES.forward(Reduce)
def _reduce_forward(op: Reduce, operands, ctx) -> Optional[Decision]:
    (source,) = operands
    if source is None:
        return None
    if not _tensor(op.result):
        return Decision(None, (source,))
    layout = slice_layout(source.layout, op.axis)
    slice_ = source.encoding.reduced(op.axis) if source.encoding is not None else None
    return Decision(describe(layout, [slice_]), (source,))


@LAYOUT_RULES.backward(Reduce)
def _reduce_backward(op: Reduce, result: Placement, ctx) -> Decision:
    """Reduce the parent of the wanted slice when it is one; else a default layout."""
    shape = op.operand.type.shape
    parent = result.encoding.expanded(op.axis) if result.encoding is not None else None
    if parent is not None:
        try:
            source = describe(parent.to_linear(shape), [parent])
            return _reduce_forward(op, (source,), ctx)
        except (LayoutError, ValueError, TypeError):
            pass
    return _reduce_forward(op, (ctx.default(op.operand),), ctx)


@LAYOUT_RULES.forward(ExpandDims)
def _expand_dims_forward(op: ExpandDims, operands, ctx) -> Optional[Decision]:
    (source,) = operands
    if source is None:
        return None
    layout = layout_rules.expand_dims_layout(source.layout, op.axis)
    parent = source.encoding.expanded(op.axis) if source.encoding is not None else None
    return Decision(describe(layout, [parent]), (source,))


@LAYOUT_RULES.backward(ExpandDims)
def _expand_dims_backward(op: ExpandDims, result: Placement, ctx) -> Decision:
    layout = slice_layout(result.layout, op.axis)
    slice_ = result.encoding.reduced(op.axis) if result.encoding is not None else None
    return _expand_dims_forward(op, (describe(layout, [slice_]),), ctx)


@LAYOUT_RULES.forward(Broadcast)
def _broadcast_forward(op: Broadcast, operands, ctx) -> Optional[Decision]:
    """The operand's layout description at the new shape, if its threads already hold
    what they need there; else no opinion (the consumers decide)."""
    (source,) = operands
    if source is None or source.encoding is None:
        return None
    try:
        layout = source.encoding.to_linear(op.result.type.shape)
        layout_rules.broadcast_register_map(source.layout, layout)
    except (LayoutError, ValueError, TypeError):
        return None
    return Decision(describe(layout, [source.encoding]), (source,))


@LAYOUT_RULES.backward(Broadcast)
def _broadcast_backward(op: Broadcast, result: Placement, ctx) -> Decision:
    """Any result layout: the operand is its restriction to the size-1 dims."""
    layout = result.layout
    for dim, (have, want) in enumerate(zip(op.operand.type.shape, op.result.type.shape)):
        if have != want:
            layout = layout_rules.expand_dims_layout(slice_layout(layout, dim), dim)
    return Decision(result, (describe(layout, [result.encoding]),))


@LAYOUT_RULES.forward(Permute)
def _permute_forward(op: Permute, operands, ctx) -> Optional[Decision]:
    (source,) = operands
    if source is None:
        return None
    layout = layout_rules.permute_layout(source.layout, op.order)
    permuted = source.encoding.permuted(op.order) if source.encoding is not None else None
    return Decision(describe(layout, [permuted]), (source,))


@LAYOUT_RULES.backward(Permute)
def _permute_backward(op: Permute, result: Placement, ctx) -> Decision:
    inverse = tuple(op.order.index(d) for d in range(len(op.order)))
    layout = layout_rules.permute_layout(result.layout, inverse)
    permuted = result.encoding.permuted(inverse) if result.encoding is not None else None
    source = describe(layout, [permuted])
    return _permute_forward(op, (source,), ctx)


@LAYOUT_RULES.forward(Reshape)
def _reshape_forward(op: Reshape, operands, ctx) -> Optional[Decision]:
    """The operand's layout re-indexed row-major: every register stays where it is."""
    (source,) = operands
    if source is None:
        return None
    layout = layout_rules.reshape_layout(source.layout, op.result.type.shape)
    return Decision(describe(layout, []), (source,))


@LAYOUT_RULES.backward(Reshape)
def _reshape_backward(op: Reshape, result: Placement, ctx) -> Decision:
    """The wanted layout re-indexed back to the operand's shape (a reshape is invertible)."""
    source = describe(layout_rules.reshape_layout(result.layout, op.operand.type.shape), [])
    return _reshape_forward(op, (source,), ctx)


@LAYOUT_RULES.forward(WarpgroupMma, MmaV2)
def _mma_forward(op: Op, operands, ctx) -> Optional[Decision]:
    """The accumulator layout accelerate_dots chose: the anchor, for acc and result; a
    wgmma's register A arrives in the A fragment of that accumulator."""
    anchor = ctx.anchors[id(op)]
    operands = []
    for value in op.uses():
        if isinstance(op, WarpgroupMma) and value is op.a and _tensor(value):
            operands.append(register_a_placement(value.type, anchor.encoding))
        else:
            operands.append(anchor if _tensor(value) else None)
    return Decision(anchor, tuple(operands))


def register_a_placement(type_: TensorType, acc: NVMMADistributedLayout) -> Placement:
    """wgmma's register A fragment for an accumulator in `acc` (PTX ISA 9.7.15.5.1.1)."""
    encoding = DotOperandLayout(0, acc, 32 // type_.element.bits)
    return Placement(encoding.to_linear(type_.shape), encoding)


@LAYOUT_RULES.forward(WarpgroupMmaWait)
def _wgmma_wait_forward(op: WarpgroupMmaWait, operands, ctx) -> Optional[Decision]:
    (source,) = operands  # accelerate_dots waits for one accumulator at a time
    return None if source is None else Decision(source, (source,))


@LAYOUT_RULES.backward(WarpgroupMmaWait)
def _wgmma_wait_backward(op: WarpgroupMmaWait, result: Placement, ctx) -> Decision:
    return Decision(result, (result,))


@LAYOUT_RULES.forward(SharedStore)
def _shared_store_forward(op: SharedStore, operands, ctx) -> Optional[Decision]:
    """A value is stored from whatever layout it has (the buffer's layout addresses it)."""
    return Decision(None, operands)


@LAYOUT_RULES.forward(SharedLoad)
def _shared_load_forward(op: SharedLoad, operands, ctx) -> Optional[Decision]:
    """A read of a buffer (a tensor descriptor's box) in the registers its op chose."""
    anchor = ctx.anchors.get(id(op))
    return None if anchor is None else Decision(anchor, (None,))


@LAYOUT_RULES.forward(ConvertLayout)
def _placed_conversion_forward(op: ConvertLayout, operands, ctx) -> Optional[Decision]:
    """A conversion an earlier pass placed (accelerate_dots renames the registers of a
    transposed box's read): into the layout it names, from whatever its operand has."""
    anchor = ctx.anchors.get(id(op))
    return None if anchor is None else Decision(anchor, (None,))


LAYOUT_RULES.backward(ConvertLayout)(lambda op, result, ctx: _placed_conversion_forward(op, (), ctx))


@LAYOUT_RULES.backward(SharedLoad)
def _shared_load_backward(op: SharedLoad, result: Placement, ctx) -> Decision:
    """A read no op chose registers for (a row load's ring slot, pipeline_row_loads) reads
    straight into the layout its reader needs."""
    return Decision(result, (None,))


# ------------------------------------------------------------------ the analysis
@dataclasses.dataclass(eq=False)
class Carried:
    """One loop-carried or if-yielded tensor: the values it defines (block args, op
    results) share a layout; the values flowing into it are converted to that layout."""

    defined: tuple[Value, ...]
    sources: tuple[Value, ...]  # in order of preference: the values yielded back come first
    placement: Optional[Placement] = None


class Propagation:
    """Layouts for one kernel: the analysis (steps 1 and 2) and the rewrite (step 3)."""

    def __init__(self, kernel: Kernel, anchors: dict, rules: LayoutRules):
        self.kernel, self.anchors, self.rules = kernel, anchors, rules
        self.order: list[Op] = []
        self.producer: dict[Value, Op] = {}
        self.uses: dict[Value, list[tuple[Op, int]]] = defaultdict(list)
        self.carried: list[Carried] = []
        self.carried_of: dict[Value, Carried] = {}
        self.carried_use: dict[tuple[int, int], Carried] = {}
        self.placed: dict[Value, Placement] = {}
        self.decided: dict[int, Decision] = {}
        self._free: dict[Value, bool] = {}
        self._demand: dict[Value, list[Placement]] = {}
        self._weight: dict[Value, int] = {}
        self._costs: dict[tuple, tuple[Optional[Decision], int]] = {}
        self._scan(kernel.body)

    # -------------------------------------------------------------- structure
    def _scan(self, block: Block) -> None:
        for op in block.ops:
            self.order.append(op)
            for result in op.defines():
                self.producer[result] = op
            for index, value in enumerate(op.uses()):
                self.uses[value].append((op, index))
            if isinstance(op, For):
                self._carry(op.body.args[1:], op.results, [(op, 3 + i, v) for i, v in enumerate(op.inits)],
                            op.body.ops[-1], 0)
            elif isinstance(op, While):
                self._carry(op.before.args, (), [(op, i, v) for i, v in enumerate(op.inits)], op.after.ops[-1], 0)
                self._carry(op.after.args, op.results, [], op.before.ops[-1], 1)
            elif isinstance(op, If) and op.results:
                self._carry((), op.results, [], op.then_body.ops[-1], 0, op.else_body.ops[-1])
            elif isinstance(op, WarpSpecialize) and op.results:  # the default partition's yield
                self._carry((), op.results, [], op.default.ops[-1], 0)
            for region in op.nested_blocks():
                self._scan(region)

    def _carry(self, args, results, inits, terminator, first, other_terminator=None) -> None:
        """Tie each carried position's block arg, result, initial and yielded values."""
        count = max(len(args), len(results))
        for i in range(count):
            defined = tuple(v[i] for v in (args, results) if v)
            if not _tensor(defined[0]):
                continue
            flows = [(terminator, first + i, terminator.values[i])]
            if other_terminator is not None:
                flows.append((other_terminator, i, other_terminator.values[i]))
            if inits:
                flows.append(inits[i])
            carried = Carried(defined, tuple(v for _, _, v in flows))
            self.carried.append(carried)
            for value in defined:
                self.carried_of[value] = carried
            for op, index, _ in flows:
                self.carried_use[(id(op), index)] = carried

    # -------------------------------------------------------------- queries used by rules
    def default(self, value: Value) -> Placement:
        return default_blocked(value.type.shape, self.kernel.num_warps)

    def is_free(self, value: Value) -> bool:
        """No layout of its own: built from arange/splat/constants by cheap ops only."""
        if value not in self._free:
            op = self.producer.get(value)
            self._free[value] = value not in self.placed and isinstance(op, CHEAP) and \
                all(self.is_free(v) for v in op.uses() if _tensor(v))
        return self._free[value]

    def weight(self, value: Value) -> int:
        """The size of the largest load whose layout reached `value`."""
        if value not in self._weight:
            self._weight[value] = 0  # a loop-carried cycle adds nothing
            op = self.producer.get(value)
            if isinstance(op, Load):
                found = _numel(value)
            elif value in self.carried_of:
                found = max(self.weight(v) for v in self.carried_of[value].sources)
            else:
                found = max((self.weight(v) for v in (op.uses() if op else ()) if _tensor(v)), default=0)
            self._weight[value] = found
        return self._weight[value]

    def cost(self, value: Value, placement: Placement) -> int:
        """Bits that move to have `value` in `placement`."""
        return self._redo(value, placement)[1]

    def redo(self, value: Value, placement: Placement) -> Optional[Decision]:
        """How `value`'s op is redone in `placement`, when that beats converting `value`."""
        return self._redo(value, placement)[0]

    def _redo(self, value: Value, placement: Placement) -> tuple[Optional[Decision], int]:
        key = (value, placement.layout)
        if key not in self._costs:
            self._costs[key] = (None, _bits(value))  # a loop-carried cycle: convert
            if self.is_free(value) or self.placed.get(value) == placement:
                self._costs[key] = (None, 0)
            op = self.producer.get(value)
            if isinstance(op, REDONE) and id(op) in self.decided and self._costs[key][1]:
                decision = self.rules.backward_rules[type(op)](op, placement, self)
                moved = sum(self.cost(v, p) for v, p in zip(op.uses(), decision.operands)
                            if p is not None and _tensor(v))
                if decision.result == placement and (isinstance(op, DERIVED) or moved <= _bits(value)):
                    self._costs[key] = (decision, moved)
        return self._costs[key]

    def demand(self, value: Value) -> list[Placement]:
        """The layouts `value`'s consumers need it in, in order of first need."""
        if value in self._demand:
            return self._demand[value]
        self._demand[value] = []  # a cycle through loop-carried values adds nothing
        found: list[Placement] = []

        def need(placement: Optional[Placement]) -> None:
            if placement is not None and placement not in found:
                found.append(placement)

        for op, index in self.uses.get(value, ()):
            carried = self.carried_use.get((id(op), index))
            if carried is not None:
                need(carried.placement)
                continue
            results = [r for r in op.defines() if _tensor(r)]
            backward = self.rules.backward_rules.get(type(op))
            if isinstance(op, CHEAP) and results and results[0] not in self.placed and backward:
                for wanted in self.demand(results[0]):
                    need(backward(op, wanted, self).operands[index])
            elif id(op) not in self.decided and id(op) in self.anchors:
                need(self.anchors[id(op)])  # a store waiting for its value: its anchor so far
            elif id(op) in self.decided:
                need(self.decided[id(op)].operands[index])
                for wanted in self.demand(results[0]) if results else ():
                    redone = self.redo(results[0], wanted)  # in another layout, from this operand
                    if redone is not None:
                        need(redone.operands[index])
        if not found and self.is_free(value) and self.uses.get(value):
            found.append(self.default(value))
        self._demand[value] = found
        return found

    # -------------------------------------------------------------- steps 1 and 2
    def _forget(self) -> None:
        """Drop what depends on the layouts placed so far."""
        self._free.clear()
        self._demand.clear()
        self._costs.clear()

    def _place(self, op: Op, decision: Decision) -> None:
        self.decided[id(op)] = decision
        self._forget()
        results = [r for r in op.defines() if _tensor(r)]
        if results and decision.result is not None:
            self.placed[results[0]] = decision.result

    def forward(self) -> None:
        changed = True
        while changed:
            changed = False
            for op in self.order:
                rule = self.rules.forward_rules.get(type(op))
                if rule is None or id(op) in self.decided:
                    continue
                operands = tuple(self.placed.get(v) for v in op.uses())
                if id(op) not in self.anchors and not any(operands):
                    continue
                if isinstance(op, Store) and op.value not in self.placed and not self.is_free(op.value):
                    continue  # decided once the stored value has its layout
                decision = rule(op, operands, self)
                if decision is not None:
                    self._place(op, decision)
                    changed = True
            for carried in self.carried:
                if carried.placement is None:
                    known = [self.placed[v] for v in carried.sources if v in self.placed]
                    if known:
                        self._set_carried(carried, known[0])
                        changed = True

    def _set_carried(self, carried: Carried, placement: Placement) -> None:
        carried.placement = placement
        self._forget()
        for value in carried.defined:
            self.placed[value] = placement

    def _next_unplaced(self) -> Optional[Value]:
        for op in self.order:
            for value in op.defines() + tuple(a for region in op.nested_blocks() for a in region.args):
                if _tensor(value) and value not in self.placed and not self.is_free(value):
                    return value
        return None

    def place_all(self) -> None:
        """Steps 1 and 2: forward propagation, then one unplaced value at a time."""
        self.forward()
        while (value := self._next_unplaced()) is not None:
            # A carried value is needed where any of its values is: the loop's result may
            # be unused while the body's argument feeds an access.
            defined = self.carried_of[value].defined if value in self.carried_of else (value,)
            wanted = ([p for v in defined for p in self.demand(v)] or [self.default(value)])[0]
            if value in self.carried_of:
                self._set_carried(self.carried_of[value], wanted)
            else:
                op = self.producer[value]
                backward = self.rules.backward_rules.get(type(op))
                if backward is None:
                    raise CompilationError(f"internal: no layout rule for {op.NAME} at the tile stage", op.loc)
                self._place(op, backward(op, wanted, self))
            if value not in self.placed:
                raise CompilationError(f"internal: the layout rule of {self.producer[value].NAME} placed "
                                       f"nothing", self.producer[value].loc)
            self.forward()

    # -------------------------------------------------------------- step 3: rewriting
    def rewrite(self) -> Kernel:
        self.new: dict[Value, Value] = {}
        self.alternatives: dict[Value, dict[LinearLayout, Value]] = defaultdict(dict)
        return self.kernel.with_body(self._block(self.kernel.body))

    def _block(self, block: Block) -> Block:
        out: list[Op] = []
        args = tuple(self._define(arg) for arg in block.args)
        for arg in block.args:
            self._emit_alternatives(arg, out)
        for op in block.ops:
            self._emit(op, out)
        return Block(args, tuple(out))

    def _define(self, value: Value) -> Value:
        if _tensor(value):
            self.new[value] = Value(self.placed[value].on(value.type), value.hint)
        else:
            self.new[value] = value
        return self.new[value]

    def _emit(self, op: Op, out: list) -> None:
        results = op.defines()
        if results and _tensor(results[0]) and self.is_free(results[0]):
            self._emit_clones(op, out)
            return
        decision = self.decided.get(id(op))

        def operand(value: Value, index: int) -> Value:
            carried = self.carried_use.get((id(op), index))
            wanted = carried.placement if carried is not None else \
                decision.operands[index] if decision is not None else None
            return self._value_in(value, wanted, out, op)

        changes = map_operands(op, operand)
        for f in dataclasses.fields(op):
            item = getattr(op, f.name)
            if isinstance(item, Block):
                changes[f.name] = self._block(item)
            elif isinstance(item, tuple) and item and all(isinstance(b, Block) for b in item):
                changes[f.name] = tuple(self._block(b) for b in item)  # worker partitions
        if hasattr(op, "result"):
            changes["result"] = self._define(op.result)
        elif hasattr(op, "results"):
            changes["results"] = tuple(self._define(r) for r in op.results)
        out.append(dataclasses.replace(op, **changes))
        for result in results:
            self._emit_alternatives(result, out)

    def _emit_clones(self, op: Op, out: list) -> None:
        """A free op, once per layout its result is needed in."""
        result = op.result
        backward = self.rules.backward_rules[type(op)]
        for wanted in self.demand(result):
            decision = backward(op, wanted, self)
            changes = map_operands(op, lambda v, i: self._value_in(v, decision.operands[i], out, op))
            value = Value(decision.result.on(result.type), result.hint)
            out.append(dataclasses.replace(op, result=value, **changes))
            if decision.result != wanted:
                value = self._convert(value, wanted, out, op)
            self.alternatives[result][wanted.layout] = value

    def _emit_alternatives(self, value: Value, out: list) -> None:
        """Right after its definition: `value` in every other layout a consumer needs."""
        if not _tensor(value) or value not in self.placed:
            return
        op = self.producer.get(value)
        for wanted in self.demand(value):
            if wanted == self.placed[value] or wanted.layout in self.alternatives[value]:
                continue
            decision = self.redo(value, wanted)
            if decision is None:
                self.alternatives[value][wanted.layout] = self._convert(self.new[value], wanted, out, op)
                continue
            changes = map_operands(op, lambda v, i: self._value_in(v, decision.operands[i], out, op))
            redone = Value(wanted.on(value.type), value.hint)
            out.append(dataclasses.replace(op, result=redone, **changes))
            self.alternatives[value][wanted.layout] = redone

    def _value_in(self, value: Value, wanted: Optional[Placement], out: list, user: Op) -> Value:
        if not _tensor(value):
            return self.new.get(value, value)
        if value in self.new and (wanted is None or self.placed[value] == wanted):
            return self.new[value]
        found = self.alternatives.get(value, {})
        if wanted is None:
            return next(iter(found.values()))
        if wanted.layout in found:
            return found[wanted.layout]
        # Not foreseen by `demand` (a compiler bug, but still correct code): convert here.
        source = self.new[value] if value in self.new else next(iter(found.values()))
        return self._convert(source, wanted, out, user)

    def _convert(self, value: Value, wanted: Placement, out: list, op: Op) -> Value:
        result = Value(wanted.on(value.type), value.hint)
        out.append(ConvertLayout(result=result, operand=value, loc=op.loc if op is not None else UNKNOWN_LOC))
        return result


# ------------------------------------------------------------------ after
def remove_dead_ops(kernel: Kernel) -> Kernel:
    """Drop ops without side effects whose results nothing uses (to a fixpoint)."""
    def sweep(block: Block, used: set) -> Block:
        ops = []
        for op in block.ops:
            if not (isinstance(op, PURE) and not any(r in used for r in op.defines())):
                ops.append(op.map_regions(lambda region: sweep(region, used)))
        return Block(block.args, tuple(ops))

    while True:
        swept = kernel.with_body(sweep(kernel.body, {v for op in kernel.walk() for v in op.uses()}))
        if sum(1 for _ in swept.walk()) == sum(1 for _ in kernel.walk()):
            return swept
        kernel = swept


def propagate_layouts(kernel: Kernel, rules: Optional[LayoutRules] = None) -> Kernel:
    """Every tensor of a coalesced `tile` kernel in a layout (see the module docstring);
    `rules` defaults to LAYOUT_RULES."""
    stripped, anchors = strip_anchors(kernel)
    propagation = Propagation(stripped, anchors, rules or LAYOUT_RULES)
    propagation.place_all()
    return remove_dead_ops(propagation.rewrite())
