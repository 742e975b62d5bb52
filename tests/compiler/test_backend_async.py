"""The backend's Hopper async lowering (mbarrier, TMA, cp.async, warp_specialize with
setmaxnreg and named barriers): the PTX each op promises, ptxas's verdict for sm_90a
(no spills), and the compile-time errors. No GPU needed."""

from __future__ import annotations

import re

import pytest

from weft import lowlevel as ll
from weft.compiler.backend import compile_to_ptx
from weft.compiler.backend.lower_tma import swizzle_period_bytes
from weft.compiler.backend.lower_warp_specialize import entry_register_cap
from weft.compiler.errors import CompilationError
from weft.layouts import nvmma_shared
from weft.compiler.backend import ptxas

from . import async_kernels as K
from .backend_kernels import prepare

HAS_PTXAS = ptxas.find_ptxas() is not None


def assembled(ptx: str) -> dict:
    """ptxas's report (no spills), or {} without ptxas."""
    if not HAS_PTXAS:
        return {}
    _, report = ptxas.assemble(ptx, arch="sm_90a")
    assert report["spill_stores"] == 0 and report["spill_loads"] == 0, report["text"]
    return report


def compile_ir(kernel):
    llir, ptx = compile_to_ptx(prepare(kernel))
    return llir, ptx, assembled(ptx)


def compile_jit(fn, signature, constexprs, num_warps=4, specialization=None):
    compiled = fn.compile(signature, constexprs, num_warps=num_warps, specialization=specialization)
    if HAS_PTXAS:
        assert compiled.metadata["spill_stores"] == 0 and compiled.metadata["spill_loads"] == 0
    return compiled


def count(pattern: str, text: str) -> int:
    return len(re.findall(pattern, text))


# ------------------------------------------------------------------ mbarrier + TMA
def test_tma_round_trip_issues_from_one_thread_with_reversed_coordinates():
    llir, ptx, _ = compile_ir(K.tma_round_trip())
    assert count(r"@%p\d+ mbarrier\.init\.shared::cta\.b64 \[%r\d+\], 1;", ptx) == 1
    assert "fence.mbarrier_init.release.cluster" in ptx
    assert re.search(r"@%p\d+ mbarrier\.arrive\.expect_tx\.shared::cta\.b64 _, \[%r\d+\], 8192;", ptx)
    assert re.search(r"@%p\d+ cp\.async\.bulk\.tensor\.2d\.shared::cluster\.global\.mbarrier::complete_tx::bytes "
                     r"\[%r\d+\], \[%rd\d+, \{%r\d+, %r\d+\}\], \[%r\d+\];", ptx)
    assert re.search(r"@%p\d+ cp\.async\.bulk\.tensor\.2d\.global\.shared::cta\.bulk_group "
                     r"\[%rd\d+, \{%r\d+, %r\d+\}\], \[%r\d+\];\s*@%p\d+ cp\.async\.bulk\.commit_group;", ptx)
    assert "cp.async.bulk.wait_group.read 0;" in ptx
    assert "mbarrier.try_wait.parity.shared::cta.b64" in ptx
    assert re.search(r"@%p\d+ mbarrier\.inval\.shared::cta\.b64", ptx)
    # PTX lists coordinates innermost first: x before y in both copies.
    assert count(r'i32 %"x", i32 %"y"', llir) == 2
    # One elected thread issues: tid.x == 0.
    assert re.search(r"icmp eq i32 %.*, 0", llir)


def test_tma_pred_combines_with_the_election():
    llir, ptx, _ = compile_ir(K.tma_round_trip(pred=True))
    assert re.search(r'and i1 %".*", %"issue"|and i1 %"issue"', llir)


def test_tma_rank_3_and_two_waits_in_one_kernel_assemble():
    _, ptx, _ = compile_ir(K.tma_3d())
    assert "cp.async.bulk.tensor.3d.shared::cluster.global" in ptx
    _, ptx, _ = compile_ir(K.tma_round_trip(window=(128, 64)))  # a window on the swizzle period
    assert "cp.async.bulk.tensor.2d" in ptx


