"""Compile-time targets on the CPU machine: cold softmax compile and a warm disk-cache hit."""

import time

import pytest

from weft import lowlevel as ll
from weft.kernels import softmax
from weft.compiler.backend import ptxas

SIGNATURE = {"out_ptr": "*fp32", "in_ptr": "*fp32", "in_row_stride": "i32", "out_row_stride": "i32", "n_rows": "i32",
             "n_cols": "i32"}
CONSTEXPRS = {"BLOCK": 4096, "VEC": 4, "WARPS": 8, "ELEMENT_BYTES": 4, "EVEN": False, "PREFETCH_ROWS": 0}


@pytest.mark.skipif(ptxas.find_ptxas() is None, reason="ptxas not found")
def test_cold_compile_under_a_second_and_warm_cache_hit_under_5ms(tmp_path, monkeypatch):
    monkeypatch.setenv("WEFT_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("WEFT_NO_CACHE", raising=False)
    # Warm the Python side (imports, llvmlite initialisation) as any session would have.
    softmax.softmax_kernel.compile(signature=SIGNATURE, constexprs={**CONSTEXPRS, "BLOCK": 1024}, num_warps=8)

    cold = []
    for block in (2048, 4096):  # two fresh specialisations, each missing both caches
        fresh = ll.jit(softmax.softmax_kernel.fn)
        start = time.perf_counter()
        compiled = fresh.compile(signature=SIGNATURE, constexprs={**CONSTEXPRS, "BLOCK": block}, num_warps=8)
        cold.append(time.perf_counter() - start)
        assert compiled.asm["cubin"]
    assert min(cold) < 1.0, f"cold compile took {cold} s"

    warm = []
    for _ in range(5):
        fresh = ll.jit(softmax.softmax_kernel.fn)  # empty in-memory cache: must read the disk
        start = time.perf_counter()
        hit = fresh.compile(signature=SIGNATURE, constexprs=CONSTEXPRS, num_warps=8)
        warm.append(time.perf_counter() - start)
        assert hit.asm["cubin"] == compiled.asm["cubin"]
    assert sorted(warm)[len(warm) // 2] < 0.005, f"warm disk-cache hits took {warm} s"
