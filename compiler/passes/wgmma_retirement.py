"""Where each async wgmma is retired: the shared memory it reads stays in use until then.

An async `warpgroup_mma` reads its shared operands after it is issued, until a
`warpgroup_mma_wait` lists its result (or a value it flows into). A pipelined loop leaves
its last wgmma in flight across the loop's end, and the wait that retires it may come after
other work: a layout conversion of another accumulator, through shared scratch. Until that
wait the ring slot the wgmma reads must not be reused (allocate_shared_memory), or the
scratch overwrites an operand still being read.

The in-flight value is followed through what carries it unchanged in time: a layout
conversion, a later wgmma that takes it as accumulator (groups retire in order), a loop's
yield (to the loop's result and to the next iteration's argument), a while's yield and
condition (to the next iteration, the body and the result) and an if's yield (to its result).
The waits that list any of those values retire it.
"""

from __future__ import annotations

from ..ir import Condition, ConvertLayout, For, If, Kernel, Op, Value, WarpgroupMma, WarpgroupMmaWait, While, Yield


def retiring_positions(kernel: Kernel, positions: dict) -> dict[int, int]:
    """id(async wgmma) -> the program position (`positions[id(op)][0]`) of the last wait
    that retires it; wgmmas no wait is found for are left out."""
    readers: dict[Value, list[Op]] = {}
    carried: dict[int, list[Value]] = {}  # id(yield) -> per yielded value, where it goes
    for op in kernel.walk():
        for value in op.uses():
            readers.setdefault(value, []).append(op)
        if isinstance(op, For) and isinstance(op.body.ops[-1], Yield):
            carried[id(op.body.ops[-1])] = [(result, arg) for result, arg in zip(op.results, op.body.args[1:])]
        elif isinstance(op, While):  # the after block's yield feeds the before block's args
            if op.after.ops and isinstance(op.after.ops[-1], Yield):
                carried[id(op.after.ops[-1])] = [(arg,) for arg in op.before.args]
            if op.before.ops and isinstance(op.before.ops[-1], Condition):  # on to the body or out
                carried[id(op.before.ops[-1])] = [(arg, result) for arg, result in zip(op.after.args, op.results)]
        elif isinstance(op, If):
            for body in (op.then_body, op.else_body):
                if body.ops and isinstance(body.ops[-1], Yield):
                    carried[id(body.ops[-1])] = [(result,) for result in op.results]

    def successors(value: Value, reader: Op) -> tuple[Value, ...]:
        if isinstance(reader, ConvertLayout):
            return (reader.result,)
        if isinstance(reader, WarpgroupMma) and reader.acc is value:
            return (reader.result,)
        if isinstance(reader, (Yield, Condition)) and id(reader) in carried:
            targets = carried[id(reader)]
            return tuple(target for index, v in enumerate(reader.values) if v is value
                         for target in targets[index])
        return ()

    retired: dict[int, int] = {}
    for op in kernel.walk():
        if not (isinstance(op, WarpgroupMma) and op.is_async):
            continue
        seen, pending, last = {op.result}, [op.result], None
        while pending:
            value = pending.pop()
            for reader in readers.get(value, ()):
                if isinstance(reader, WarpgroupMmaWait) and value in reader.deps:
                    last = max(last or 0, positions[id(reader)][0])
                for following in successors(value, reader):
                    if following not in seen:
                        seen.add(following)
                        pending.append(following)
        if last is not None:
            retired[id(op)] = last
    return retired
