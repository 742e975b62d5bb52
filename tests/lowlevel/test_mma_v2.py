"""ll.mma_v2: the warp-level tensor-core MMA (mma.sync.m16n8k16), on the emulator against
float64 numpy, through ptxas, on the GPU, inside a branch taken warp by warp (its
operands read from shared memory there), and the errors for what it cannot take."""

import numpy as np
import pytest

from weft import lowlevel as ll
from weft.compiler.errors import CompilationError
from weft.compiler.backend import ptxas

RNG = np.random.default_rng(23)


@ll.jit
def tile_offsets(ROWS: ll.constexpr, COLS: ll.constexpr, LAYOUT: ll.constexpr):
    rows = ll.arange(0, ROWS, ll.SliceLayout(1, LAYOUT))
    cols = ll.arange(0, COLS, ll.SliceLayout(0, LAYOUT))
    return rows[:, None] * COLS + cols[None, :]


@ll.constexpr_function
def widest_swizzle(rows, cols):
    return ll.NVMMASharedLayout.get_default_for([rows, cols], 16)


@ll.jit
def to_shared(ptr, ROWS: ll.constexpr, COLS: ll.constexpr, WARPS: ll.constexpr, SHARED: ll.constexpr):
    """A [ROWS, COLS] tile stored to shared memory (SHARED "swizzled": the widest NVMMA
    swizzle, else unswizzled)."""
    LOAD: ll.constexpr = ll.BlockedLayout([1, 8], [4, 8], [WARPS, 1], [1, 0])
    tile = ll.load(ptr + tile_offsets(ROWS, COLS, LOAD))
    layout: ll.constexpr = ll.SwizzledSharedLayout(1, 1, 1, [1, 0])
    if SHARED == "swizzled":
        layout = widest_swizzle(ROWS, COLS)
    smem = ll.allocate_shared_memory(tile.dtype, [ROWS, COLS], layout)
    smem.store(tile)
    return smem


@ll.jit
def through_shared(ptr, ROWS: ll.constexpr, COLS: ll.constexpr, WARPS: ll.constexpr, SHARED: ll.constexpr,
                   LAYOUT: ll.constexpr):
    """A [ROWS, COLS] tile through shared memory (`to_shared`), loaded back in LAYOUT."""
    return to_shared(ptr, ROWS, COLS, WARPS, SHARED).load(LAYOUT)


@ll.jit
def shared_dot(a_ptr, b_ptr, c_ptr, out_ptr, M: ll.constexpr, N: ll.constexpr, K: ll.constexpr,
               WARPS_M: ll.constexpr, WARPS_N: ll.constexpr, SHARED: ll.constexpr, B_T: ll.constexpr):
    """out = a @ b + c with mma_v2 reading both operands from shared memory (`to_shared`):
    a [M, K]; b a [K, N] buffer or, B_T, the transposed view of b^T stored [N, K] (K
    contiguous, as attention's K tile; ldmatrix reads those, a [K, N] b element pairs)."""
    ACC: ll.constexpr = ll.NVMMADistributedLayout([2, 0], [WARPS_M, WARPS_N], [16, 8])
    a = to_shared(a_ptr, M, K, WARPS_M * WARPS_N, SHARED)
    if B_T:
        b = to_shared(b_ptr, N, K, WARPS_M * WARPS_N, SHARED).permute((1, 0))
    else:
        b = to_shared(b_ptr, K, N, WARPS_M * WARPS_N, SHARED)
    acc = ll.load(c_ptr + tile_offsets(M, N, ACC))
    ll.store(out_ptr + tile_offsets(M, N, ACC), ll.mma_v2(a, b, acc))


