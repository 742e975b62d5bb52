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
from weft.kernels.matmul.stream_k_plan import (TAIL_TILES, cta_region, slot_count, split, stream_k_fits_int32,
                                                stream_k_tiles, tile_pieces)

needs_ptxas = pytest.mark.skipif(ptxas.find_ptxas() is None, reason="ptxas not found")


def _sk(block_m, block_n, stages, group_m=1):
    return Config(block_m, block_n, 64, stages, num_warps=block_m // 16, group_m=group_m, stream_k=True)


# ------------------------------------------------------------------ the split, on the CPU
def _walk(tiles, k_steps, programs):
    """{(tile, K step): CTA} and {(tile, slot)} of every shared piece, walked as the kernel
    walks them, and dp_tiles."""
    sk_tiles = stream_k_tiles(tiles, programs)
    dp_tiles = tiles - sk_tiles
    owner, pieces = {}, {}
    for pid in range(programs):
        for tile in range(pid, dp_tiles, programs):
            owner.update({(tile, k): pid for k in range(k_steps)})
        length, offset, begin, end, slot_base = cta_region(pid, sk_tiles, k_steps, programs)
        for u in range(begin // length, -(-end // length)):
            steps = range(offset + max(begin - u * length, 0), offset + min(end - u * length, length))
            assert steps, (pid, u)  # no empty piece
            for k in steps:
                assert (dp_tiles + u, k) not in owner
                owner[(dp_tiles + u, k)] = pid
            pieces.setdefault(u, []).append((pid, slot_base + u - begin // length))
    return owner, pieces, dp_tiles


@settings(max_examples=100, deadline=None)
@given(tiles=st.integers(1, 400), k_steps=st.integers(1, 600), programs=st.integers(1, 140))
def test_stream_k_split_covers_every_iteration_once_k_aligned_and_balanced(tiles, k_steps, programs):
    owner, pieces, dp_tiles = _walk(tiles, k_steps, programs)
    sk_tiles = tiles - dp_tiles
    assert dp_tiles % programs == 0 and sk_tiles < programs  # whole waves run whole
    assert sorted(owner) == [(t, k) for t in range(tiles) for k in range(k_steps)]  # each step once
    chunks, numer, denom, heads, tail_len, tail_total, tail_ctas, _ = split(sk_tiles, k_steps, programs)
    work = [sum(1 for pid in owner.values() if pid == p) - dp_tiles // programs * k_steps for p in range(programs)]
    if heads:  # the chunk CTAs: equal shares, within a step
        assert max(work[:heads]) - min(work[:heads]) <= 1
    if tail_total:
        tails = work[heads:heads + tail_ctas]
        assert max(tails) - min(tails) <= 1
        assert max(tails) <= max(work[:heads] or [0]) + -(-heads // tail_ctas) + 1  # not past the chunks
        assert tail_total <= TAIL_TILES * tail_len * tail_ctas  # no CTA cuts many short tails
    assert not any(work[heads + tail_ctas:])
    # Each shared tile: its pieces as the fixup counts and adds them, each in a slot of its own.
    slots = set()
    for u, held in pieces.items():
        head_pieces, lowest, highest = tile_pieces(u, sk_tiles, k_steps, programs)
        expected = [u + i * sk_tiles for i in range(head_pieces)] + [heads + j for j in range(lowest, highest + 1)]
        assert [pid for pid, _ in held] == expected
        if len(held) > 1:
            for _, slot in held:
                assert slot not in slots and 0 <= slot < slot_count(sk_tiles, k_steps, programs)
                slots.add(slot)


def test_stream_k_shares_the_partial_wave_only():
    assert stream_k_tiles(264, 132) == 0       # two whole waves: nothing shared
    assert stream_k_tiles(96, 132) == 96       # under one wave: every tile shared
    assert stream_k_tiles(400, 132) == 4       # 3 waves and 4 tiles
    # 1000x3000x5000 in 128x256 tiles: one 59-step head a tile (the 57-step fair share and
    # 2 for the tail CTAs' extra fixups), the 20-step tails on 36 CTAs.
    assert split(96, 79, 132)[:7] == (1, 59, 1, 96, 20, 96 * 20, 36)
    # 512x512x32768 in 128x128 tiles: 8 chunks of 64 steps a tile, 4 CTAs idle (the tails
    # would be 16 steps, 4 of them a CTA).
    assert split(16, 512, 132)[:7] == (8, 512, 8, 128, 0, 0, 1)
    # 768x1024x32768 in 128x128 tiles: two 187-step chunks a tile, 138-step tails on 36 CTAs.
    assert split(48, 512, 132)[:7] == (2, 187, 1, 96, 138, 48 * 138, 36)
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
    (50, 40, 192, _sk(64, 64, 2), 3, False, None),       # one tile, 3 CTAs: three chunks of one K step
    (50, 40, 150, _sk(64, 64, 3), 3, True, (2, 0, 1)),   # the same with a K tail, K-major B; the first last
    (70, 100, 700, _sk(64, 64, 2), 3, False, (2, 1, 0)),  # 4 tiles of 11 steps: 3 whole, one in 3 chunks
    (150, 40, 630, _sk(64, 64, 2), 5, False, (4, 0, 3, 1, 2)),  # 3 tiles: 7-step heads, tails on 2 CTAs
    (200, 100, 260, _sk(64, 64, 2, group_m=8), 3, True, (1, 2, 0)),  # 8 tiles: 2 whole waves, then 2 shared
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
        # 32 x 12 = 384 tiles: two waves whole, the third wave's 120 tiles shared.
        matmul(torch.randn(4000, 512).to(torch.bfloat16), b, config=config)
        assert int.from_bytes(fake.launches[-1]["params"][-1][:4], "little") == 264


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
