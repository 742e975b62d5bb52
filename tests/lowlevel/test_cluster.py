"""Thread-block clusters in weft.lowlevel: multicast TMA loads, mbarrier arrivals on a peer
CTA's barrier and cluster barriers, on the emulator (clusters of one and two CTAs, with
its deadlock and race reports) and on the GPU (tests marked `gpu`), against numpy."""

import re

import numpy as np
import pytest

from weft import lowlevel as ll
from weft.compiler.errors import CompilationError
from weft.lowlevel import mbarrier, tma
from weft.runtime.arguments import LaunchError
from weft.runtime.emulator import EmulationError
from weft.runtime.tensor_descriptor import TensorDescriptor

LAYOUT = ll.NVMMASharedLayout(128, 16)
BLOCKED = ll.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
ROWS, COLS = 64, 128  # a tile of two 64-column boxes


@ll.jit
def multicast_copy(src, dst, CLUSTER: ll.constexpr):
    """Cluster c copies src's rows [64c, 64c + 64) into dst's rows of each of its CTAs: CTA
    rank r loads the boxes j with j % CLUSTER == r into every CTA of the cluster, then each
    CTA tells its peer it is done (an arrival on the peer's barrier) and stores the tile."""
    tile = ll.allocate_shared_memory(ll.float16, [ROWS, COLS], src.layout)
    loaded = mbarrier.allocate_mbarrier()
    peer_done = mbarrier.allocate_mbarrier()
    mbarrier.init(loaded, count=1)
    mbarrier.init(peer_done, count=1)
    ll.cluster_barrier()  # the peer's barriers are initialised before it is sent anything
    rank = ll.program_id(0) % CLUSTER
    row = ll.program_id(0) // CLUSTER * ROWS
    mbarrier.expect(loaded, 2 * src.nbytes)  # both boxes land here, whoever loads them
    for j in ll.static_range(2):
        tma.async_copy_global_to_shared(src, [row, j * 64], loaded, tile.slice(j * 64, 64, 1),
                                        rank == j % CLUSTER, multicast=(1 << CLUSTER) - 1)
    mbarrier.wait(loaded, 0)
    mbarrier.arrive(peer_done, cta=(rank + 1) % CLUSTER)
    mbarrier.wait(peer_done, 0)
    for j in ll.static_range(2):
        tma.async_copy_shared_to_global(dst, [ll.program_id(0) * ROWS, j * 64], tile.slice(j * 64, 64, 1))
    tma.store_wait(0)
    ll.cluster_barrier()  # no peer still writes into this CTA's shared memory
    mbarrier.invalidate(loaded)
    mbarrier.invalidate(peer_done)


def _descriptors(src, dst):
    return (TensorDescriptor(src, list(src.shape), [COLS, 1], [ROWS, 64], LAYOUT),
            TensorDescriptor(dst, list(dst.shape), [COLS, 1], [ROWS, 64], LAYOUT))


def _inputs(clusters: int, cluster: int):
    src = np.random.default_rng(clusters).standard_normal((clusters * ROWS, COLS)).astype(np.float16)
    return src, np.zeros((clusters * cluster * ROWS, COLS), np.float16)


def _expected(src, cluster: int):
    return np.repeat(src.reshape(-1, 1, ROWS, COLS), cluster, axis=1).reshape(-1, COLS)


def test_the_emulator_runs_clusters_of_one_cta():
    src, dst = _inputs(3, 1)
    multicast_copy[(3,)](*_descriptors(src, dst), CLUSTER=1)
    np.testing.assert_array_equal(dst, _expected(src, 1))


@pytest.mark.parametrize("clusters", [1, 3])
def test_the_emulator_runs_clusters_of_two(clusters):
    """Each CTA loads half of the tile into both; each waits for the other's arrival."""
    src, dst = _inputs(clusters, 2)
    multicast_copy[(2 * clusters,)](*_descriptors(src, dst), CLUSTER=2, cluster=(2, 1, 1))
    np.testing.assert_array_equal(dst, _expected(src, 2))


def test_ranks_outside_the_cluster_are_errors():
    src, dst = _inputs(1, 2)
    with pytest.raises(EmulationError, match="rank 1 is not a CTA of the cluster: the launch has clusters "
                                             "of one CTA"):
        multicast_copy[(2,)](*_descriptors(src, dst), CLUSTER=2)  # mask 3 names rank 1
    with pytest.raises(LaunchError, match="not a whole number of clusters"):
        multicast_copy[(3,)](*_descriptors(src, dst), CLUSTER=2, cluster=(2, 1, 1))