@ll.jit
def warp_dot(a_ptr, b_ptr, c_ptr, out_ptr, M: ll.constexpr, N: ll.constexpr, K: ll.constexpr,
             WARPS_M: ll.constexpr, WARPS_N: ll.constexpr, SHARED: ll.constexpr):
    """out = a @ b + c, with a and b through shared memory in SHARED."""
    ACC: ll.constexpr = ll.NVMMADistributedLayout([2, 0], [WARPS_M, WARPS_N], [16, 8])
    a = through_shared(a_ptr, M, K, WARPS_M * WARPS_N, SHARED, ll.DotOperandLayout(0, ACC, 2))
    b = through_shared(b_ptr, K, N, WARPS_M * WARPS_N, SHARED, ll.DotOperandLayout(1, ACC, 2))
    acc = ll.load(c_ptr + tile_offsets(M, N, ACC))
    ll.store(out_ptr + tile_offsets(M, N, ACC), ll.mma_v2(a, b, acc))


@ll.jit
def branch_dot(q_ptr, k_ptr, x_ptr, out_ptr):
    """Warps with some x > 1 (of their 16 rows) replace x by q @ k^T, q and k read from
    swizzled shared memory inside the branch (as each instruction needs them: all of k
    would be 128 registers a thread); the others keep x. [64, 64] @ [64, 128]."""
    S: ll.constexpr = ll.NVMMADistributedLayout([3, 0], [4, 1], [16, 128, 16])  # wgmma's S
    MMA: ll.constexpr = ll.NVMMADistributedLayout([2, 0], [4, 1], [16, 8])  # the same registers
    LOAD: ll.constexpr = ll.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    q = ll.load(q_ptr + tile_offsets(64, 64, LOAD))
    k = ll.load(k_ptr + tile_offsets(128, 64, LOAD))
    q_smem = ll.allocate_shared_memory(q.dtype, [64, 64], ll.NVMMASharedLayout(128, 16))
    k_smem = ll.allocate_shared_memory(k.dtype, [128, 64], ll.NVMMASharedLayout(128, 16))
    q_smem.store(q)
    k_smem.store(k)
    x = ll.load(x_ptr + tile_offsets(64, 128, S))
    if ll.warp_any(x > 1.0):
        x = ll.mma_v2(q_smem, k_smem.permute((1, 0)), ll.zeros([64, 128], ll.float32, MMA))
    ll.store(out_ptr + tile_offsets(64, 128, S), x)


SHAPES = [  # M, N, K, warps along M, warps along N
    (16, 8, 16, 1, 1),
    (64, 128, 64, 4, 1),
    (32, 64, 32, 2, 2),
    (64, 32, 32, 1, 4),
    (32, 16, 128, 2, 1),
]


def _operands(m, n, k, dtype):
    a = RNG.standard_normal((m, k)).astype(dtype)
    b = RNG.standard_normal((k, n)).astype(dtype)
    c = RNG.standard_normal((m, n)).astype(np.float32)
    return a, b, c


def _reference(a, b, c):
    return a.astype(np.float64) @ b.astype(np.float64) + c


@pytest.mark.parametrize("m, n, k, warps_m, warps_n", SHAPES)
@pytest.mark.parametrize("shared", ["swizzled", "plain"])
def test_mma_v2_matches_numpy(m, n, k, warps_m, warps_n, shared):
    a, b, c = _operands(m, n, k, np.float16)
    out = np.zeros((m, n), np.float32)
    warp_dot[(1,)](a, b, c, out, M=m, N=n, K=k, WARPS_M=warps_m, WARPS_N=warps_n, SHARED=shared,
                   num_warps=warps_m * warps_n)
    np.testing.assert_allclose(out, _reference(a, b, c), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("m, n, k, warps_m, warps_n", SHAPES)
@pytest.mark.parametrize("shared", ["swizzled", "plain"])
@pytest.mark.parametrize("b_t", [False, True])
def test_mma_v2_reads_shared_operands(m, n, k, warps_m, warps_n, shared, b_t):
    a, b, c = _operands(m, n, k, np.float16)
    out = np.zeros((m, n), np.float32)
    shared_dot[(1,)](a, np.ascontiguousarray(b.T) if b_t else b, c, out, M=m, N=n, K=k, WARPS_M=warps_m,
                     WARPS_N=warps_n, SHARED=shared, B_T=b_t, num_warps=warps_m * warps_n)
    np.testing.assert_allclose(out, _reference(a, b, c), rtol=1e-5, atol=1e-4)


def _branch_inputs():
    q = RNG.standard_normal((64, 64)).astype(np.float16)
    k = RNG.standard_normal((128, 64)).astype(np.float16)
    x = RNG.random((64, 128)).astype(np.float32)
    x[20, 7] = 2.0  # warp 1 (rows 16..31) takes the branch
    x[63, 100] = 3.0  # and warp 3
    return q, k, x


def _bf16(x):
    """float32 values rounded to bf16 (nearest even), as float32."""
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16).astype(np.uint32)
    return rounded.view(np.float32)