def test_tma_refuses_a_buffer_in_another_layout():
    with pytest.raises(CompilationError, match="not the descriptor's box layout"):
        compile_ir(K.tma_round_trip(buffer_layout=K.row_major_box(64, 64)))


def test_tma_refuses_a_window_off_the_swizzle_period():
    kernel = K.tma_round_trip(box=(1, 32), window=(2, 1), shared=lambda shape: K.row_major_box(*shape))
    # row 1 starts 64 bytes in
    with pytest.raises(CompilationError, match="not on a multiple of 128 bytes"):
        compile_ir(kernel)


@pytest.mark.parametrize("swizzle, period", [(128, 1024), (64, 512), (32, 256), (0, 128)])
def test_swizzle_periods_follow_the_nvmma_table(swizzle, period):
    assert swizzle_period_bytes(nvmma_shared((64, 64), swizzle, 16), 2) == period


# ------------------------------------------------------------------ cp.async
CP_LAYOUT = ll.BlockedLayout([1, 4], [8, 4], [4, 1], [1, 0])
CP_OUT = ll.BlockedLayout([4, 1], [4, 8], [1, 4], [0, 1])
CP_SIGNATURE = {"x_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32"}
ALIGNED = {"x_ptr": "divisible_by_16", "out_ptr": "divisible_by_16", "n": "divisible_by_16"}


def _cp_copy(element="fp32", layout=CP_LAYOUT, shared=ll.SwizzledSharedLayout(4, 1, 8, [1, 0]),
             specialization=ALIGNED):
    signature = {"x_ptr": f"*{element}", "out_ptr": f"*{element}", "n": "i32"}
    return compile_jit(K.cp_async_copy, signature,
                       {"ROWS": 32, "COLS": 64, "L": layout, "S": shared, "OUT": CP_OUT},
                       specialization=specialization)


@pytest.mark.parametrize("element, instruction, copies", [
    ("fp32", r"cp\.async\.cg\.shared\.global \[%r\d+\], \[%rd\d+\], 16, %r\d+;", 4),
    ("fp16", r"cp\.async\.ca\.shared\.global \[%r\d+\], \[%rd\d+\], 8, %r\d+;", 4),
    ("i8", r"cp\.async\.ca\.shared\.global \[%r\d+\], \[%rd\d+\], 4, %r\d+;", 4),
])
def test_cp_async_moves_vectors_and_zero_fills_masked_copies(element, instruction, copies):
    compiled = _cp_copy(element)
    ptx = compiled.asm["ptx"]
    assert count(instruction, ptx) == copies, ptx
    assert "cp.async.commit_group;" in ptx and "cp.async.wait_group 0;" in ptx
    assert "vector=4" in compiled.asm["layout"]
    # The source size is 0 where the mask is off: a select between the size and 0.
    assert re.search(r"select\s+i1 %.*, i32 \d+, i32 0", compiled.asm["llir"])


def test_cp_async_shared_side_limits_the_vector():
    # Unswizzled but transposed-order shared layout: consecutive columns are not
    # consecutive in shared memory, so each element is its own 4-byte copy.
    compiled = _cp_copy("fp32", shared=ll.SwizzledSharedLayout(1, 1, 1, [0, 1]))
    assert count(r"cp\.async\.ca\.shared\.global \[%r\d+\], \[%rd\d+\], 4,", compiled.asm["ptx"]) == 16


def test_cp_async_narrower_than_4_bytes_falls_back_to_load_and_store():
    compiled = _cp_copy("fp16", specialization={})  # no alignment known: one element per copy
    ptx = compiled.asm["ptx"]
    assert "cp.async.ca" not in ptx and "cp.async.cg" not in ptx
    assert count(r"st\.shared\.b16", ptx) == 16
    assert count(r"@%p\d+ ld\.global\.b16", ptx) == 16