@ll.jit
def arrival_from_rank_1(src, dst, TARGET: ll.constexpr, WAIT_AND_MEET: ll.constexpr):
    """Rank 1 arrives once on the barrier of rank TARGET; with WAIT_AND_MEET each CTA then
    waits for its barrier's first phase and the two meet before the end."""
    bar = mbarrier.allocate_mbarrier()
    mbarrier.init(bar, count=1)
    ll.cluster_barrier()
    if ll.program_id(0) % 2 == 1:
        mbarrier.arrive(bar, cta=TARGET)
    if WAIT_AND_MEET:
        mbarrier.wait(bar, 0)
        ll.cluster_barrier()
        mbarrier.invalidate(bar)


def test_a_wait_no_peer_completes_is_a_deadlock():
    src, dst = _inputs(1, 2)
    with pytest.raises(EmulationError, match=r"(?s)deadlock.*CTA rank 0 waits .* for phase 0 .* `bar` of "
                                             r"CTA rank 0.*1 of 1 arrivals still pending"):
        arrival_from_rank_1[(2,)](*_descriptors(src, dst), TARGET=1, WAIT_AND_MEET=True, cluster=(2, 1, 1))


@ll.jit
def arrive_before_the_peer_inits(src, dst):
    """No cluster barrier between the inits and the first remote arrival."""
    bar = mbarrier.allocate_mbarrier()
    mbarrier.init(bar, count=1)
    mbarrier.arrive(bar, cta=(ll.program_id(0) + 1) % 2)
    mbarrier.wait(bar, 0)
    ll.cluster_barrier()
    mbarrier.invalidate(bar)


def test_an_arrival_on_a_peer_barrier_needs_its_init_ordered_first():
    src, dst = _inputs(1, 2)
    with pytest.raises(EmulationError, match="`bar` of CTA rank 1 .* before mbarrier_init: its CTA initialises "
                                             "it, then ll.cluster_barrier"):
        arrive_before_the_peer_inits[(2,)](*_descriptors(src, dst), cluster=(2, 1, 1))


@ll.jit
def reload_the_shared_tile(src, dst, WAIT_FOR_PEER: ll.constexpr):
    """Both CTAs of a pair read the tile they share, then load the next one into it: one
    CTA's multicast overwrites its peer's copy too, so it must first know the peer has read
    (the peer's arrival on its `peer_read`), or that is a race."""
    tile = ll.allocate_shared_memory(ll.float16, [ROWS, COLS], src.layout)
    loaded = mbarrier.allocate_mbarrier()
    peer_read = mbarrier.allocate_mbarrier()
    mbarrier.init(loaded, count=1)
    mbarrier.init(peer_read, count=1)
    ll.cluster_barrier()
    rank = ll.program_id(0) % 2
    for step in ll.static_range(2):
        mbarrier.expect(loaded, 2 * src.nbytes)
        for j in ll.static_range(2):
            tma.async_copy_global_to_shared(src, [step * ROWS, j * 64], loaded, tile.slice(j * 64, 64, 1),
                                            rank == j % 2, multicast=3)
        mbarrier.wait(loaded, step)
        if step == 0:
            first = tile.load(BLOCKED)
            ll.fence_async_shared()  # generic-proxy reads, before the async proxy writes there
            mbarrier.arrive(peer_read, cta=rank ^ 1)
            if WAIT_FOR_PEER:
                mbarrier.wait(peer_read, 0)
    rows = ll.arange(0, ROWS, ll.SliceLayout(1, BLOCKED))
    cols = ll.arange(0, COLS, ll.SliceLayout(0, BLOCKED))
    ll.store(dst + (ll.program_id(0) * ROWS + rows[:, None]) * COLS + cols[None, :], first + tile.load(BLOCKED))
    ll.cluster_barrier()
    mbarrier.invalidate(loaded)
    mbarrier.invalidate(peer_read)