def _branch_expected(q, k, x):
    s = q.astype(np.float64) @ k.astype(np.float64).T
    expected = x.astype(np.float64).copy()
    for warp in (1, 3):
        rows = slice(16 * warp, 16 * warp + 16)
        expected[rows] = s[rows]
    return expected


def test_mma_v2_in_a_per_warp_branch_reads_shared_memory():
    q, k, x = _branch_inputs()
    out = np.zeros_like(x)
    branch_dot[(1,)](q, k, x, out, num_warps=4)
    np.testing.assert_allclose(out, _branch_expected(q, k, x), rtol=1e-5, atol=1e-4)


@pytest.mark.skipif(ptxas.find_ptxas() is None, reason="ptxas not found")
def test_mma_v2_through_ptxas():
    compiled = warp_dot.compile(signature={"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp32",
                                           "out_ptr": "*fp32"},
                                constexprs=dict(M=64, N=128, K=64, WARPS_M=4, WARPS_N=1, SHARED="swizzled"),
                                num_warps=4)
    assert compiled.asm["ptx"].count("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32") == 64
    # Operands in shared memory: per warp, one ldmatrix.x4 per A fragment (its 16 rows x 16
    # of K: 4) and per two B fragments (two 16 x 8: 32) where K is contiguous; a [K, N] B
    # is read by 16-bit loads (two per word: 256).
    signature = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp32", "out_ptr": "*fp32"}
    for b_t, x4, halves in ((True, 4 + 32, 0), (False, 4, 256)):
        ptx = shared_dot.compile(signature=signature, num_warps=4, constexprs=dict(
            M=64, N=128, K=64, WARPS_M=4, WARPS_N=1, SHARED="swizzled", B_T=b_t)).asm["ptx"]
        assert ptx.count("ldmatrix.sync.aligned.m8n8.x4.shared.b16") == x4
        assert ptx.count("ld.shared.b16") == halves
        assert ptx.count("mma.sync.aligned.m16n8k16") == 64
    branch = branch_dot.compile(signature={"q_ptr": "*fp16", "k_ptr": "*fp16", "x_ptr": "*fp32",
                                           "out_ptr": "*fp32"}, num_warps=4)
    ptx = branch.asm["ptx"]
    assert ptx.count("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32") == 64
    # The branch holds no barrier: the one its shared reads need after the stores comes
    # before the branch.
    skip = ptx.index("bra", ptx.index("vote.sync.any"))
    assert "bar.sync" in ptx[:skip] and "bar.sync" not in ptx[skip:ptx.index("mma.sync")]
    assert branch.metadata.get("spill_stores", 0) == 0