def test_cp_async_broadcast_layout_copies_each_element_once():
    # 8 warps over a tile 4 warps cover: warp bit 2 is a copy, those threads do not issue.
    layout = ll.BlockedLayout([1, 4], [8, 4], [4, 2], [1, 0])
    compiled = compile_jit(K.cp_async_copy, CP_SIGNATURE,
                           {"ROWS": 32, "COLS": 16, "L": layout, "S": ll.SwizzledSharedLayout(1, 1, 1, [1, 0]),
                            "OUT": ll.BlockedLayout([1, 1], [32, 1], [1, 8], [0, 1])},
                           num_warps=8, specialization=ALIGNED)
    assert re.search(r"@%p\d+ cp\.async\.cg\.shared\.global", compiled.asm["ptx"])


# ------------------------------------------------------------------ warp_specialize
def test_ping_pong_partitions_use_named_barriers_and_launch_all_warps():
    compiled = compile_jit(K.ping_pong, {"x_ptr": "*fp32", "out_ptr": "*fp32"},
                           {"ITERS": 4, "BLOCK": 256, "WORKER_WARPS": 2, "WORKER_REGS": 0},
                           specialization={"x_ptr": "divisible_by_16", "out_ptr": "divisible_by_16"})
    ptx = compiled.asm["ptx"]
    assert ".maxntid 192" in ptx and ".maxnreg" not in ptx
    assert compiled.total_warps == 6 and compiled.num_threads == 192
    assert compiled.metadata["total_warps"] == 6 and compiled.metadata["num_warps"] == 4
    assert "bar.sync \t1, 128;" in ptx  # default partition: arrive after all its threads
    assert "bar.sync \t2, 64;" in ptx  # the 2-warp worker's barrier
    assert "setmaxnreg" not in ptx
    assert "shfl.sync.idx.b32" in ptx  # the dispatch branches on lane 0's warp index
    # Thread 0 of the worker (CTA thread 128) arrives on `full`.
    assert re.search(r"setp\.eq\.b32 \t%p\d+, %r\d+, 128;", ptx)


def test_one_warp_partition_arrives_after_a_warp_sync():
    compiled = compile_jit(K.ping_pong, {"x_ptr": "*fp32", "out_ptr": "*fp32"},
                           {"ITERS": 2, "BLOCK": 256, "WORKER_WARPS": 1, "WORKER_REGS": 0})
    ptx = compiled.asm["ptx"]
    assert ".maxntid 160" in ptx and "bar.warp.sync \t-1;" in ptx


def test_register_budgets_use_setmaxnreg_under_an_entry_cap():
    compiled = compile_jit(K.ping_pong, {"x_ptr": "*fp32", "out_ptr": "*fp32"},
                           {"ITERS": 4, "BLOCK": 1024, "WORKER_WARPS": 4, "WORKER_REGS": 24, "WARPS": 8},
                           num_warps=8)
    ptx = compiled.asm["ptx"]
    # 12 warps: 65536 / 384 = 170 -> 168 at entry; the default partition gets 240.
    assert ".maxntid 384" in ptx and ".maxnreg 168" in ptx
    assert "setmaxnreg.dec.sync.aligned.u32 24;" in ptx and "setmaxnreg.inc.sync.aligned.u32 240;" in ptx
    # Each partition sets the cap back before the join.
    assert "setmaxnreg.inc.sync.aligned.u32 168;" in ptx and "setmaxnreg.dec.sync.aligned.u32 168;" in ptx
    if HAS_PTXAS:
        assert compiled.metadata["registers"] == 168