def test_a_multicast_into_a_peer_is_ordered_after_its_reads(monkeypatch):
    monkeypatch.delenv("WEFT_EMULATE_SHUFFLE", raising=False)  # the race named below is oldest-first's
    src = np.random.default_rng(7).standard_normal((2 * ROWS, COLS)).astype(np.float16)
    descriptor = TensorDescriptor(src, list(src.shape), [COLS, 1], [ROWS, 64], LAYOUT)
    dst = np.zeros((2 * ROWS, COLS), np.float16)
    reload_the_shared_tile[(2,)](descriptor, dst, WAIT_FOR_PEER=True, cluster=(2, 1, 1))
    expected = src[:ROWS].astype(np.float32) + src[ROWS:].astype(np.float32)
    np.testing.assert_allclose(dst.astype(np.float32), np.vstack([expected, expected]), rtol=1e-2, atol=1e-2)
    # Rank 0 reloads both copies before rank 1 has even waited for the first tile.
    with pytest.raises(EmulationError, match=r"shared-memory race.*: CTA rank 0 warp 0 writes byte \d+ of CTA rank 1, "
                                             r"which the TMA load .*still writing"):
        reload_the_shared_tile[(2,)](descriptor, dst, WAIT_FOR_PEER=False, cluster=(2, 1, 1))


def test_a_cta_may_not_exit_while_a_peer_still_uses_it():
    src, dst = _inputs(1, 2)
    with pytest.raises(EmulationError, match="after CTA rank 0 exited .* end the kernel with ll.cluster_barrier"):
        # No cluster barrier at the end: rank 0 may exit before rank 1 arrives on its barrier.
        arrival_from_rank_1[(2,)](*_descriptors(src, dst), TARGET=0, WAIT_AND_MEET=False, cluster=(2, 1, 1))


def test_cluster_option_errors():
    src, dst = _inputs(1, 1)
    with pytest.raises(LaunchError, match="positive ints"):
        multicast_copy[(1,)](*_descriptors(src, dst), CLUSTER=1, cluster=(0, 1))
    with pytest.raises(LaunchError, match="portable limit is 8"):
        multicast_copy[(1,)](*_descriptors(src, dst), CLUSTER=1, cluster=(16, 1, 1))


@ll.jit
def barrier_in_a_partition():
    ll.warp_specialize((), cluster_worker, (), [cluster_worker], worker_num_warps=[4], worker_num_regs=[0])


@ll.jit
def cluster_worker():
    ll.cluster_barrier()


def test_a_cluster_barrier_inside_warp_specialize_is_refused():
    with pytest.raises(CompilationError, match="cluster_barrier inside a warp_specialize partition"):
        barrier_in_a_partition.compile(signature={}, constexprs={}, num_warps=4)


def test_multicast_and_remote_arrive_lower_to_ptx():
    signature = {"src": "tensordesc<fp16[64,64]>", "dst": "tensordesc<fp16[64,64]>"}
    ptx = multicast_copy.compile(signature=signature, constexprs={"CLUSTER": 2}, num_warps=4,
                                 cluster=(2, 1, 1)).asm["ptx"]
    assert ptx.count(".multicast::cluster") == 2
    assert "mapa.shared::cluster.u32" in ptx and "mbarrier.arrive.release.cluster.shared::cluster" in ptx
    assert ptx.count("barrier.cluster.arrive.release.aligned") == 2


@ll.jit
def arrive_on_peer(RANK: ll.constexpr, SCOPE: ll.constexpr):
    bar = mbarrier.allocate_mbarrier()
    mbarrier.init(bar, count=1)
    ll.cluster_barrier()
    mbarrier.arrive(bar, cta=RANK, scope=SCOPE)
    ll.cluster_barrier()


@pytest.mark.parametrize("scope, release", [(None, ".release.cluster"), ("cluster", ".release.cluster"),
                                            ("cta", "")])
def test_remote_arrive_scope(scope, release):
    """A remote arrival releases at cluster scope unless told CTA scope is enough."""
    ptx = arrive_on_peer.compile(signature={}, constexprs={"RANK": 1, "SCOPE": scope}, num_warps=4,
                                 cluster=(2, 1, 1)).asm["ptx"]
    assert f"mbarrier.arrive{release}.shared::cluster.b64 _, [remote], 1;" in ptx


@ll.jit
def arrive_counted(count, PER_WARP: ll.constexpr):
    bar = mbarrier.allocate_mbarrier()
    mbarrier.init(bar, count=8)
    ll.cluster_barrier()
    mbarrier.arrive(bar, count=count, per_warp=PER_WARP)
    mbarrier.arrive(bar, count=count, cta=1, scope="cta")
    ll.cluster_barrier()


