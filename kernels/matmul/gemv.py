"""Matrix-vector products for decode at M = 1, written in weft.lowlevel: no tensor cores.

At M = 1 a matmul is a read of B at DRAM speed; wgmma tiles (64 rows at least) compute
63 rows of zeros and stage B through shared memory. Here each CTA reads a BLOCK_N-column
strip of B straight into registers in 16-byte vectors (VEC elements a thread), multiplies
by the A row and sums the products, for one K part of one row: grid (cdiv(N, BLOCK_N),
SPLIT_K, M). One part (SPLIT_K = 1) writes C. More (so that N / BLOCK_N x SPLIT_K CTAs
keep enough loads in flight) add their fp32 sums into a zeroed workspace with atomics
and count themselves in the strip's arrival counter, as split_k.py's units do: the
last to arrive reads the sums back, writes them to C and leaves zeros behind, so one
launch does it all and the next finds the workspace ready.

B's tile follows its contiguous dimension so every load is a whole vector:
- K-major B (B^T given as [N, K], as nn.Linear holds weights): [BLOCK_N, BLOCK_K], a warp
  along K (32 x VEC contiguous elements of one column), the warps over columns; the sum
  runs along K.
- row-major B ([K, N]): [BLOCK_K, BLOCK_N], BLOCK_N / VEC threads along N and the rest of
  the warp and the warps down K; the sum runs down K.
"""

from __future__ import annotations

from ... import lowlevel as ll


@ll.constexpr_function
def gemv_layout(block_n, vec, b_k_major, num_warps):
    """The BlockedLayout of B's tile (see the module docstring)."""
    if b_k_major:
        return ll.BlockedLayout([1, vec], [1, 32], [num_warps, 1], [1, 0])
    return ll.BlockedLayout([1, vec], [32 * vec // block_n, block_n // vec], [num_warps, 1], [1, 0])


def gemv_tile_error(block_n: int, block_k: int, num_warps: int, vec: int, b_k_major: bool) -> str | None:
    """Why B's tile cannot take `gemv_layout` (its threads would not cover it), or None."""
    if b_k_major:
        if block_k % (32 * vec) or block_n % num_warps:
            return (f"K-major B takes block_k a multiple of {32 * vec} (a warp's 32 x {vec}-element "
                    f"vectors along K) and block_n a multiple of num_warps={num_warps}; got "
                    f"block_n={block_n}, block_k={block_k}")
        return None
    if not vec <= block_n <= 32 * vec or block_k % (32 * vec // block_n * num_warps):
        return (f"row-major B takes block_n from {vec} to {32 * vec} (whole {vec}-element vectors "
                f"along N within a warp) and block_k a multiple of the rows the warps cover "
                f"({32 * vec} / block_n x num_warps); got block_n={block_n}, block_k={block_k}")
    return None


@ll.jit
def gemv(a_ptr, b_ptr, c_ptr, partial_ptr, arrivals_ptr, N, K, stride_am, stride_b, stride_cm,
         BLOCK_N: ll.constexpr, BLOCK_K: ll.constexpr, VEC: ll.constexpr, SPLIT_K: ll.constexpr,
         B_K_MAJOR: ll.constexpr, NUM_WARPS: ll.constexpr):
    """c[row, cols] (+)= A[row, K part] @ B[K part, cols]; stride_b: B's stride along its
    non-contiguous dimension (N for K-major B, K for row-major). Split: partial_ptr is a
    zeroed fp32 workspace of C's rows and row stride, arrivals_ptr zeroed int32 counters,
    one per strip and row (neither is read unsplit)."""
    layout: ll.constexpr = gemv_layout(BLOCK_N, VEC, B_K_MAJOR, NUM_WARPS)
    col_layout: ll.constexpr = ll.SliceLayout(1 if B_K_MAJOR else 0, layout)
    k_layout: ll.constexpr = ll.SliceLayout(0 if B_K_MAJOR else 1, layout)
    row = ll.program_id(2)
    cols = ll.program_id(0) * BLOCK_N + ll.arange(0, BLOCK_N, col_layout)
    ks = ll.arange(0, BLOCK_K, k_layout)
    per_part = ll.cdiv(ll.cdiv(K, BLOCK_K), SPLIT_K) * BLOCK_K
    begin = ll.program_id(1) * per_part
    end = ll.minimum(begin + per_part, K)
    tile: ll.constexpr = [BLOCK_N, BLOCK_K] if B_K_MAJOR else [BLOCK_K, BLOCK_N]
    acc = ll.zeros(tile, ll.float32, layout)
    for k0 in range(begin, end, BLOCK_K):
        kk = k0 + ks
        a = ll.load(a_ptr + row * stride_am + kk, mask=kk < K, other=0.0).to(ll.float32)
        if B_K_MAJOR:
            b = ll.load(b_ptr + cols[:, None] * stride_b + kk[None, :],
                        mask=(cols[:, None] < N) & (kk[None, :] < K), other=0.0)
            acc += b.to(ll.float32) * a[None, :]
        else:
            b = ll.load(b_ptr + kk[:, None] * stride_b + cols[None, :],
                        mask=(kk[:, None] < K) & (cols[None, :] < N), other=0.0)
            acc += b.to(ll.float32) * a[:, None]
    sums = ll.sum(acc, axis=1 if B_K_MAJOR else 0)
    inside = cols < N
    if SPLIT_K > 1:
        at = partial_ptr + row * stride_cm + cols
        ll.atomic_add(at, sums, mask=inside, sem="relaxed")
        # Every thread's adds are issued before the CTA's one release below.
        ll.barrier()
        counter = arrivals_ptr + row * ll.num_programs(0) + ll.program_id(0)
        if ll.atomic_add(counter, 1, sem="acq_rel") == SPLIT_K - 1:
            total = ll.load(at, mask=inside, other=0.0, cache_modifier=".cg")
            ll.store(at, ll.zeros([BLOCK_N], ll.float32, col_layout), mask=inside)
            ll.atomic_xchg(counter, 0, sem="relaxed")
            ll.store(c_ptr + row * stride_cm + cols, total.to(c_ptr.dtype.element_ty), mask=inside)
    else:
        ll.store(c_ptr + row * stride_cm + cols, sums.to(c_ptr.dtype.element_ty), mask=inside)
