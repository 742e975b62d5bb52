"""The epilogue of the tutorial-style matmul (highlevel/examples.py) with a 16-bit output:
the accumulator is cast to 16 bits in its wgmma layout and only then converted to the
store's layout, as Triton does, so the shared-memory round trip moves half the bytes; the
round trip reads its 16-bit words four at a time by ldmatrix.x4 (checked against a model
of ldmatrix on CPU); the PTX counts match Triton's for the same source; the emulator's
values match numpy."""

import numpy as np
import pytest

from weft.compiler import pipeline
from weft.compiler.frontend import build_kernel
from weft.compiler.ir import ConvertLayout
from weft.highlevel import examples
from weft.layouts import SharedRoundTrip

from ._compile import HAS_PTXAS
from .test_compile_speed import SIGNATURE, SPECIALIZATION

torch = pytest.importorskip("torch")
RNG = np.random.default_rng(45)


def _constexprs(block_m: int, block_n: int, block_k: int) -> dict:
    return dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=8, ACTIVATION="", ACC_IN_DOT=True)


def _epilogue_conversions(block, num_warps: int) -> list:
    tile = build_kernel(examples.matmul_kernel, SIGNATURE, _constexprs(*block), num_warps, SPECIALIZATION,
                        language="highlevel")
    kernel = pipeline.prepare_for_emulator(tile)
    return [op for op in kernel.walk() if isinstance(op, ConvertLayout) and isinstance(op.plan, SharedRoundTrip)]


@pytest.mark.parametrize("block, num_warps", [((128, 256, 64), 8), ((128, 128, 64), 8), ((64, 128, 64), 4)])
def test_the_accumulator_is_cast_before_it_is_converted(block, num_warps):
    conversions = _epilogue_conversions(block, num_warps)
    assert len(conversions) == 1
    assert conversions[0].operand.type.element.bits == 16 and conversions[0].plan.element_bits == 16


def _ldmatrix_model(addresses, first: int, count: int, warp: int) -> np.ndarray:
    """What ldmatrix.x{count} hands each lane: [lane, word, element] element offsets, from
    the row address lane i gives (row i % 8 of matrix i // 8)."""
    rows = [addresses(register=first, lane=lane, warp=warp, block=0)[0] for lane in range(8 * count)]
    out = np.empty((32, count, 2), np.int64)
    for lane in range(32):
        for word in range(count):
            row = rows[8 * word + lane // 4]
            out[lane, word] = (row + 2 * (lane % 4), row + 2 * (lane % 4) + 1)
    return out


@pytest.mark.parametrize("block, num_warps", [((128, 256, 64), 8), ((128, 128, 64), 8)])
def test_ldmatrix_loads_every_word_the_round_trip_loads(block, num_warps):
    """Each iteration's words go by ldmatrix.x4, and the model of ldmatrix at the row
    addresses hands every lane of every warp the scratch elements the plan's load_map
    gives its registers."""
    from weft.compiler.backend.lower_convert import _ldmatrix_quads

    (op,) = _epilogue_conversions(block, num_warps)
    plan = op.plan
    assert plan.load_vector == 2
    offsets = plan.load_map.sublayout(plan.load_map.in_dim_names, ["offset"])
    for groups in plan.load_groups:
        quads = _ldmatrix_quads(plan, groups)
        assert quads is not None and sorted(w for quad, _ in quads for w in quad) == sorted(map(tuple, groups))
        for words, addresses in quads:
            for warp in range(num_warps):
                loaded = _ldmatrix_model(addresses, words[0][0], len(words), warp)
                held = np.array([[[offsets(register=r, lane=lane, warp=warp, block=0)[0] for r in pair]
                                  for pair in words] for lane in range(32)])
                np.testing.assert_array_equal(loaded, held)


@pytest.mark.skipif(not HAS_PTXAS, reason="ptxas not found")
def test_the_epilogue_stores_and_loads_as_triton_does():
    """128x256x64, 8 warps, 3 stages, fp16 out: Triton 3.6 converts the fp16 tile in two
    rounds of 8 st.shared.v4 and 8 ldmatrix.x4 per thread; so does weft, without spills."""
    compiled = examples.matmul_kernel.compile(signature=SIGNATURE, constexprs=_constexprs(128, 256, 64),
                                              specialization=SPECIALIZATION, num_warps=8, num_stages=3)
    assert compiled.metadata["spill_stores"] == 0 and compiled.metadata["spill_loads"] == 0
    epilogue = compiled.asm["ptx"].split("wgmma.wait_group.sync.aligned 0;")[-1]
    assert epilogue.count("st.shared.v4.b32") == 16
    assert epilogue.count("ldmatrix.sync.aligned.m8n8.x4.shared.b16") == 16
    assert "ld.shared" not in epilogue and "st.shared.b16" not in epilogue
    assert epilogue.count("st.global.v4.b32") == 16


@pytest.mark.parametrize("block, num_warps, shape", [((128, 256, 64), 8, (200, 300, 150)),
                                                     ((64, 128, 64), 4, (64, 128, 192))])
def test_16_bit_output_matches_numpy(block, num_warps, shape):
    m, n, k = shape
    a = torch.tensor(RNG.standard_normal((m, k)), dtype=torch.float16)
    b = torch.tensor(RNG.standard_normal((k, n)), dtype=torch.float16)
    out = examples.matmul(a, b, block=block, num_warps=num_warps, num_stages=3, out_dtype="float16")
    assert out.dtype == torch.float16
    reference = a.double().numpy() @ b.double().numpy()
    scale = np.abs(a.double().numpy()) @ np.abs(b.double().numpy())
    error = np.abs(out.double().numpy() - reference)
    # fp32 accumulation, then one rounding to fp16 (2^-11 relative)
    assert (error <= 1e-5 * scale + 2.0 ** -10 * np.abs(reference) + 1e-6).all(), error.max()