@pytest.mark.parametrize("per_warp", [False, True])
def test_a_run_time_arrival_count_is_a_register_operand(per_warp):
    """Each arrive form (once, per warp, on the peer) takes its count from a register."""
    ptx = arrive_counted.compile(signature={"count": "i32"}, constexprs={"PER_WARP": per_warp}, num_warps=1,
                                 cluster=(2, 1, 1)).asm["ptx"]
    arrivals = [line for line in ptx.splitlines() if "mbarrier.arrive" in line]
    assert len(arrivals) == 2
    assert all(re.search(r"\], %r\d+;", line) for line in arrivals), arrivals


@pytest.mark.parametrize("rank, scope, message", [
    (None, "cta", "applies to arrivals on another CTA's barrier"),
    (1, "gpu", 'scope must be "cta" or "cluster"')])
def test_remote_arrive_scope_errors(rank, scope, message):
    with pytest.raises(CompilationError, match=message):
        arrive_on_peer.compile(signature={}, constexprs={"RANK": rank, "SCOPE": scope}, num_warps=4)


@pytest.mark.gpu
@pytest.mark.parametrize("cluster, clusters", [(1, 5), (2, 5), (2, 66)])
def test_gpu_multicast_copy(cluster, clusters):
    torch = pytest.importorskip("torch")
    src, dst = _inputs(clusters, cluster)
    src_gpu, dst_gpu = torch.from_numpy(src).cuda(), torch.from_numpy(dst).cuda()
    options = {"cluster": (cluster, 1, 1)} if cluster > 1 else {}
    multicast_copy[(clusters * cluster,)](*_descriptors(src_gpu, dst_gpu), CLUSTER=cluster, **options)
    np.testing.assert_array_equal(dst_gpu.cpu().numpy(), _expected(src, cluster))


ACC = ll.NVMMADistributedLayout([3, 0], [4, 1], [16, COLS, 16])


@ll.jit
def tile_matmul(a_desc, b_desc, out_ptr):
    """CTA i: out[i] = a[i] @ b[i], a [64, 64] and b [64, 128], b with N contiguous
    (MN-major for wgmma) in two 64-column boxes: its descriptor steps from the first
    swizzle atom to the second by the leading-byte offset."""
    pid = ll.program_id(0)
    a = ll.allocate_shared_memory(ll.float16, [ROWS, 64], a_desc.layout)
    b = ll.allocate_shared_memory(ll.float16, [64, COLS], b_desc.layout)
    loaded = mbarrier.allocate_mbarrier()
    mbarrier.init(loaded, count=1)
    mbarrier.expect(loaded, a_desc.nbytes + 2 * b_desc.nbytes)
    tma.async_copy_global_to_shared(a_desc, [pid * ROWS, 0], loaded, a)
    for j in ll.static_range(2):
        tma.async_copy_global_to_shared(b_desc, [pid * 64, j * 64], loaded, b.slice(j * 64, 64, 1))
    mbarrier.wait(loaded, 0)
    acc = ll.warpgroup_mma(a, b, ll.zeros([ROWS, COLS], ll.float32, ACC))
    rows = ll.arange(0, ROWS, ll.SliceLayout(1, ACC))
    cols = ll.arange(0, COLS, ll.SliceLayout(0, ACC))
    ll.store(out_ptr + (pid * ROWS + rows[:, None]) * COLS + cols[None, :], acc)
    mbarrier.invalidate(loaded)


def _matmul_inputs(ctas: int):
    rng = np.random.default_rng(ctas)
    a = rng.standard_normal((ctas * ROWS, 64)).astype(np.float16)
    b = rng.standard_normal((ctas * 64, COLS)).astype(np.float16)
    expected = np.einsum("cik,ckj->cij", a.reshape(ctas, ROWS, 64).astype(np.float64),
                         b.reshape(ctas, 64, COLS).astype(np.float64)).reshape(-1, COLS)
    return a, b, expected


def _matmul_descriptors(a, b):
    return (TensorDescriptor(a, list(a.shape), [64, 1], [ROWS, 64], LAYOUT),
            TensorDescriptor(b, list(b.shape), [COLS, 1], [64, 64], LAYOUT))


@pytest.mark.parametrize("cluster", [1, 2])
def test_the_emulator_runs_the_two_atom_wgmma(cluster):
    a, b, expected = _matmul_inputs(2)
    out = np.zeros((2 * ROWS, COLS), np.float32)
    tile_matmul[(2,)](*_matmul_descriptors(a, b), out, cluster=(cluster, 1, 1))
    np.testing.assert_allclose(out, expected, rtol=1e-3, atol=1e-2)


