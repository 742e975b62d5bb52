"""kernels/matmul across shape classes: decode (M <= 64), split-K (few tiles, long K),
sizes that are multiples of no tile. The config chooser's decisions; the split-K kernel
through ptxas (no spills), on the CPU emulator against numpy float64 (fp16 from numpy,
bf16 from CPU torch tensors), its prepared fast path under the stubbed driver, and on
the GPU against torch float32 at the sizes real models use."""

import numpy as np
import pytest

from weft.compiler.backend import ptxas
from weft.kernels.matmul import Config, configs_for, matmul, reference_matmul, shared_bytes
from weft.kernels.matmul.config import MIN_PART_STEPS, SHARED_LIMIT, split_for
from weft.kernels.matmul.split_k import split_k_matmul

RNG = np.random.default_rng(11)
H100_SMS = 132
needs_ptxas = pytest.mark.skipif(ptxas.find_ptxas() is None, reason="ptxas not found")


# ------------------------------------------------------------------ the chooser
def _efficiency(tiles, parts, sms):
    units = tiles * parts
    return units / (-(-units // sms) * sms)


@pytest.mark.parametrize("tiles, k_steps, max_waves", [(32, 64, 4), (86, 64, 4), (16, 512, 1), (64, 1024, 1),
                                                       (33, 1000, 1), (112, 64, 4), (8, 9, 1), (200, 64, 1)])
def test_split_for_fills_the_waves_it_may_use(tiles, k_steps, max_waves):
    parts = split_for(tiles, k_steps, H100_SMS, max_waves)
    allowed = [p for p in range(1, 33) if p * MIN_PART_STEPS <= k_steps
               and (p == 1 or -(-tiles * p // H100_SMS) <= max_waves)]
    assert parts in allowed or parts == 1
    best = max(_efficiency(tiles, p, H100_SMS) for p in allowed or [1])
    assert _efficiency(tiles, parts, H100_SMS) >= best - 0.02
    # Fewer parts never reach within 2% of the best.
    assert all(_efficiency(tiles, p, H100_SMS) < best - 0.02 for p in allowed if p < parts)


def test_split_for_decisions():
    assert split_for(32, 64, H100_SMS, 4) == 4        # decode 1x4096x4096, 64x128 tiles
    assert split_for(86, 64, H100_SMS, 4) == 3        # decode N=11008: 258 units, 2 full waves
    assert split_for(16, 512, H100_SMS) == 8          # 512x512x32768 in 128x128 tiles
    assert split_for(64, 1024, H100_SMS) == 2         # 1024x1024x65536
    assert split_for(200, 64, H100_SMS) == 1          # tiles already fill the SMs
    assert split_for(8, 9, H100_SMS) == 2             # parts keep MIN_PART_STEPS K steps


@pytest.mark.parametrize("m, n, k", [(1, 4096, 4096), (16, 11008, 4096), (64, 14336, 4096), (16, 4096, 14336)])
def test_decode_shapes_get_one_warpgroup_tiles(m, n, k):
    """(The TMA-reduced 64x256 candidates of narrow N: test_matmul_classes.py.)"""
    candidates = [c for c in configs_for(16, 16, m, n, k, H100_SMS) if c.split_reduce == "atomic"]
    assert candidates and all(c.block_m == 64 and c.num_warps == 4 and c.block_n <= 128 for c in candidates)
    for c in candidates:
        assert shared_bytes(c, 16, 16) <= SHARED_LIMIT and c.stages >= 6
        units = -(-n // c.block_n) * c.split_k
        assert units <= 4 * H100_SMS
    if n == 4096:  # 32 tiles of 128 columns: split to fill the SMs
        assert candidates[0].split_k == 4


@pytest.mark.parametrize("m, n, k", [(512, 512, 32768), (1024, 1024, 65536), (768, 768, 32768)])
def test_few_tile_shapes_split_k_within_one_wave(m, n, k):
    """Atomic adds; long K's TMA-reduced candidates: test_matmul_classes.py."""
    candidates = [c for c in configs_for(16, 16, m, n, k, H100_SMS) if c.split_reduce == "atomic"]
    assert candidates[0].block_m == 128 and candidates[0].split_k > 1
    for c in candidates:
        units = -(-m // c.block_m) * -(-n // c.block_n) * c.split_k
        assert units <= H100_SMS and c.block_n <= 128


@pytest.mark.parametrize("m, n, k", [(4096, 4096, 4096), (8192, 8192, 8192), (4095, 4097, 4093),
                                     (4096, 11008, 4096), (2048, 4096, 14336)])
def test_large_shapes_keep_the_swept_candidates(m, n, k):
    for bits in ((16, 16), (16, 32), (8, 16)):
        assert configs_for(*bits, m, n, k, H100_SMS) == configs_for(*bits)


@pytest.mark.parametrize("m, n, k, parts", [(1000, 3000, 5000, 2), (128, 11008, 4096, 3)])
def test_under_two_waves_of_tiles_adds_a_split_k_candidate(m, n, k, parts):
    """192 (86) 128x128 tiles on 132 SMs leave a second wave 45% (the only wave 65%)
    full; 2 (3) parts per tile fill 3 (2) waves to 97%."""
    candidates = configs_for(16, 16, m, n, k, H100_SMS)
    unsplit = configs_for(16, 16)
    assert candidates[:len(unsplit) + 1] == unsplit + [Config(128, 128, 64, 5, group_m=8, split_k=parts)]
    assert candidates[len(unsplit) + 1] == Config(128, 128, 64, 5, group_m=8, split_k=parts, split_reduce="tma")


def test_split_k_configs_say_what_is_wrong():
    with pytest.raises(ValueError, match="split_k must be 1..32"):
        Config(split_k=0)
    with pytest.raises(ValueError, match="needs variant='warp_specialized'"):
        Config(128, 128, split_k=2, variant="pipelined")
    with pytest.raises(ValueError, match="block_n <= 128"):
        Config(128, 256, split_k=2)


# ------------------------------------------------------------------ ptxas
def _split_signature(in_type, out_type, config, k_major):
    row_in, row_out = 1024 // (8 if "fp8" in in_type else 16), 1024 // (32 if out_type == "fp32" else 16)
    b_box = [config.block_n, config.block_k] if k_major else [config.block_k, min(row_in, config.block_n)]
    return {"a_desc": f"tensordesc<{in_type}[{config.block_m},{config.block_k}]>",
            "b_desc": f"tensordesc<{in_type}[{b_box[0]},{b_box[1]}]>",
            "c_desc": f"tensordesc<{out_type}[{config.block_m},{min(row_out, config.block_n)}]>",
            "partial_ptr": "*fp32", "arrivals_ptr": "*i32", "M": "i32", "N": "i32", "K": "i32"}


SPLIT_VARIANTS = [
    ("bf16", "bf16", Config(64, 128, 64, 8, num_warps=4, group_m=1, split_k=4), True),
    ("fp16", "fp16", Config(64, 128, 64, 8, num_warps=4, group_m=1, split_k=4), False),
    ("bf16", "fp32", Config(64, 64, 64, 8, num_warps=4, group_m=1, split_k=2), True),
    ("bf16", "bf16", Config(128, 128, 64, 6, group_m=8, split_k=8), False),
    ("fp16", "fp32", Config(128, 128, 64, 5, group_m=8, split_k=8), True),
    ("fp8e4m3", "bf16", Config(64, 128, 128, 8, num_warps=4, group_m=1, split_k=4), True),
]


@needs_ptxas
@pytest.mark.parametrize("in_type, out_type, config, k_major", SPLIT_VARIANTS)
def test_split_k_variants_assemble_without_spills(in_type, out_type, config, k_major):
    in_bits, out_bits = (8 if "fp8" in in_type else 16), (32 if out_type == "fp32" else 16)
    config = config if shared_bytes(config, in_bits, out_bits) <= SHARED_LIMIT else \
        Config(**{**config.__dict__, "stages": config.stages - 1})
    constexprs = dict(BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
                      STAGES=config.stages, GROUP_M=config.group_m, B_K_MAJOR=k_major,
                      NUM_WARPS=config.num_warps, PRODUCER_REGS=config.producer_regs, SPLIT_K=config.split_k)
    compiled = split_k_matmul.compile(signature=_split_signature(in_type, out_type, config, k_major),
                                      constexprs=constexprs, num_warps=config.num_warps)
    ptx = compiled.asm["ptx"]
    for instruction in ("wgmma.mma_async", "cp.async.bulk.tensor", "setmaxnreg",
                        "red.relaxed.gpu.global.add.f32", "atom.acq_rel.gpu.global.add"):
        assert instruction in ptx, instruction
    assert compiled.metadata["spill_stores"] == 0 and compiled.metadata["spill_loads"] == 0, compiled.metadata
    assert compiled.metadata["performance_warnings"] == []


@needs_ptxas
@pytest.mark.parametrize("in_type, out_type, config, k_major", [
    ("bf16", "bf16", Config(64, 128, 64, 8, num_warps=4, group_m=1), True),
    ("fp16", "fp32", Config(64, 128, 64, 7, num_warps=4, group_m=1), False),
    ("bf16", "bf16", Config(64, 64, 64, 8, num_warps=4, group_m=1), False),
])
def test_unsplit_decode_variants_assemble_without_spills(in_type, out_type, config, k_major):
    """Decode shapes whose tiles already fill the SMs run the unsplit kernel with one
    consumer warpgroup."""
    from weft.kernels.matmul.kernels import warp_specialized_matmul

    signature = {name: t for name, t in _split_signature(in_type, out_type, config, k_major).items()
                 if not name.endswith("_ptr")}
    constexprs = dict(BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
                      STAGES=config.stages, GROUP_M=config.group_m, B_K_MAJOR=k_major,
                      NUM_WARPS=config.num_warps, PRODUCER_REGS=config.producer_regs)
    compiled = warp_specialized_matmul.compile(signature=signature, constexprs=constexprs, num_warps=4)
    assert "wgmma.mma_async" in compiled.asm["ptx"] and "setmaxnreg" in compiled.asm["ptx"]
    assert compiled.metadata["spill_stores"] == 0 and compiled.metadata["spill_loads"] == 0, compiled.metadata
    assert compiled.metadata["performance_warnings"] == []


# ------------------------------------------------------------------ emulator
def _fp16_operands(m, n, k, k_major):
    a = RNG.standard_normal((m, k)).astype(np.float16)
    b = RNG.standard_normal((n, k)).astype(np.float16).T if k_major else \
        RNG.standard_normal((k, n)).astype(np.float16)
    return a, b


@pytest.mark.parametrize("m, n, k, config, k_major", [
    (1, 136, 700, Config(64, 64, 64, 4, num_warps=4, group_m=1, split_k=3), False),    # decode, K tail
    (16, 72, 520, Config(64, 64, 64, 3, num_warps=4, split_k=4), True),                # decode, K-major
    (64, 200, 256, Config(64, 128, 64, 3, num_warps=4, group_m=1, split_k=2), False),  # M = one warpgroup
    (129, 72, 900, Config(128, 64, 64, 3, split_k=5), False),                          # K >> M, N
    (70, 36, 1100, Config(64, 64, 64, 2, num_warps=4, split_k=6), True),               # parts of 3 steps, 1 empty
])
def test_emulated_split_k_matches_numpy(m, n, k, config, k_major):
    a, b = _fp16_operands(m, n, k, k_major)
    ref = reference_matmul(a, b)
    for out_dtype, tol in ((np.float32, 1e-3), (None, 2e-3)):
        out = matmul(a, b, out_dtype, config=config)
        assert out.shape == (m, n) and out.dtype == (out_dtype or np.float16)
        np.testing.assert_allclose(out.astype(np.float64), ref, rtol=tol, atol=tol * np.abs(ref).max())
        if k >= 900:
            break  # one output dtype is enough for the long ones


@pytest.mark.parametrize("m, n, k, config", [
    (67, 131, 93, Config(128, 128, 64, 2)),                                  # one tile, rows of 186 bytes
    (131, 67, 203, Config(128, 128, 64, 2, variant="pipelined")),
    (3, 133, 197, Config(64, 64, 64, 2, num_warps=4, split_k=2)),            # decode, nothing aligned
])
def test_emulated_odd_sizes_match_numpy(m, n, k, config):
    """No dimension a multiple of a tile or of 8 elements: the operands are copied into
    16-byte rows (uninitialised padding that TMA never reads: the view keeps K)."""
    a, b = _fp16_operands(m, n, k, False)
    out = matmul(a, b, np.float32, config=config)
    np.testing.assert_allclose(out, reference_matmul(a, b), rtol=1e-3, atol=1e-3 * np.abs(out).max())


def test_emulated_bf16_split_k_matches_numpy():
    """bf16 (numpy has none) through CPU torch tensors, which run on the emulator."""
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(2)
    a = torch.randn(16, 520, generator=g).to(torch.bfloat16)
    b = torch.randn(72, 520, generator=g).to(torch.bfloat16).T
    config = Config(64, 64, 64, 3, num_warps=4, group_m=1, split_k=4)
    ref = reference_matmul(a, b)
    got = matmul(a, b, config=config)
    assert got.dtype == torch.bfloat16
    np.testing.assert_allclose(got.float().numpy(), ref, rtol=1e-2, atol=1e-2 * np.abs(ref).max())
    got32 = matmul(a, b, torch.float32, config=config)
    np.testing.assert_allclose(got32.numpy(), ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


# ------------------------------------------------------------------ prepared fast path
def test_split_k_leaves_its_scratch_zeroed():
    """The last unit of each tile puts zeros back (the next launch adds into them)."""
    from weft.kernels.matmul import host

    a, b = _fp16_operands(20, 100, 600, True)
    config = Config(64, 64, 64, 2, num_warps=4, group_m=1, split_k=3)
    scratches = []
    original = host._kernel_call

    def recorded(*args, **kwargs):
        call = original(*args, **kwargs)
        scratches.append(call[-1])
        return call
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(host, "_kernel_call", recorded)
        out = matmul(a, b, np.float32, config=config)
    np.testing.assert_allclose(out, reference_matmul(a, b), rtol=1e-3, atol=1e-3 * np.abs(out).max())
    (partial, arrivals), = scratches
    assert partial.shape == (20, 100) and not partial.any()
    assert arrivals.shape == (2,) and not arrivals.any()


def test_split_k_prepared_call_repeats_the_launch_on_its_streams_scratch():
    """The second call with the same inputs repeats the first's launch on a new C, with
    no memset: both launches point at the scratch kept for the stream and shape."""
    torch = pytest.importorskip("torch")
    from weft.kernels.matmul import host

    from .fake_gpu import fake_gpu
    from .test_host_fast_path import _Calls, _long_way_only, _normalized

    a = torch.randn(16, 512).to(torch.bfloat16)
    b = torch.randn(200, 512).to(torch.bfloat16).T
    config = Config(64, 64, 64, 3, num_warps=4, group_m=1, split_k=4)
    with fake_gpu() as fake, pytest.MonkeyPatch.context() as patch:
        long_way = _Calls(patch, host)
        first = matmul(a, b, config=config)
        memsets = len(fake.memsets)
        second = matmul(a, b, config=config)
        fast = fake.launches[-1]
        assert long_way.count == 1 and len(fake.memsets) == memsets
        with _long_way_only():
            ref = matmul(a, b, config=config)
        assert _normalized(fake, fast, (second,)) == _normalized(fake, fake.launches[-1], (ref,))
        assert first.data_ptr() != second.data_ptr()
        assert fast["grid"] == (min(4 * 4, H100_SMS), 1, 1)


def test_odd_size_prepared_call_restages_its_operands():
    """Operands whose rows do not start on 16 bytes are copied into staging arrays; a
    repeated call copies the caller's current values into the same arrays and repeats
    the first call's launch (same descriptors) on a new C."""
    torch = pytest.importorskip("torch")
    from weft.kernels.matmul import host

    from .fake_gpu import fake_gpu
    from .test_host_fast_path import _Calls, _normalized

    a = torch.randn(67, 93).to(torch.bfloat16)     # rows of 186 bytes
    b = torch.randn(93, 131).to(torch.bfloat16)    # rows of 262 bytes
    config = Config(128, 128, 64, 2)
    with fake_gpu() as fake, pytest.MonkeyPatch.context() as patch:
        long_way = _Calls(patch, host)
        first = matmul(a, b, config=config)
        first_launch = fake.launches[-1]
        a.copy_(torch.randn(67, 93))
        b.copy_(torch.randn(93, 131))
        second = matmul(a, b, config=config)
        assert long_way.count == 1
        assert _normalized(fake, fake.launches[-1], (second,)) == _normalized(fake, first_launch, (first,))
        staged = host.prepared_call(host._call_signature(a, b, None, config)).staged
        assert [role for role, _ in staged] == [0, 1]
        for (_, staging), given in zip(staged, (a, b)):
            assert torch.equal(staging, given) and staging.stride()[0] % 8 == 0


# ------------------------------------------------------------------ on the GPU
GPU_SHAPES = {
    "decode": [(1, 4096, 4096), (16, 11008, 4096), (64, 4096, 14336), (1, 14336, 4096), (33, 4096, 11008)],
    "long K": [(512, 512, 32768), (1024, 1024, 65536), (200, 300, 40000)],
    "odd": [(4095, 4097, 4093), (1000, 3000, 5000), (1, 4097, 4093), (333, 2047, 1999)],
    "LLM": [(4096, 11008, 4096), (4096, 4096, 11008), (2048, 14336, 4096)],
}


def _gpu_operands(torch, m, n, k, dtype, k_major, gen):
    a = torch.randn(m, k, device="cuda", dtype=dtype, generator=gen)
    b = torch.randn(n, k, device="cuda", dtype=dtype, generator=gen).t() if k_major else \
        torch.randn(k, n, device="cuda", dtype=dtype, generator=gen)
    return a, b


def _assert_close(torch, got, a, b, what):
    ref = a.float() @ b.float()
    scale = ref.abs().max().item()
    assert got.shape == ref.shape, what
    assert (got.float() - ref).abs().max().item() <= 1e-2 * scale, what


@pytest.mark.gpu
@pytest.mark.parametrize("shape_class", sorted(GPU_SHAPES))
@pytest.mark.parametrize("dtype_name", ["bfloat16", "float16"])
def test_gpu_autotuned_matmul_matches_torch_in_every_class(shape_class, dtype_name):
    """The default path (class candidates, autotuned) at real sizes, B in both layouts;
    each call twice, the second through the prepared fast path (split-K: zeroed scratch)."""
    torch = pytest.importorskip("torch")
    dtype = getattr(torch, dtype_name)
    gen = torch.Generator(device="cuda").manual_seed(4)
    for m, n, k in GPU_SHAPES[shape_class]:
        for k_major in (False, True):
            a, b = _gpu_operands(torch, m, n, k, dtype, k_major, gen)
            for attempt in range(2):
                got = matmul(a, b)
                assert got.dtype == dtype
                _assert_close(torch, got, a, b, (m, n, k, k_major, attempt))


@pytest.mark.gpu
def test_gpu_fp8_decode_and_long_k_match_torch():
    """fp8 (K-major B) through the decode and few-tile classes' split-K candidates."""
    torch = pytest.importorskip("torch")
    gen = torch.Generator(device="cuda").manual_seed(9)
    for m, n, k in [(1, 4096, 4096), (16, 11008, 4096), (512, 512, 32768)]:
        a = (torch.randn(m, k, device="cuda", generator=gen) * 0.5).to(torch.float8_e4m3fn)
        b = (torch.randn(n, k, device="cuda", generator=gen) * 0.5).to(torch.float8_e4m3fn).t()
        for attempt in range(2):
            _assert_close(torch, matmul(a, b), a, b, (m, n, k, attempt))


@pytest.mark.gpu
@pytest.mark.parametrize("config", [Config(64, 128, 64, 8, num_warps=4, group_m=1, split_k=4),
                                    Config(64, 64, 64, 8, num_warps=4, group_m=1, split_k=7),
                                    Config(128, 128, 64, 5, group_m=8, split_k=8),
                                    Config(128, 128, 64, 4, group_m=8, split_k=3)])
@pytest.mark.parametrize("out_name", [None, "float32"])
def test_gpu_split_k_configs_match_torch(config, out_name):
    """Every split-K config on shapes with tails in M, N and K, repeated so that the
    zeroing of the workspace and arrival counters between calls is exercised."""
    torch = pytest.importorskip("torch")
    out_dtype = getattr(torch, out_name) if out_name else None
    gen = torch.Generator(device="cuda").manual_seed(6)
    for m, n, k in [(1, 4096, 4096), (50, 1000, 7000), (300, 520, 33000), (64, 8, 1024)]:
        for k_major in (False, True):
            a, b = _gpu_operands(torch, m, n, k, torch.bfloat16, k_major, gen)
            for attempt in range(3):
                got = matmul(a, b, out_dtype, config=config)
                _assert_close(torch, got, a, b, (m, n, k, k_major, attempt))


@pytest.mark.gpu
@pytest.mark.parametrize("m, n, k, config", [
    (16, 4096, 11008, Config(64, 128, 64, 8, num_warps=4, group_m=1, split_k=4)),  # split-K scratch
    (1000, 1001, 999, None),                                                       # staged operands
])
def test_gpu_matmul_in_a_cuda_graph(m, n, k, config):
    """A call captured in a CUDA graph after a warm-up call on the capture stream (so the
    prepared call exists) gives the right result on every replay, with new inputs
    copied in: the split-K scratch left zeroed by each launch, odd-size operands staged
    in the graph's own memory."""
    torch = pytest.importorskip("torch")
    gen = torch.Generator(device="cuda").manual_seed(8)
    a, b = _gpu_operands(torch, m, n, k, torch.bfloat16, True, gen)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        matmul(a, b, config=config)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            out = matmul(a, b, config=config)
    torch.cuda.current_stream().wait_stream(stream)
    for _ in range(3):
        a.copy_(torch.randn(a.shape, device="cuda", generator=gen).to(a.dtype))
        graph.replay()
        torch.cuda.synchronize()
        _assert_close(torch, out, a, b, "replay")
