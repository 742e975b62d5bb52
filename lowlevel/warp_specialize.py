"""`warp_specialize`: run different @jit functions on different warps of one CTA at once
(Gluon's signature).

    ll.warp_specialize((a_smem, bars, acc_layout), consumer,     # default partition
                       (desc, a_smem, bars), [producer],         # worker partitions
                       worker_num_warps=[4], worker_num_regs=[40])

The default partition runs on the kernel's `num_warps` warps and returns the op's
results; worker i runs on the next `worker_num_warps[i]` warps. Arguments are captured
values (tensors, shared buffers, descriptors, scalars) and compile-time values; layouts
inside a worker are over its own warps. Register budgets use setmaxnreg; when workers
get budgets the default partition gets what is left (at most 240 per thread; of the
pool the launch option maxnreg gives the CTA, where given), unless `default_num_regs`
says otherwise. setmaxnreg acts on whole warpgroups (4 warps), so
with budgets the default partition needs a multiple of 4 warps, workers smaller than a
warpgroup that share one (one-warp TMA and MMA issuers) share its largest budget, and
idle warps fill the last warpgroup and take its budget too (as in Triton: the CTA
launches a multiple of 4 warps). Partitions share data through shared memory and
mbarriers only.

Several warpgroups doing one job (the consumer warpgroups of an attention kernel) can be
one worker run as copies, `worker_replicas=[3]`: each copy gets its own warps, register
budget and named barrier, but they share one copy of the code, so the instruction cache
holds it once; `replica_index()` tells a copy which one it is, at run time:

    ll.warp_specialize((state,), producer, (state,), [consumer], worker_num_warps=[4],
                       worker_num_regs=[160], worker_replicas=[3])
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from ..compiler import ir
from ..compiler.aggregates import leaves, map_leaves
from ..compiler.builder import DynamicValue, builtin
from ..compiler.errors import CompilationError
from ..compiler.hardware import MAX_REGISTERS, REGISTER_FILE, WARPS_PER_WARPGROUP
from ..compiler.types import i32
from . import semantic as sem

__all__ = ["replica_index", "warp_specialize"]

MAX_BUDGET = 240


def _captures(args_lists: Sequence[Any]) -> list[ir.Value]:
    """The distinct runtime values inside the argument tuples, in first-seen order."""
    found: dict[ir.Value, None] = {}

    for args in args_lists:
        for leaf in leaves(args):  # through tuples and aggregates
            if isinstance(leaf, DynamicValue):
                found.setdefault(leaf.handle, None)
    return list(found)


def _rebind(x: Any, renamed: dict, wrap) -> Any:
    return map_leaves(lambda leaf: wrap(renamed[leaf.handle]) if isinstance(leaf, DynamicValue) else leaf, x)


def _partition(fn, args: tuple, captures: list[ir.Value], num_warps: int) -> tuple[ir.Block, Any]:
    """`fn(*args)` walked into a block whose args stand for the captures."""
    b = sem.builder()
    block_args = tuple(ir.Value(v.type, v.hint) for v in captures)
    renamed = dict(zip(captures, block_args))
    saved_warps = b.num_warps
    ops = b.push_block()
    b.num_warps = num_warps
    try:
        returned = b.inline_function(fn, list(_rebind(args, renamed, b.wrap)), {})
    finally:
        b.num_warps = saved_warps
        b.pop_block()
    return ir.Block(block_args, tuple(ops)), returned


def _results(returned: Any) -> tuple[ir.Value, ...]:
    if returned is None:
        return ()
    items = returned if isinstance(returned, tuple) else (returned,)
    if not all(isinstance(i, DynamicValue) for i in items):
        raise sem.builder().error("the default partition must return runtime values (or nothing), "
                                  f"found {returned!r}")
    return tuple(i.handle for i in items)


def _check_captured_tensors(fn, num_warps: int, block: ir.Block) -> None:
    """A worker sees a captured tensor in the layout it was made in, which spans the
    default partition's warps: a worker with another warp count cannot use it."""
    mismatched = {arg for arg in block.args
                  if getattr(arg.type, "layout", None) is not None
                  and arg.type.layout.in_dims.get("warp", num_warps) != num_warps}
    for op in block.walk():
        used = mismatched.intersection(op.uses())
        if used:
            arg = used.pop()
            name = getattr(fn, "__name__", repr(fn))
            raise CompilationError(
                f"worker partition {name} runs on {num_warps} warps but uses a captured tensor "
                f"laid out over {arg.type.layout.in_dims['warp']} warps "
                f"({sem.describe(sem.builder().wrap(arg))})", op.loc,
                suggestion="pass it through shared memory (store it into a buffer before "
                           "warp_specialize and load it in the worker's layout), or compute it "
                           "inside the worker")


def _ints(value: Any, what: str, count: int) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)) or len(value) != count or \
            any(isinstance(v, bool) or not isinstance(v, int) for v in value):
        raise sem.builder().error(f"warp_specialize {what} must list {count} compile-time ints "
                                  f"(one per worker), found {value!r}")
    return tuple(value)