def test_wgmma_descriptors_keep_only_the_shared_offset():
    """A CTA's shared::cta addresses carry its cluster rank above bit 18 (0x1000400 for
    rank 1): the descriptor's start-address field takes bits 4-17 alone."""
    signature = {"a_desc": "tensordesc<fp16[64,64]>", "b_desc": "tensordesc<fp16[64,64]>", "out_ptr": "*fp32"}
    llir = tile_matmul.compile(signature=signature, constexprs={}, num_warps=4, cluster=(2, 1, 1)).asm["llir"]
    assert llir.count(f", {0x3FFF0}\n") == 2  # a's descriptor and b's


@pytest.mark.gpu
@pytest.mark.parametrize("cluster", [1, 2])
def test_gpu_wgmma_in_every_cta_of_a_cluster(cluster):
    """Every rank's product is right, past the first 64 columns too."""
    torch = pytest.importorskip("torch")
    a, b, expected = _matmul_inputs(8)
    a_gpu, b_gpu = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
    out = torch.zeros((8 * ROWS, COLS), dtype=torch.float32, device="cuda")
    options = {"cluster": (cluster, 1, 1)} if cluster > 1 else {}
    tile_matmul[(8,)](*_matmul_descriptors(a_gpu, b_gpu), out, **options)
    np.testing.assert_allclose(out.cpu().numpy(), expected, rtol=1e-3, atol=1e-2)


@pytest.mark.gpu
def test_gpu_resident_clusters():
    """The device holds at least one two-CTA cluster, and at most as many as half the CTAs
    its SMs hold at once."""
    torch = pytest.importorskip("torch")
    from weft.runtime import driver

    src, dst = _inputs(1, 2)
    descs = _descriptors(torch.from_numpy(src).cuda(), torch.from_numpy(dst).cuda())
    clusters = multicast_copy.resident_clusters(*descs, CLUSTER=2, cluster=(2, 1, 1))
    per_sm = multicast_copy.resident_ctas(*descs, CLUSTER=2, cluster=(2, 1, 1))
    assert 1 <= clusters <= driver.device_properties(0).sm_count * per_sm // 2, (clusters, per_sm)
    assert multicast_copy.resident_clusters(*_descriptors(src, dst), CLUSTER=1) == 1  # emulated


@ll.jit
def scratch_in_every_cta(counters, x_ptr, olds_ptr, sums_ptr, out_ptr):
    """Three ops whose values pass between a CTA's threads through its shared scratch: a
    scalar atomic's old value, a sum across warps and a layout conversion."""
    pid = ll.program_id(0)
    ll.store(olds_ptr + pid, ll.atomic_add(counters + pid, 1))
    rows = ll.arange(0, 32, layout=ll.SliceLayout(1, BLOCKED))
    cols = ll.arange(0, 128, layout=ll.SliceLayout(0, BLOCKED))
    offsets = pid * 4096 + rows[:, None] * 128 + cols[None, :]
    x = ll.load(x_ptr + offsets)
    ll.store(sums_ptr + pid * 128 + cols, ll.sum(x, axis=0))
    moved = ll.convert_layout(x, ll.BlockedLayout([4, 1], [8, 4], [1, 4], [0, 1]))
    ll.store(out_ptr + offsets, ll.convert_layout(moved, BLOCKED))


@pytest.mark.parametrize("cluster", [1, 2])
def test_the_emulator_keeps_each_ctas_scratch_in_its_own_window(cluster):
    """Scratch offsets are a CTA's own: in a cluster, rank 1's lie in its window of the
    cluster's shared memory, not in rank 0's (where they raced with rank 0's threads)."""
    rng = np.random.default_rng(cluster)
    counters = np.arange(4, dtype=np.int32) * 10
    x = rng.standard_normal((4, 32, 128)).astype(np.float32)
    olds, sums, out = np.zeros(4, np.int32), np.zeros((4, 128), np.float32), np.zeros_like(x)
    scratch_in_every_cta[(4,)](counters, x, olds, sums, out, cluster=(cluster, 1, 1))
    np.testing.assert_array_equal(olds, np.arange(4) * 10)
    np.testing.assert_array_equal(counters, np.arange(4) * 10 + 1)
    np.testing.assert_allclose(sums, x.sum(axis=1), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(out, x)
