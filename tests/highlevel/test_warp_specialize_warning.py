"""warp_specialize=True on a loop weft does not split warns at the loop's line (the kernel
runs as one partition, still right); a loop it splits compiles without a warning."""

import inspect
import warnings

import pytest

from weft import highlevel as tl
from weft.compiler import pipeline
from weft.compiler.errors import CompilationWarning
from weft.compiler.frontend import build_kernel
from weft.compiler.ir import WarpSpecialize


@tl.jit
def pointer_matmul(a_ptr, b_ptr, c_ptr, K, BLOCK: tl.constexpr):
    """A pointer-load K loop asking for warp specialization, whose loads' `other` (1, not
    0) keeps it out of the cp.async rings: weft does not split it."""
    offs = tl.arange(0, BLOCK)
    a_ptrs = a_ptr + offs[:, None] * K + offs[None, :]
    b_ptrs = b_ptr + offs[:, None] * BLOCK + offs[None, :]
    acc = tl.zeros([BLOCK, BLOCK], dtype=tl.float32)
    for _ in tl.range(0, K, BLOCK, num_stages=3, warp_specialize=True):
        acc = tl.dot(tl.load(a_ptrs, mask=offs[None, :] < K, other=1.0), tl.load(b_ptrs), acc)
        a_ptrs += BLOCK
        b_ptrs += BLOCK * BLOCK
    tl.store(c_ptr + offs[:, None] * BLOCK + offs[None, :], acc)


@tl.jit
def descriptor_matmul(a_desc, b_desc, c_desc, K, BLOCK: tl.constexpr):
    """A descriptor K loop asking for warp specialization: weft splits it."""
    acc = tl.zeros([BLOCK, BLOCK], tl.float32)
    for k in tl.range(0, K, BLOCK, num_stages=3, warp_specialize=True):
        acc = tl.dot(a_desc.load([0, k]), b_desc.load([k, 0]), acc)
    c_desc.store([0, 0], acc.to(c_desc.dtype))


def test_a_loop_it_does_not_split_warns_at_its_line():
    signature = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp32", "K": "i32"}
    with pytest.warns(CompilationWarning, match="warp_specialize=True is not applied") as caught:
        pipeline.prepare_for_emulator(build_kernel(pointer_matmul, signature, {"BLOCK": 64}, 4, {},
                                                   language="highlevel"))
    lines, first = inspect.getsourcelines(pointer_matmul.fn)
    loop_line = first + next(i for i, text in enumerate(lines) if "warp_specialize=True" in text)
    assert [(w.filename, w.lineno) for w in caught] == [(__file__, loop_line)]


def test_a_loop_it_splits_compiles_without_a_warning():
    box = "tensordesc<fp16[64,64]>"
    signature = {"a_desc": box, "b_desc": box, "c_desc": box, "K": "i32"}
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompilationWarning)
        kernel = pipeline.prepare_for_emulator(build_kernel(descriptor_matmul, signature, {"BLOCK": 64}, 4, {},
                                                            language="highlevel"))
    assert any(isinstance(op, WarpSpecialize) for op in kernel.walk())