def _warpgroup_budgets(warps: tuple[int, ...], replicas: tuple[int, ...],
                       regs: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(the budget of each worker and then of each idle partition, the warp counts of the
    idle partitions that fill the last warpgroup), for workers placed one after another
    from a warpgroup boundary.

    setmaxnreg acts on a whole warpgroup (its 4 warps execute the same one), so workers
    that share a warpgroup share a budget, the largest they ask for (Triton does the
    same), and warps the workers leave in the last warpgroup run an idle partition that
    takes it too (powers of two, 3 as 2 + 1). A warpgroup shared by a budgeted worker and
    one that keeps the launch budget (0) is an error: one of the two would be wrong."""
    b = sem.builder()
    owners: list[int] = []  # the worker each worker warp runs, in placement order
    for index, (w, copies) in enumerate(zip(warps, replicas)):
        owners += [index] * (w * copies)
    pad = -len(owners) % WARPS_PER_WARPGROUP
    padding = tuple(1 << bit for bit in reversed(range(pad.bit_length())) if pad >> bit & 1)
    for extra, w in enumerate(padding):
        owners += [len(warps) + extra] * w
    budgets = list(regs) + [0] * len(padding)
    # Workers linked through shared warpgroups (a chain of them) end with one budget.
    groups = [set(owners[i:i + WARPS_PER_WARPGROUP]) for i in range(0, len(owners), WARPS_PER_WARPGROUP)]
    changed = True
    while changed:
        changed = False
        for group in groups:
            asked = {budgets[i] for i in group if i < len(warps)}
            if 0 in asked and len(asked) > 1:
                raise b.error(
                    f"register budgets (setmaxnreg) apply per warpgroup: workers "
                    f"{sorted(i for i in group if i < len(warps))} share one (worker_num_warps "
                    f"{list(warps)}), but some ask for {sorted(asked - {0})} registers and some "
                    f"keep the launch budget (0)",
                    suggestion="give the workers that share a warpgroup one budget")
            top = max(budgets[i] for i in group)
            for i in group:
                changed |= budgets[i] != top
                budgets[i] = top
    if padding and not budgets[-1]:
        return tuple(budgets[:len(warps)]), ()  # the last warpgroup keeps the launch budget
    return tuple(budgets), padding


@builtin
def replica_index():
    """Which copy of a replicated worker partition runs this code, an i32 scalar from 0
    to worker_replicas - 1 (0 in partitions that are not replicated and outside them)."""
    b = sem.builder()
    return b.wrap(b.create(ir.ReplicaIndex, i32))


@builtin
def warp_specialize(*args: Any, **kwargs: Any):
    """Run `default_partition(*default_args)` on the kernel's warps and each worker
    partition on its own warps (worker i as worker_replicas[i] copies, each on
    worker_num_warps[i] warps), all at once; returns the default partition's results.

    Two spellings (Gluon has had both): `warp_specialize(default_args, default_partition,
    worker_args, worker_partitions, worker_num_warps, worker_num_regs, ...)`, every worker
    getting worker_args, and `warp_specialize([(default_partition, default_args),
    (worker, its_args), ...], worker_num_warps, worker_num_regs, ...)`, each worker with
    arguments of its own."""
    if args and isinstance(args[0], list):
        return _warp_specialize_pairs(*args, **kwargs)
    return _warp_specialize(*args, **kwargs)


def _warp_specialize_pairs(functions_and_args: list, worker_num_warps: Sequence[int],
                           worker_num_regs: Optional[Sequence[int]] = None, **options: Any):
    b = sem.builder()
    pairs = functions_and_args
    if len(pairs) < 2 or any(not isinstance(p, (tuple, list)) or len(p) != 2 or
                             not isinstance(p[1], (tuple, list)) for p in pairs):
        raise b.error("warp_specialize's list form takes [(default_partition, args), (worker, "
                      "args), ...]: a default partition and at least one worker, each with a "
                      f"tuple of arguments; found {pairs!r}")
    if worker_num_regs is None:
        worker_num_regs = [0] * (len(pairs) - 1)
    (default_partition, default_args), workers = pairs[0], pairs[1:]
    return _warp_specialize(tuple(default_args), default_partition, None, [fn for fn, _ in workers],
                            worker_num_warps, worker_num_regs,
                            per_worker_args=[tuple(a) for _, a in workers], **options)


def _warp_specialize(default_args: Any, default_partition: Any, worker_args: Any,
                     worker_partitions: Sequence[Any], worker_num_warps: Sequence[int],
                     worker_num_regs: Sequence[int], default_num_regs: Optional[int] = None,
                     worker_replicas: Optional[Sequence[int]] = None,
                     per_worker_args: Optional[list] = None):
    b = sem.builder()
    if not isinstance(worker_partitions, (list, tuple)) or not worker_partitions:
        raise b.error("warp_specialize needs a list of worker partitions (@jit functions)")
    count = len(worker_partitions)
    if not isinstance(default_args, tuple):
        raise b.error(f"warp_specialize default_args must be a tuple, found {default_args!r}")
    if per_worker_args is None:
        if not isinstance(worker_args, tuple):
            raise b.error(f"warp_specialize worker_args must be a tuple (given to every worker), "
                          f"found {worker_args!r}")
        per_worker_args = [worker_args] * count
    warps = _ints(worker_num_warps, "worker_num_warps", count)
    regs = _ints(worker_num_regs, "worker_num_regs", count)
    for w in warps:
        if w < 1 or w & (w - 1):
            raise b.error(f"warp_specialize worker_num_warps entries must be powers of two, found {list(warps)}")
    replicas = (1,) * count if worker_replicas is None else \
        _ints(worker_replicas, "worker_replicas", count)
    if any(r < 1 for r in replicas):
        raise b.error(f"warp_specialize worker_replicas entries must be at least 1, found {list(replicas)}")
    total = b.num_warps + sum(w * r for w, r in zip(warps, replicas))
    if total > 32:
        raise b.error(f"warp_specialize needs {total} warps in all ({b.num_warps} default + "
                      f"{list(warps)} per worker copy, copies {list(replicas)}); a CTA has at most 32")
    # Partitions sync their own warps with a named barrier each (0 is the CTA's): 1..15.
    if 1 + sum(replicas) > 15:
        raise b.error(f"warp_specialize with {1 + sum(replicas)} partitions (worker copies counted) "
                      f"needs as many named barriers; a CTA has 15 besides the CTA-wide one")
    for r in regs:
        if r and (r % 8 or not 24 <= r <= 256):
            raise b.error(f"warp_specialize register budgets must be multiples of 8 in "
                          f"[24, 256] (or 0 for no change), found {list(regs)}")
    padding: tuple[int, ...] = ()
    if any(regs) or default_num_regs:
        if b.num_warps % WARPS_PER_WARPGROUP:
            raise b.error(f"register budgets (setmaxnreg) apply per warpgroup: the default "
                          f"partition needs a multiple of 4 warps, found num_warps={b.num_warps}")
        regs, padding = _warpgroup_budgets(warps, replicas, regs)
        total += sum(padding)
        if total > 32:
            raise b.error(f"warp_specialize needs {total} warps in all, the last warpgroup filled "
                          f"for its register budget; a CTA has at most 32")
        if 1 + sum(replicas) + len(padding) > 15:
            raise b.error(f"warp_specialize with {1 + sum(replicas)} partitions and "
                          f"{len(padding)} idle ones filling the last warpgroup needs as many "
                          f"named barriers; a CTA has 15 besides the CTA-wide one")
    if default_num_regs is None:
        default_num_regs = 0
        if any(regs):
            spent = sum(32 * w * copies * (r or REGISTER_FILE // (32 * total))
                        for w, r, copies in zip(warps + padding, regs, replicas + (1,) * len(padding)))
            share = (REGISTER_FILE - spent) // (32 * b.num_warps)
            if b.max_registers is not None:  # the launch's maxnreg caps the pool the partitions share
                cap = min(MAX_REGISTERS, REGISTER_FILE // (32 * total), b.max_registers) // 8 * 8
                launched = sum(32 * w * copies * (r or cap)
                               for w, r, copies in zip(warps + padding, regs, replicas + (1,) * len(padding)))
                share = min(share, (32 * total * cap - launched) // (32 * b.num_warps))
            default_num_regs = min(MAX_BUDGET, share - share % 8)
    elif isinstance(default_num_regs, bool) or not isinstance(default_num_regs, int) or \
            default_num_regs % 8 or not 24 <= default_num_regs <= 256:
        raise b.error(f"default_num_regs must be a multiple of 8 in [24, 256], found {default_num_regs!r}")
    captures = _captures((default_args, *per_worker_args))
    default, returned = _partition(default_partition, default_args, captures, b.num_warps)
    results = _results(returned)
    default = ir.Block(default.args, default.ops + (ir.Yield(values=results, loc=b.loc),))
    workers = []
    for fn, w, fn_args in zip(worker_partitions, warps, per_worker_args):
        block, returned = _partition(fn, fn_args, captures, w)
        _check_captured_tensors(fn, w, block)
        if returned is not None:
            raise b.error("worker partitions return nothing; only the default partition's "
                          "results come back")
        workers.append(ir.Block(block.args, block.ops + (ir.Yield(loc=b.loc),)))
    for _ in padding:  # idle warps that only take their warpgroup's budget
        workers.append(ir.Block(tuple(ir.Value(v.type, v.hint) for v in captures), (ir.Yield(loc=b.loc),)))
    warps, replicas = warps + padding, replicas + (1,) * len(padding)
    out = tuple(ir.Value(v.type, v.hint) for v in results)
    b.emit(ir.WarpSpecialize(results=out, captures=tuple(captures), default=default,
                             workers=tuple(workers), worker_num_warps=warps, worker_num_regs=regs,
                             default_num_regs=default_num_regs,
                             worker_replicas=() if all(r == 1 for r in replicas) else replicas, loc=b.loc))
    wrapped = tuple(b.wrap(v) for v in out)
    return None if not wrapped else wrapped[0] if len(wrapped) == 1 else wrapped
