"""The highlevel example kernels (Triton code) on the CPU emulator against numpy, their
conversion counts, and their cubins for sm_90a (128-bit accesses, no spills)."""

import numpy as np
import pytest

from weft.compiler import pipeline
from weft.compiler.frontend import build_kernel
from weft.compiler.ir import ConvertLayout, Load, Store
from weft.compiler.types import TensorType
from weft.highlevel import examples
from weft.kernels import layer_norm, softmax, transpose
from weft.compiler.backend import ptxas

RNG = np.random.default_rng(2024)
needs_ptxas = pytest.mark.skipif(ptxas.find_ptxas() is None, reason="ptxas not found")


@pytest.mark.parametrize("n", [1, 1000, 4096, 4096 * 3 + 17])
def test_vector_add_matches_numpy(n):
    x, y = RNG.standard_normal(n).astype(np.float32), RNG.standard_normal(n).astype(np.float32)
    np.testing.assert_allclose(examples.add(x, y), x + y, rtol=1e-6)


@pytest.mark.parametrize("shape", [(3, 1), (5, 100), (4, 1024), (2, 3000)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_softmax_matches_numpy_for_any_row_length(shape, dtype):
    x = (RNG.standard_normal(shape) * 3).astype(dtype)
    tolerance = 1e-6 if dtype == np.float32 else 2e-3
    np.testing.assert_allclose(examples.softmax(x).astype(np.float64), softmax.reference(x), rtol=tolerance,
                               atol=tolerance * 1e-2)


def test_softmax_of_a_strided_view():
    view = RNG.standard_normal((6, 256)).astype(np.float32)[:, :200]
    np.testing.assert_allclose(examples.softmax(view), softmax.reference(view), rtol=1e-6)


@pytest.mark.parametrize("shape", [(4, 64), (3, 777)])
def test_layer_norm_matches_numpy(shape):
    x = RNG.standard_normal(shape).astype(np.float32)
    w, b = RNG.standard_normal(shape[1]).astype(np.float32), RNG.standard_normal(shape[1]).astype(np.float32)
    y, mean, rstd = examples.layer_norm(x, w, b, 1e-5, return_stats=True)
    np.testing.assert_array_equal(examples.layer_norm(x, w, b, 1e-5), y)
    ref_y, ref_mean, ref_rstd = layer_norm.reference(x, w, b, 1e-5)
    np.testing.assert_allclose(y, ref_y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(mean, ref_mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(rstd, ref_rstd, rtol=1e-5)


@pytest.mark.parametrize("shape, rows", [((10, 300), 4), ((7, 64), 1), ((33, 1000), 8)])
def test_row_argmax_matches_numpy(shape, rows):
    x = RNG.standard_normal(shape).astype(np.float32)
    assert np.array_equal(examples.argmax(x, rows), x.argmax(axis=1))


@pytest.mark.parametrize("shape, dtype", [((64, 64), np.float32), ((100, 130), np.float32),
                                          ((128, 40), np.float16), ((33, 65), np.int8)])
def test_transpose_matches_numpy(shape, dtype):
    x = (RNG.standard_normal(shape) * 50).astype(dtype)
    assert np.array_equal(examples.transpose(x), transpose.reference(x))


ALIGNED = "divisible_by_16"
SIGNATURES = {  # kernel, signature ({t}: element type), constexprs, warps, conversions
    "vector_add": (examples.add_kernel, {"x_ptr": "*{t}", "y_ptr": "*{t}", "out_ptr": "*{t}", "n": "i32"},
                   {"BLOCK": 4096}, 4, 0),
    "softmax": (examples.softmax_kernel, {"out_ptr": "*{t}", "in_ptr": "*{t}", "in_row_stride": "i32",
                                          "out_row_stride": "i32", "n_rows": "i32", "n_cols": "i32"},
                {"BLOCK": 4096}, 8, 0),
    "layer_norm": (examples.layer_norm_kernel,
                   {"out_ptr": "*{t}", "in_ptr": "*{t}", "w_ptr": "*{t}", "b_ptr": "*{t}", "mean_ptr": "*fp32",
                    "rstd_ptr": "*fp32", "in_row_stride": "i32", "out_row_stride": "i32", "n_rows": "i32",
                    "n_cols": "i32", "eps": "fp32"}, {"BLOCK": 4096}, 8, 0),
    "argmax": (examples.argmax_kernel, {"out_ptr": "*i32", "in_ptr": "*{t}", "in_row_stride": "i32",
                                        "n_rows": "i32", "n_cols": "i32"}, {"ROWS": 4, "BLOCK": 1024}, 4, 0),
    "transpose": (examples.transpose_kernel, {"out_ptr": "*{t}", "in_ptr": "*{t}", "n_rows": "i32",
                                              "n_cols": "i32", "in_stride": "i32", "out_stride": "i32"},
                  {"TILE": 64}, 4, 1),
}


def signature_of(name: str, element: str) -> dict:
    return {k: v.format(t=element) for k, v in SIGNATURES[name][1].items()}


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_conversion_counts_in_the_final_ir(name):
    """0 for vector add, softmax, layer norm and argmax (whose per-row results are stored
    from the reduction's layout); a transpose needs exactly one."""
    kernel, _, constexprs, warps, expected = SIGNATURES[name]
    signature = signature_of(name, "fp32")
    tile = build_kernel(kernel, signature, constexprs, warps, {k: ALIGNED for k in signature if k != "eps"},
                        language="highlevel")
    final = pipeline.run_layout_passes(pipeline.run_tile_passes(tile))
    assert sum(isinstance(op, ConvertLayout) for op in final.walk()) == expected
    # Every global access of a row moves 128 bits per thread.
    widths = {op.vector for op in final.walk()
              if isinstance(op, (Load, Store)) and isinstance(op.pointer.type, TensorType)}
    assert max(widths) == 4


@needs_ptxas
@pytest.mark.parametrize("name", sorted(SIGNATURES))
@pytest.mark.parametrize("element", ["fp32", "bf16"])
def test_every_kernel_assembles_for_sm90a_with_128_bit_accesses(name, element):
    kernel, _, constexprs, warps, _ = SIGNATURES[name]
    signature = signature_of(name, element)
    compiled = kernel.compile(signature=signature, constexprs=constexprs, num_warps=warps,
                              specialization={k: ALIGNED for k in signature if k != "eps"})
    assert compiled.asm["cubin"], "ptxas produced no cubin"
    assert "tile" in compiled.asm and "convert_layout" not in compiled.asm["tile"]
    assert compiled.metadata["spill_stores"] == 0 and compiled.metadata["spill_loads"] == 0
    assert ".v4.b32" in compiled.asm["ptx"]


def test_weft_dump_shows_each_inference_pass(monkeypatch, capsys):
    monkeypatch.setenv("WEFT_DUMP", "axis_analysis,coalesce,propagate_layouts,lower_tiles")
    signature = signature_of("vector_add", "fp32")
    tile = build_kernel(examples.add_kernel, signature, {"BLOCK": 512}, 4, {k: ALIGNED for k in signature},
                        language="highlevel")
    pipeline.run_tile_passes(tile)
    err = capsys.readouterr().err
    for name in ("axis_analysis", "coalesce", "propagate_layouts", "lower_tiles"):
        assert f"// ----- weft dump: {name} -----" in err
    assert "%offsets: contiguity=[512] divisibility=[512] constancy=[1]" in err
