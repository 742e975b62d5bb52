"""benchmarks/sweep_matmul_classes.py's candidates, on the CPU: for every class shape,
valid configs that fit shared memory and (gemv) the tile of B's layout, without
repeats, configs_for's among them, and few enough to time within the run's budget."""

import pytest

from benchmarks.matmul_classes import SHAPES
from benchmarks.sweep_matmul_classes import candidates_for
from weft.kernels.matmul import configs_for
from weft.kernels.matmul.config import SHARED_LIMIT, shared_bytes
from weft.kernels.matmul.gemv import gemv_tile_error

H200_SMS = 132


@pytest.mark.parametrize("shape_class, m, n, k, layout", SHAPES)
def test_sweep_candidates_are_valid_and_bounded(shape_class, m, n, k, layout):
    k_major = layout == "nk"
    candidates = candidates_for(m, n, k, H200_SMS, 16, k_major)
    assert len(candidates) == len(set(candidates)) and 5 <= len(candidates) <= 24
    assert set(configs_for(16, 16, m, n, k, H200_SMS, b_k_major=k_major)) <= set(candidates)
    for config in candidates:
        config.check_fits(16, 16)
        assert shared_bytes(config, 16, 16) <= SHARED_LIMIT
        if config.variant == "gemv":
            assert m == 1 and gemv_tile_error(config.block_n, config.block_k, config.num_warps, 8, k_major) is None
    if shape_class == "odd" and (m, n) == (1000, 3000):
        assert any(c.block_n == 192 for c in candidates)
