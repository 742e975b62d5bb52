"""warp_specialize=True on a loop weft does not split warns at the loop's line (the kernel
runs as one partition, still right); a loop it splits compiles without a warning."""

import inspect
import warnings

import pytest

from weft import highlevel as tl
from weft.compiler import pipeline
from weft.compiler.errors import CompilationWarning
from weft.compiler.frontend import build_kernel

from .test_warp_specialize_tma import prepared


@tl.jit
def pointer_matmul(a_ptr, b_ptr, c_ptr, K, BLOCK: tl.constexpr):
    """A pointer-load K loop asking for warp specialization."""
    offs = tl.arange(0, BLOCK)
    a_ptrs = a_ptr + offs[:, None] * K + offs[None, :]
    b_ptrs = b_ptr + offs[:, None] * BLOCK + offs[None, :]
    acc = tl.zeros([BLOCK, BLOCK], dtype=tl.float32)
    for _ in tl.range(0, K, BLOCK, num_stages=3, warp_specialize=True):
        acc = tl.dot(tl.load(a_ptrs), tl.load(b_ptrs), acc)
        a_ptrs += BLOCK
        b_ptrs += BLOCK * BLOCK
    tl.store(c_ptr + offs[:, None] * BLOCK + offs[None, :], acc)


def test_a_loop_it_does_not_split_warns_at_its_line():
    signature = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp32", "K": "i32"}
    with pytest.warns(CompilationWarning, match="warp_specialize=True is not applied") as caught:
        pipeline.prepare_for_emulator(build_kernel(pointer_matmul, signature, {"BLOCK": 64}, 4, {},
                                                   language="highlevel"))
    lines, first = inspect.getsourcelines(pointer_matmul.fn)
    loop_line = first + next(i for i, text in enumerate(lines) if "warp_specialize=True" in text)
    assert [(w.filename, w.lineno) for w in caught] == [(__file__, loop_line)]


def test_a_loop_it_splits_compiles_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompilationWarning)
        prepared((64, 64, 32), 3)
