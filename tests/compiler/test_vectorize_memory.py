"""vectorize_memory on hand-built IR: the vector width of a global load or store."""

import pytest

from weft.compiler.ir import Load, Store
from weft.compiler.passes.vectorize_memory import vectorize_memory

from .backend_kernels import vector_add_kernel


@pytest.mark.parametrize("per_thread, n_div, masked, expected", [
    (4, 16, True, 4),    # 4 fp32 = 128 bits, mask constant over 16
    (8, 16, True, 4),    # capped at 128 bits
    (4, 1, True, 1),     # n unknown: mask may change inside a vector
    (4, 1, False, 4),    # no mask: only alignment matters
    (2, 16, True, 2),
    (1, 16, True, 1),
])
def test_vector_width_follows_layout_alignment_and_mask(per_thread, n_div, masked, expected):
    kernel = vectorize_memory(vector_add_kernel(per_thread, n_div, masked))
    widths = [op.vector for op in kernel.walk() if isinstance(op, (Load, Store))]
    assert widths == [expected, expected]
