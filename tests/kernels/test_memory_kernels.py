"""The issue-3 kernels on the CPU emulator against numpy, and through ptxas for sm_90a."""

import numpy as np
import pytest

from weft.kernels import convert, layer_norm, softmax, transpose, vector_add
from weft.compiler.errors import CompilationError
from weft.compiler.backend import ptxas

RNG = np.random.default_rng(1234)

needs_ptxas = pytest.mark.skipif(ptxas.find_ptxas() is None, reason="ptxas not found")


@pytest.mark.parametrize("n", [1, 1000, 4096, 4096 * 3 + 17])
def test_vector_add_matches_numpy(n):
    x = RNG.standard_normal(n).astype(np.float32)
    y = RNG.standard_normal(n).astype(np.float32)
    np.testing.assert_allclose(vector_add.add(x, y), vector_add.reference(x, y), rtol=1e-6)


@pytest.mark.parametrize("shape", [(3, 1), (5, 100), (4, 1024), (2, 3000)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_softmax_matches_numpy_for_any_row_length(shape, dtype):
    x = (RNG.standard_normal(shape) * 3).astype(dtype)
    got = softmax.softmax(x).astype(np.float64)
    tolerance = 1e-6 if dtype == np.float32 else 2e-3
    np.testing.assert_allclose(got, softmax.reference(x), rtol=tolerance, atol=tolerance * 1e-2)


def test_prefetching_rows_ahead_keeps_results_and_skips_unaligned_rows():
    x = RNG.standard_normal((12, 300)).astype(np.float32)
    config = softmax.Config(512, 1, 4, prefetch_rows=3)
    np.testing.assert_allclose(softmax.softmax(x, config), softmax.reference(x), rtol=1e-6)
    w, b = RNG.standard_normal(300).astype(np.float32), RNG.standard_normal(300).astype(np.float32)
    np.testing.assert_allclose(layer_norm.layer_norm(x, w, b, config=layer_norm.Config(512, 1, 4, 3)),
                               layer_norm.reference(x, w, b, 1e-5)[0], rtol=1e-5, atol=1e-5)
    # Rows 1204 bytes apart are not 16-byte aligned: a bulk prefetch would fault, so none
    # is issued (the emulator raises on a misaligned prefetch).
    unaligned = RNG.standard_normal((12, 301)).astype(np.float32)[:, :300]
    np.testing.assert_allclose(softmax.softmax(unaligned, config), softmax.reference(unaligned), rtol=1e-6)


def test_softmax_of_a_strided_view():
    base = RNG.standard_normal((6, 256)).astype(np.float32)
    view = base[:, :200]  # rows 256 apart, 200 long
    np.testing.assert_allclose(softmax.softmax(view), softmax.reference(view), rtol=1e-6)


@pytest.mark.parametrize("early", [False, True])
@pytest.mark.parametrize("shape", [(4, 64), (3, 777), (2, 1024)])
def test_layer_norm_matches_numpy(shape, early):
    x = RNG.standard_normal(shape).astype(np.float32)
    w = RNG.standard_normal(shape[1]).astype(np.float32)
    b = RNG.standard_normal(shape[1]).astype(np.float32)
    base = softmax.Config.for_row(shape[1], 32)
    config = layer_norm.Config(base.block, base.num_warps, base.vector, early_weights=early)
    y, mean, rstd = layer_norm.layer_norm(x, w, b, 1e-5, return_stats=True, config=config)
    ref_y, ref_mean, ref_rstd = layer_norm.reference(x, w, b, 1e-5)
    np.testing.assert_allclose(y, ref_y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(mean, ref_mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(rstd, ref_rstd, rtol=1e-5)


@pytest.mark.parametrize("shape, dtype", [((64, 64), np.float32), ((100, 130), np.float32),
                                          ((128, 40), np.float16), ((33, 65), np.int8)])
def test_transpose_through_shared_memory(shape, dtype):
    x = (RNG.standard_normal(shape) * 50).astype(dtype)
    assert np.array_equal(transpose.transpose(x), transpose.reference(x))


def test_bad_inputs_are_refused_with_a_message():
    with pytest.raises(ValueError, match="shapes differ"):
        vector_add.add(np.zeros(4, np.float32), np.zeros(5, np.float32))
    with pytest.raises(ValueError, match="2-D"):
        softmax.softmax(np.zeros(4, np.float32))
    with pytest.raises(TypeError, match="fp32, fp16 and bf16"):
        softmax.softmax(np.zeros((2, 4), np.int32))
    with pytest.raises(ValueError, match=r"weight and bias must have shape \(8,\)"):
        layer_norm.layer_norm(np.zeros((2, 8), np.float32), np.zeros(4, np.float32), np.zeros(8, np.float32))
    with pytest.raises(ValueError, match="softmax rows up to"):
        softmax.Config(65536, 16, 4)


SIGNATURES = {
    "softmax": (softmax.softmax_kernel,
                {"out_ptr": "*{t}", "in_ptr": "*{t}", "in_row_stride": "i32", "out_row_stride": "i32", "n_rows": "i32",
                 "n_cols": "i32"},
                {"BLOCK": 4096, "VEC": 4, "WARPS": 8, "ELEMENT_BYTES": 4, "EVEN": False, "PREFETCH_ROWS": 512}, 8),
    "layer_norm": (layer_norm.layer_norm_kernel,
                   {"out_ptr": "*{t}", "in_ptr": "*{t}", "w_ptr": "*{t}", "b_ptr": "*{t}", "mean_ptr": "*fp32",
                    "rstd_ptr": "*fp32", "in_row_stride": "i32", "out_row_stride": "i32", "n_rows": "i32",
                    "n_cols": "i32", "eps": "fp32"},
                   {"BLOCK": 4096, "VEC": 8, "WARPS": 8, "ELEMENT_BYTES": 4, "STATS": True,
                    "EARLY_WEIGHTS": False, "EVEN": False, "PREFETCH_ROWS": 512}, 8),
    "softmax_ring": (softmax.softmax_ring_kernel,
                     {"out_ptr": "*{t}", "in_ptr": "*{t}", "in_row_stride": "i32", "out_row_stride": "i32",
                      "n_rows": "i32", "n_cols": "i32"},
                     {"BLOCK": 4096, "VEC": 4, "WARPS": 8, "ELEMENT_BYTES": 4, "EVEN": False, "STAGES": 4}, 8),
    "layer_norm_ring": (layer_norm.layer_norm_ring_kernel,
                        {"out_ptr": "*{t}", "in_ptr": "*{t}", "w_ptr": "*{t}", "b_ptr": "*{t}",
                         "mean_ptr": "*fp32", "rstd_ptr": "*fp32", "in_row_stride": "i32",
                         "out_row_stride": "i32", "n_rows": "i32", "n_cols": "i32", "eps": "fp32"},
                        {"BLOCK": 4096, "VEC": 8, "WARPS": 8, "ELEMENT_BYTES": 4, "STATS": True, "EVEN": False,
                         "STAGES": 2, "HOLD_WEIGHTS": True}, 8),
    "vector_add": (vector_add.add_kernel, {"x_ptr": "*{t}", "y_ptr": "*{t}", "out_ptr": "*{t}", "n": "i32"},
                   {"BLOCK": 4096, "VEC": 4, "WARPS": 4}, 4),
    "transpose": (transpose.transpose_kernel,
                  {"out_ptr": "*{t}", "in_ptr": "*{t}", "n_rows": "i32", "n_cols": "i32", "in_stride": "i32",
                   "out_stride": "i32"},
                  {"TILE": 64, "VEC": 4, "WARPS": 4}, 4),
}


@needs_ptxas
@pytest.mark.parametrize("name", sorted(SIGNATURES))
@pytest.mark.parametrize("element", ["fp32", "bf16"])
def test_every_kernel_assembles_for_sm90a_without_spills(name, element):
    kernel, signature, constexprs, warps = SIGNATURES[name]
    signature = {k: v.format(t=element) for k, v in signature.items()}
    if "VEC" in constexprs:  # one 128-bit access per vector
        constexprs = {**constexprs, "VEC": 4 if element == "fp32" else 8}
    aligned = {k: "divisible_by_16" for k in signature if k != "eps"}
    compiled = kernel.compile(signature=signature, constexprs=constexprs, num_warps=warps,
                              specialization=aligned)
    assert compiled.asm["cubin"], "ptxas produced no cubin"
    assert ".target sm_90a" in compiled.asm["ptx"]
    assert compiled.metadata["spill_stores"] == 0 and compiled.metadata["spill_loads"] == 0
    if name in ("softmax", "layer_norm"):
        assert "cp.async.bulk.prefetch.L2.global" in compiled.asm["ptx"]
    if name.endswith("_ring"):  # rows arrive by bulk copy, counted on an mbarrier
        assert "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes" in compiled.asm["ptx"]
        assert "mbarrier.try_wait.parity" in compiled.asm["ptx"]
    if name != "transpose":
        # Aligned rows move 128 bits per access.
        assert ".v4.b32" in compiled.asm["ptx"] or ".v2.b64" in compiled.asm["ptx"]


def test_convert_kernel_between_blocked_and_wgmma_accumulator():
    from weft.layouts import blocked, wgmma_accumulator

    src = blocked([64, 64], [1, 8], [4, 8], [4, 1], [1, 0])
    dst = wgmma_accumulator([64, 64], [4, 1], 64)
    x = RNG.standard_normal((64, 64)).astype(np.float32)
    assert np.array_equal(convert.convert(x, src, dst), x)
    assert np.array_equal(convert.convert(x, dst, src), x)


@needs_ptxas
def test_softmax_cache_hints_reach_the_ptx():
    kernel, signature, constexprs, warps = SIGNATURES["softmax"]
    signature = {k: v.format(t="fp32") for k, v in signature.items()}
    aligned = {k: "divisible_by_16" for k in signature}
    ptx = kernel.compile(signature=signature, constexprs={**constexprs, "ROW_EVICTION": "evict_first",
                                                          "OUT_CACHE": ".cs"},
                         num_warps=warps, specialization=aligned).asm["ptx"]
    assert "ld.global.L1::evict_first.v4.b32" in ptx and "st.global.cs.v4.b32" in ptx
    x = RNG.standard_normal((3, 300)).astype(np.float32)
    config = softmax.Config(512, 2, 4, row_eviction="evict_first", out_cache=".cs")
    np.testing.assert_allclose(softmax.softmax(x, config), softmax.reference(x), rtol=1e-6)


@needs_ptxas
def test_load_cache_hints_reach_the_ptx_and_bad_ones_are_refused():
    kernel, signature, constexprs, warps = SIGNATURES["layer_norm"]
    signature = {k: v.format(t="bf16") for k, v in signature.items()}
    constexprs = {**constexprs, "VEC": 8, "ELEMENT_BYTES": 2, "ROW_EVICTION": "evict_first",
                  "WEIGHT_EVICTION": "evict_last"}
    aligned = {k: "divisible_by_16" for k in signature if k != "eps"}
    ptx = kernel.compile(signature=signature, constexprs=constexprs, num_warps=warps,
                         specialization=aligned).asm["ptx"]
    assert "ld.global.L1::evict_first.v4.b32" in ptx and "ld.global.L1::evict_last.v4.b32" in ptx
    with pytest.raises(CompilationError, match="eviction_policy must be one of") as error:
        kernel.compile(signature=signature, constexprs={**constexprs, "ROW_EVICTION": "evict_soon"},
                       num_warps=warps, specialization=aligned)
    assert "x = ll.load(in_ptr" in str(error.value)
    with pytest.raises(CompilationError, match="not both"):
        kernel.compile(signature=signature, constexprs={**constexprs, "ROW_CACHE": ".cg"},
                       num_warps=warps, specialization=aligned)
    stores = kernel.compile(signature=signature, constexprs={**constexprs, "OUT_CACHE": ".cs"},
                            num_warps=warps, specialization=aligned).asm["ptx"]
    assert "st.global.cs.v4.b32" in stores
    with pytest.raises(CompilationError, match=r"store cache_modifier must be one of \['', '.cg', '.cs'"):
        kernel.compile(signature=signature, constexprs={**constexprs, "OUT_CACHE": ".ca"},
                       num_warps=warps, specialization=aligned)
    # The hint changes nothing the emulator can see.
    x = RNG.standard_normal((3, 256)).astype(np.float16)
    w, b = RNG.standard_normal(256).astype(np.float16), RNG.standard_normal(256).astype(np.float16)
    config = layer_norm.Config(256, 1, 8, row_eviction="evict_first", weight_eviction="evict_last",
                               out_cache=".cs")
    np.testing.assert_allclose(layer_norm.layer_norm(x, w, b, config=config), layer_norm.reference(x, w, b, 1e-5)[0],
                               rtol=2e-2, atol=2e-2)