def test_the_maxnreg_option_lowers_the_entry_cap_for_more_ctas_per_sm():
    """maxnreg=128 on 384 threads: the budgets share 128 a thread (two such CTAs fit an
    SM's 65536), so beside the worker's 24 the default partition gets (128 * 384 - 24 * 128)
    / 256 = 180, rounded down to 176, not the 240 it gets without the option."""
    signature = {"x_ptr": "*fp32", "out_ptr": "*fp32"}
    constexprs = {"ITERS": 4, "BLOCK": 1024, "WORKER_WARPS": 4, "WORKER_REGS": 24, "WARPS": 8}
    shared = K.ping_pong.compile(signature, constexprs, num_warps=8, maxnreg=128).asm["ptx"]
    assert ".maxnreg 128" in shared and "setmaxnreg.inc.sync.aligned.u32 176;" in shared
    plain = K.ping_pong.compile(signature, {**constexprs, "WORKER_REGS": 0, "WARPS": 4}, num_warps=4)
    capped = K.ping_pong.compile(signature, {**constexprs, "WORKER_REGS": 0, "WARPS": 4}, num_warps=4, maxnreg=64)
    assert ".maxnreg" not in plain.asm["ptx"] and ".maxnreg 64" in capped.asm["ptx"]
    if HAS_PTXAS:
        assert capped.metadata["registers"] <= 64
    for bad in (8, 256, "64", True):
        with pytest.raises(ValueError, match="maxnreg must be an int from 16 to 255"):
            K.ping_pong.compile(signature, constexprs, num_warps=8, maxnreg=bad)


def test_results_come_from_the_default_partition_and_extra_warps_leave():
    compiled = compile_jit(K.specialized_sum, {"x_ptr": "*fp32", "out_ptr": "*fp32"}, {"WORKERS": 2})
    ptx = compiled.asm["ptx"]
    assert ".maxntid 192" in ptx
    assert "bar.sync \t1, 128;" in ptx  # the reduction and conversion inside the default partition
    assert "bar.sync \t0, 128;" in ptx  # ll.barrier() after the op: the default warps only
    assert re.search(r"setp\.gt\.u32 \t%p\d+, %r\d+, 3;|setp\.lt\.u32 \t%p\d+, %r\d+, 4;", ptx)


def test_entry_register_cap():
    assert entry_register_cap(K.warp_specialized()) is None
    assert entry_register_cap(K.warp_specialized(worker_num_regs=(40,))) == 248  # 8 warps: 256 -> 255 -> 248
    assert entry_register_cap(K.warp_specialized(worker_num_warps=(4, 4), worker_num_regs=(24, 0))) == 168
    assert entry_register_cap(K.warp_specialized(num_warps=8, worker_num_warps=(8,), worker_num_regs=(0,),
                                                 default_num_regs=64)) == 128


@pytest.mark.parametrize("changes, message", [
    (dict(worker_num_regs=(20,)), "multiples of 8 in \\[24, 256\\]"),
    (dict(worker_num_regs=(44,)), "multiples of 8"),
    (dict(worker_num_warps=(2,), worker_num_regs=(24,)), "apply per warpgroup"),
    (dict(num_warps=8, worker_num_regs=(56,), default_num_regs=256), "the CTA gets 64512"),
])
def test_bad_register_budgets_are_refused_at_the_op(changes, message):
    with pytest.raises(CompilationError, match=message):
        compile_ir(K.warp_specialized(**changes))


def test_warp_specialize_misuse_is_refused():
    with pytest.raises(CompilationError, match="inside a warp_specialize partition"):
        compile_ir(K.warp_specialized(nested=True))
    with pytest.raises(CompilationError, match="only the last warp_specialize"):
        compile_ir(K.warp_specialized(results=True, twice=True))
    with pytest.raises(CompilationError, match="cannot receive the tensor"):
        compile_jit(K.tensor_capture_misplaced, {"x_ptr": "*fp32", "out_ptr": "*fp32"}, {})


def test_a_tensor_reaches_a_worker_whose_warps_mirror_its_layout():
    compiled = compile_jit(K.tensor_capture, {"x_ptr": "*fp32", "out_ptr": "*fp32"}, {})
    assert ".maxntid 256" in compiled.asm["ptx"]


def test_hand_built_partitions_arrive_once_each():
    _, ptx, _ = compile_ir(K.warp_specialized(worker_num_warps=(4, 4), worker_num_regs=(24, 24),
                                              default_num_regs=232))
    assert count(r"mbarrier\.arrive\.shared::cta\.b64", ptx) == 3
    assert "bar.sync \t1, 128;" in ptx and "bar.sync \t2, 128;" in ptx and "bar.sync \t3, 128;" in ptx
    assert ".maxnreg 168" in ptx
