"""kernels/matmul's stream-K (stream_k.py, Config.stream_k): the split of the iterations
(stream_k_plan.py) on the CPU; the kernel on the CPU emulator (race and deadlock
tracking on) against numpy float64, with tails in M, N and K, tiles cut into pieces of
one K step and into three and more pieces, whole waves before the shared tiles, and the
arrival counters left zero for the next launch; ptxas (no spills); on the GPU, against
float32 torch, twice through the prepared fast path and under CUDA-graph replays."""

import contextlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weft.compiler.backend import ptxas
from weft.kernels.matmul import Config, reference_matmul
from weft.kernels.matmul import host
from weft.kernels.matmul.config import _deepest
from weft.kernels.matmul.stream_k_plan import cta_iterations, iteration_owner, stream_k_fits_int32, stream_k_tiles

needs_ptxas = pytest.mark.skipif(ptxas.find_ptxas() is None, reason="ptxas not found")


def _sk(block_m, block_n, stages, group_m=1):
    return Config(block_m, block_n, 64, stages, num_warps=block_m // 16, group_m=group_m, stream_k=True)


# ------------------------------------------------------------------ the split, on the CPU
def _pieces(tiles, k_steps, programs):
    """{stream-K tile: [(cta, first step, end step)]} and each CTA's whole data-parallel tiles,
    walked the way the kernel walks them."""
    shared = stream_k_tiles(tiles, k_steps, programs)
    dp_tiles = tiles - shared
    total = shared * k_steps
    pieces = {}
    for pid in range(programs):
        begin, end = cta_iterations(pid, programs, total)
        for t in range(begin // k_steps, -(-end // k_steps)):
            pieces.setdefault(dp_tiles + t, []).append(
                (pid, max(begin - t * k_steps, 0), min(end - t * k_steps, k_steps)))
    whole = {pid: list(range(pid, dp_tiles, programs)) for pid in range(programs)}
    return pieces, whole, dp_tiles


@settings(max_examples=200, deadline=None)
@given(tiles=st.integers(1, 400), k_steps=st.integers(1, 300), programs=st.integers(1, 140))
def test_stream_k_split_covers_every_iteration_once_in_balanced_shares(tiles, k_steps, programs):
    programs = min(programs, tiles * k_steps)  # host.py's grid: at most one CTA per iteration
    pieces, whole, dp_tiles = _pieces(tiles, k_steps, programs)
    assert dp_tiles % programs == 0 and 0 <= dp_tiles <= tiles
    assert stream_k_tiles(tiles, k_steps, programs) == 0 or \
        tiles - dp_tiles < 2 * programs  # the whole waves run whole; at most two waves are shared
    total = (tiles - dp_tiles) * k_steps
    shares = [cta_iterations(p, programs, total) for p in range(programs)]
    if total:
        assert all(end - begin in (total // programs, -(-total // programs)) for begin, end in shares)
        assert all(end > begin for begin, end in shares)  # no CTA without work
    assert shares[0][0] == 0 and shares[-1][1] == total
    assert all(shares[p][1] == shares[p + 1][0] for p in range(programs - 1))
    for i in range(0, total, max(1, total // 50)):  # the owner formula names the share holding i
        owner = iteration_owner(i, programs, total)
        assert shares[owner][0] <= i < shares[owner][1]
    # Every tile: whole in one CTA, or pieces covering its K steps in order, by consecutive
    # CTAs (the kernel's lowest..highest owner), each partial piece in a slot of its own.
    assert sorted(t for ts in whole.values() for t in ts) == list(range(dp_tiles))
    assert sorted(pieces) == list(range(dp_tiles, tiles))
    slots = set()
    for tile, parts in pieces.items():
        assert [p[1:] for p in parts][0][0] == 0 and parts[-1][2] == k_steps
        assert all(parts[i][2] == parts[i + 1][1] and parts[i][0] + 1 == parts[i + 1][0]
                   for i in range(len(parts) - 1))
        t = tile - dp_tiles
        assert [p[0] for p in parts] == list(range(iteration_owner(t * k_steps, programs, total),
                                                   iteration_owner((t + 1) * k_steps - 1, programs, total) + 1))
        if len(parts) > 1:
            for pid, _, _ in parts:
                slot = 2 * pid + min(t - shares[pid][0] // k_steps, 1)
                assert slot not in slots
                slots.add(slot)


def test_stream_k_tiles_keep_whole_waves_whole():
    assert stream_k_tiles(264, 80, 132) == 0           # two whole waves: nothing shared
    assert stream_k_tiles(96, 79, 132) == 96           # under one wave: every tile shared
    assert stream_k_tiles(192, 79, 132) == 192         # 1.45 waves: the wave and the remainder
    assert stream_k_tiles(400, 79, 132) == 4 + 132     # 3 waves and 4 tiles: the third wave is shared too
    assert stream_k_fits_int32(96, 79, 132) and not stream_k_fits_int32(2048, 8192, 132)


# ------------------------------------------------------------------ the chooser
H100_SMS = 132


def _stream_k_offered(m, n, k, sms=H100_SMS):
    from weft.kernels.matmul import configs_for

    return [(c.block_m, c.block_n) for c in configs_for(16, 16, m, n, k, sms) if c.stream_k]


def test_configs_for_offers_no_stream_k_yet():
    """Stream-K lost to the unsplit and split-K candidates on every class measured
    (docs/performance-journal.md): the autotuner is not given it."""
    from weft.kernels.matmul import configs_for

    for m, n, k in [(1000, 3000, 5000), (512, 512, 32768), (1024, 1024, 65536), (16, 11008, 4096), (4096, 4096, 4096)]:
        assert not [c for c in configs_for(16, 16, m, n, k, H100_SMS) if c.stream_k]


# ------------------------------------------------------------------ emulator
@contextlib.contextmanager
def programs_in_order(order):
    """The emulator runs the CTAs in `order` of their x ids (None: by id). It runs one CTA
    after another, so the last to arrive at a tile is the last of its pieces run."""
    from weft.runtime.emulator import interpreter

    with pytest.MonkeyPatch.context() as patch:
        if order is not None:
            patch.setattr(interpreter, "program_order", lambda grid: [(x, 0, 0) for x in order])
        yield


def _run_stream_k(a, b, out_dtype, config, programs, launches=1):
    """C from `launches` launches of `config` on `programs` CTAs (the same scratch each
    time, as a prepared call or a graph replay reuses it), and the arrival counters after."""
    kind = host._check_inputs(a, b)
    a, b, k_major = host._operands(a, b, kind)
    m, k = a.shape
    n = b.shape[1]
    padded = host.padded_columns(n, np.dtype(out_dtype).itemsize * 8)
    c = np.empty((m, padded), out_dtype)[:, :n]
    a, b = host._aligned(a, k), (host._aligned(b.T, k).T if k_major else host._aligned(b, n))
    call = host._kernel_call(a, b, c, m, n, k, k_major, config, programs, 16, np.dtype(out_dtype).itemsize * 8)
    for _ in range(launches):
        c[:] = np.nan
        host._run(call)
    return c, call[6][1]


def _operands(m, n, k, k_major, rng):
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((n, k)).astype(np.float16).T if k_major else \
        rng.standard_normal((k, n)).astype(np.float16)
    return a, b


def _check(got, a, b, tol):
    ref = reference_matmul(a, b)
    np.testing.assert_allclose(got.astype(np.float64), ref, rtol=tol, atol=tol * max(np.abs(ref).max(), 1.0))


@pytest.mark.parametrize("m, n, k, config, programs, k_major, order", [
    (50, 40, 192, _sk(64, 64, 2), 3, False, None),       # one tile, 3 CTAs: three pieces of one K step
    (50, 40, 150, _sk(64, 64, 3), 3, True, (2, 0, 1)),   # the same with a K tail, K-major B; the first last
    (70, 100, 700, _sk(64, 64, 2), 3, False, (2, 1, 0)),  # 4 tiles of 11 steps: each cut in 2 or 3 pieces
    (200, 100, 260, _sk(64, 64, 2, group_m=8), 3, True, (1, 2, 0)),  # 8 tiles: a whole wave, then 5 shared
    (130, 300, 300, _sk(128, 256, 2, group_m=8), 3, False, (2, 1, 0)),  # 128x256 tiles, in two column halves
    (1, 200, 500, _sk(64, 128, 3), 4, True, (3, 1, 0, 2)),  # decode-like: 2 tiles on 4 CTAs
])
def test_emulated_stream_k_matches_numpy(m, n, k, config, programs, k_major, order):
    """`order`: the CTAs' run order (None: by id), so that each of a tile's pieces is
    somewhere the last to arrive and sums the others."""
    a, b = _operands(m, n, k, k_major, np.random.default_rng(m * n + k))
    with programs_in_order(order):
        got, arrivals = _run_stream_k(a, b, np.float32, config, programs, launches=2)
    _check(got, a, b, 1e-4)
    assert not arrivals.any()  # every counter back at zero: the next launch needs no memset


def test_emulated_stream_k_is_the_same_to_the_bit_whichever_piece_arrives_last():
    """A tile's pieces add in CTA order, whichever CTA sums them: deterministic C."""
    a, b = _operands(50, 40, 700, False, np.random.default_rng(5))  # one tile, 4 pieces
    results = []
    for order in [(0, 1, 2, 3), (3, 2, 1, 0), (1, 3, 0, 2)]:
        with programs_in_order(order):
            results.append(_run_stream_k(a, b, np.float32, _sk(64, 64, 2), 4)[0])
    assert all(np.array_equal(results[0], r) for r in results[1:])
    _check(results[0], a, b, 1e-4)


@settings(max_examples=6, deadline=None)
@given(m=st.integers(1, 140), n=st.integers(1, 140), k=st.integers(1, 700), programs=st.integers(1, 7),
       config=st.sampled_from([_sk(64, 64, 2), _sk(64, 128, 3), _sk(64, 64, 3, group_m=8)]),
       k_major=st.booleans(), seed=st.integers(0, 2**16), data=st.data())
def test_emulated_stream_k_on_any_small_shape(m, n, k, programs, config, k_major, seed, data):
    """Cut points wherever the shape and the CTA count put them (pieces of one step where
    the CTAs nearly outnumber the iterations), the CTAs run in any order."""
    tiles, k_steps = -(-m // 64) * -(-n // config.block_n), -(-k // 64)
    programs = min(programs, tiles * k_steps)
    order = data.draw(st.permutations(range(programs)))
    a, b = _operands(m, n, k, k_major, np.random.default_rng(seed))
    with programs_in_order(order):
        got, arrivals = _run_stream_k(a, b, np.float16, config, programs)
    _check(got, a, b, 2e-3)
    assert not arrivals.any()


def test_emulated_stream_k_through_matmul_bf16():
    """The public call, on CPU torch tensors (bf16: numpy has none), on host.py's grid."""
    torch = pytest.importorskip("torch")
    from weft.kernels.matmul import matmul

    g = torch.Generator().manual_seed(7)
    a = torch.randn(90, 400, generator=g).to(torch.bfloat16)
    b = torch.randn(72, 400, generator=g).to(torch.bfloat16).T
    got = matmul(a, b, config=_sk(64, 64, 3))
    assert got.dtype == torch.bfloat16
    _check(got.float().numpy(), a, b, 1e-2)


def test_stream_k_config_rejects_what_it_cannot_share():
    with pytest.raises(ValueError, match="stream_k=True"):
        Config(stream_k=True, split_k=2)
    with pytest.raises(ValueError, match="stream_k=True"):
        Config(128, 192, stream_k=True)
    with pytest.raises(ValueError, match="stream_k=True"):
        Config(stream_k=True, variant="pipelined")
    assert host.unsplit([Config(stream_k=True)]) == [Config(stream_k=True)]  # deterministic: it stays


def test_stream_k_prepared_call_repeats_one_launch_on_the_kept_scratch():
    """On the (stubbed) GPU: one CTA per SM, the whole waves' count passed as dp_tiles,
    and a repeated call repeats the one launch with no memset: the slots need none and the
    kernel leaves the counters zero."""
    torch = pytest.importorskip("torch")
    from weft.runtime import driver

    from .fake_gpu import H100_SMS, fake_gpu
    from .test_host_fast_path import _Calls, _long_way_only, _normalized

    a = torch.randn(1000, 512).to(torch.bfloat16)
    b = torch.randn(512, 3000).to(torch.bfloat16)
    config = Config(128, 256, 64, 3, group_m=8, stream_k=True)
    from weft.kernels.matmul import matmul

    with fake_gpu() as fake, pytest.MonkeyPatch.context() as patch:
        patch.setattr(driver, "make_address_context_current", lambda address: None)
        long_way = _Calls(patch, host)
        matmul(a, b, config=config)
        memsets, launches = len(fake.memsets), len(fake.launches)
        second = matmul(a, b, config=config)
        assert long_way.count == 1 and len(fake.memsets) == memsets and len(fake.launches) == launches + 1
        with _long_way_only():
            ref = matmul(a, b, config=config)
        assert _normalized(fake, fake.launches[-2], (second,)) == _normalized(fake, fake.launches[-1], (ref,))
        launch = fake.launches[-1]
        assert launch["grid"] == (H100_SMS, 1, 1)
        # 8 x 12 = 96 tiles: under one wave, so none runs whole (dp_tiles, the last parameter, is 0).
        assert int.from_bytes(launch["params"][-1][:4], "little") == 0
        # 32 x 12 = 384 tiles: one wave whole, the third wave's 120 tiles and the second shared.
        matmul(torch.randn(4000, 512).to(torch.bfloat16), b, config=config)
        assert int.from_bytes(fake.launches[-1]["params"][-1][:4], "little") == 132


# ------------------------------------------------------------------ ptxas
@needs_ptxas
@pytest.mark.parametrize("config, k_major", [
    (Config(128, 256, 64, 3, group_m=8, stream_k=True), False), (Config(128, 256, 64, 3, group_m=8, stream_k=True), True),
    (Config(128, 128, 64, 5, group_m=8, stream_k=True), False), (Config(64, 128, 64, 8, num_warps=4, stream_k=True), True),
])
def test_stream_k_assembles_without_spills(config, k_major):
    from weft.kernels.matmul.stream_k import stream_k_matmul

    config = _deepest(config, 16, 16)
    b_box = [config.block_n, config.block_k] if k_major else [config.block_k, min(64, config.block_n)]
    signature = {"a_desc": f"tensordesc<bf16[{config.block_m},{config.block_k}]>",
                 "b_desc": f"tensordesc<bf16[{b_box[0]},{b_box[1]}]>",
                 "c_desc": f"tensordesc<bf16[{config.block_m},{min(64, config.block_n)}]>",
                 "partial_ptr": "*fp32", "arrivals_ptr": "*i32", "M": "i32", "N": "i32", "K": "i32",
                 "dp_tiles": "i32"}
    constexprs = dict(BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
                      STAGES=config.stages, GROUP_M=config.group_m, B_K_MAJOR=k_major,
                      NUM_WARPS=config.num_warps, PRODUCER_REGS=config.producer_regs)
    compiled = stream_k_matmul.compile(signature=signature, constexprs=constexprs, num_warps=config.num_warps,
                                       specialization={"partial_ptr": "divisible_by_16"})
    ptx = compiled.asm["ptx"]
    assert "wgmma.mma_async" in ptx and "atom.acq_rel.gpu.global.add" in ptx and "ld.global.cg.v2" in ptx
    assert compiled.metadata["spill_stores"] == 0 and compiled.metadata["spill_loads"] == 0, compiled.metadata


# ------------------------------------------------------------------ on the GPU
GPU_SHAPES = [(1000, 3000, 5000, False), (1000, 3000, 5000, True), (512, 512, 32768, False),
              (768, 1024, 32768, True), (16, 11008, 4096, True), (333, 2047, 1999, True), (4095, 4097, 4093, False)]
GPU_CONFIGS = [Config(128, 256, 64, 3, group_m=8, stream_k=True), Config(128, 128, 64, 5, group_m=8, stream_k=True),
               Config(64, 128, 64, 8, num_warps=4, group_m=1, stream_k=True)]


@pytest.mark.gpu
@pytest.mark.parametrize("m, n, k, k_major", GPU_SHAPES)
def test_gpu_stream_k_matches_torch(m, n, k, k_major):
    """Each stream-K tile shape, three times (the later calls through the prepared fast
    path: the counters must come back zero; the same bits each time), then replayed in
    a CUDA graph."""
    torch = pytest.importorskip("torch")
    from weft.kernels.matmul import matmul

    gen = torch.Generator(device="cuda").manual_seed(11)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=gen).t() if k_major else \
        torch.randn(k, n, device="cuda", dtype=torch.bfloat16, generator=gen)
    ref = a.float() @ b.float()
    scale = ref.abs().max().item()
    for config in GPU_CONFIGS:
        first = matmul(a, b, config=config)
        assert (first.float() - ref).abs().max().item() <= 1e-2 * scale, config
        for attempt in range(2):
            assert torch.equal(matmul(a, b, config=config), first), (config, attempt)  # pieces add in one order
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = matmul(a, b, config=config)
        for replay in range(3):
            captured.zero_()
            graph.replay()
            torch.cuda.synchronize()
            assert (captured.float() - ref).abs().max().item() <= 1e-2 * scale, (config, "replay", replay)