@pytest.mark.gpu
@pytest.mark.parametrize("m, n, k, warps_m, warps_n", SHAPES)
def test_gpu_mma_v2_matches_numpy(m, n, k, warps_m, warps_n):
    torch = pytest.importorskip("torch")
    for dtype in (np.float16, np.float32):
        a, b, c = _operands(m, n, k, np.float16 if dtype == np.float16 else np.float32)
        ta, tb = (torch.from_numpy(t).cuda() for t in (a, b))
        if dtype == np.float32:  # bf16 operands
            ta, tb = ta.bfloat16(), tb.bfloat16()
            a, b = _bf16(a), _bf16(b)
        out = torch.zeros((m, n), device="cuda")
        warp_dot[(1,)](ta, tb, torch.from_numpy(c).cuda(), out, M=m, N=n, K=k, WARPS_M=warps_m,
                       WARPS_N=warps_n, SHARED="swizzled", num_warps=warps_m * warps_n)
        np.testing.assert_allclose(out.cpu().numpy(), _reference(a, b, c), rtol=1e-4, atol=1e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("m, n, k, warps_m, warps_n", SHAPES)
@pytest.mark.parametrize("b_t", [False, True])
def test_gpu_mma_v2_reads_shared_operands(m, n, k, warps_m, warps_n, b_t):
    torch = pytest.importorskip("torch")
    a, b, c = _operands(m, n, k, np.float16)
    out = torch.zeros((m, n), device="cuda")
    b_in = np.ascontiguousarray(b.T) if b_t else b
    shared_dot[(1,)](*(torch.from_numpy(t).cuda() for t in (a, b_in, c)), out, M=m, N=n, K=k, WARPS_M=warps_m,
                     WARPS_N=warps_n, SHARED="swizzled", B_T=b_t, num_warps=warps_m * warps_n)
    np.testing.assert_allclose(out.cpu().numpy(), _reference(a, b, c), rtol=1e-4, atol=1e-3)


@pytest.mark.gpu
def test_gpu_mma_v2_in_a_per_warp_branch():
    torch = pytest.importorskip("torch")
    q, k, x = _branch_inputs()
    out = torch.zeros((64, 128), device="cuda")
    branch_dot[(1,)](*(torch.from_numpy(t).cuda() for t in (q, k, x)), out, num_warps=4)
    np.testing.assert_allclose(out.cpu().numpy(), _branch_expected(q, k, x), rtol=1e-4, atol=1e-3)


@ll.jit
def bad_dot(a_ptr, out_ptr, CASE: ll.constexpr):
    ACC: ll.constexpr = ll.NVMMADistributedLayout([2, 0], [1, 1], [16, 8])
    BLOCKED: ll.constexpr = ll.BlockedLayout([1, 1], [4, 8], [1, 1], [1, 0])
    acc = ll.zeros([16, 8], ll.float32, ACC)
    a = ll.load(a_ptr + tile_offsets(16, 16, ll.DotOperandLayout(0, ACC, 2)))
    b = ll.load(a_ptr + tile_offsets(16, 8, ll.DotOperandLayout(1, ACC, 2)))
    if CASE == "blocked a":
        a = ll.load(a_ptr + tile_offsets(16, 16, BLOCKED))
    elif CASE == "fp32 a":
        a = a.to(ll.float32)
    elif CASE == "blocked acc":
        acc = ll.zeros([16, 8], ll.float32, BLOCKED)
    elif CASE == "short k":
        b = ll.load(a_ptr + tile_offsets(32, 8, ll.DotOperandLayout(1, ACC, 2)))
    ll.store(out_ptr + tile_offsets(16, 8, ACC), ll.mma_v2(a, b, acc))


@pytest.mark.parametrize("case, message", [
    ("blocked a", "mma_v2 a must be in DotOperandLayout(0, <acc layout>, 2)"),
    ("fp32 a", "two fp16 or two bf16 operands"),
    ("blocked acc", "NVMMADistributedLayout(version=[2, 0]"),
    ("short k", "shapes do not chain"),
])
def test_mma_v2_errors_point_at_the_call(case, message):
    a = np.zeros(512, np.float16)
    with pytest.raises(CompilationError) as error:
        bad_dot[(1,)](a, np.zeros(128, np.float32), CASE=case, num_warps=1)
    assert message in str(error.value)
    assert "ll.mma_v2(a, b, acc)" in str(error.value)
