"""`tl.make_tensor_descriptor` in highlevel kernels: the tensor map is built on the host at
each launch from the kernel's arguments (a hidden parameter), so the base must be a pointer
parameter and the shape and strides int parameters, constants, or +, -, * of them. Checked
on the CPU emulator against numpy float64, with the refusals at the user's line."""

import numpy as np
import pytest

from weft import highlevel as tl
from weft.compiler.errors import CompilationError
from weft.compiler.frontend import build_kernel
from weft.runtime.made_tensor_descriptor import FIELD, parse_recipe, shape_and_strides

torch = pytest.importorskip("torch")  # bf16 host arrays

RNG = np.random.default_rng(4041)


@tl.jit
def made_matmul(a_ptr, b_ptr, c_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Tutorial 09's in-kernel descriptors: C = A @ B, all row-major."""
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[K, 1], block_shape=[BLOCK_M, BLOCK_K])
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[N, 1], block_shape=[BLOCK_K, BLOCK_N])
    c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[N, 1], block_shape=[BLOCK_M, BLOCK_N])
    m = tl.program_id(0) * BLOCK_M
    n = tl.program_id(1) * BLOCK_N
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        acc = tl.dot(a_desc.load([m, k * BLOCK_K]), tl.load_tensor_descriptor(b_desc, [k * BLOCK_K, n]), acc)
    c_desc.store([m, n], acc.to(c_desc.dtype))


@pytest.mark.parametrize("dtype, m, n, k", [(torch.float16, 100, 72, 80), (torch.bfloat16, 64, 136, 40)])
def test_made_descriptors_match_numpy(dtype, m, n, k):
    a = torch.tensor(RNG.standard_normal((m, k)), dtype=torch.float32).to(dtype)
    b = torch.tensor(RNG.standard_normal((k, n)), dtype=torch.float32).to(dtype)
    c = torch.zeros((m, n), dtype=dtype)
    made_matmul[(-(-m // 64), -(-n // 64))](a, b, c, m, n, k, BLOCK_M=64, BLOCK_N=64, BLOCK_K=32)
    reference = a.double().numpy() @ b.double().numpy()
    rounding = 2 ** -10 if dtype == torch.float16 else 2 ** -7
    error = np.abs(c.double().numpy() - reference)
    scale = np.abs(a.double().numpy()) @ np.abs(b.double().numpy())
    assert (error <= 1e-5 * scale + rounding * np.abs(reference)).all(), error.max()


def _build(kernel, signature, constexprs=None):
    return build_kernel(kernel, signature, constexprs or {}, 4, {}, language="highlevel")


def test_the_recipe_is_evaluated_from_the_arguments():
    @tl.jit
    def strided(x_ptr, rows, cols, pitch):
        desc = tl.make_tensor_descriptor(x_ptr, [rows - 1, cols], [pitch * 2, 1], [8, 64])
        desc.store([0, 0], desc.load([0, 0]))

    kernel = _build(strided, {"x_ptr": "*fp16", "rows": "i32", "cols": "i32", "pitch": "i64"})
    ((base, field, recipe),) = kernel.hidden_params
    assert (base, field) == ("x_ptr", FIELD)
    args = {"rows": 9, "cols": 70, "pitch": 40}
    assert shape_and_strides(recipe, args.__getitem__) == ((8, 70), (80, 1))
    assert parse_recipe(recipe)[0][0] == ("sub", ("param", "rows"), ("const", 1))


@pytest.mark.parametrize("body, message", [
    ("desc = tl.make_tensor_descriptor(x_ptr, [n, n], [1, n], [16, 64])", "innermost stride"),
    ("desc = tl.make_tensor_descriptor(x_ptr, [n, n], [n, 1], [16, 512])", "TMA box limit"),
    ("desc = tl.make_tensor_descriptor(x_ptr, [n, n], [n, 1], [16, 4])", "16 bytes|swizzle|inner"),
    ("desc = tl.make_tensor_descriptor(x_ptr, [n], [n, 1], [16, 64])", "2 values"),
])
def test_what_cannot_be_a_tensor_map_is_refused_at_its_line(tmp_path, body, message):
    source = tmp_path / "kernel_source.py"
    source.write_text("from weft import highlevel as tl\n\n\n@tl.jit\ndef kernel(x_ptr, n_ptr, n):\n"
                      f"    {body}\n")
    namespace = {}
    exec(compile(source.read_text(), str(source), "exec"), namespace)
    with pytest.raises(CompilationError, match=message) as error:
        _build(namespace["kernel"], {"x_ptr": "*fp16", "n_ptr": "*i32", "n": "i32"})
    assert error.value.loc.line == 6


def test_the_launcher_encodes_each_made_map_from_the_launch_arguments(monkeypatch):
    from weft.runtime import tensor_descriptor
    from weft.runtime.launcher import Launcher

    encoded = []
    monkeypatch.setattr(tensor_descriptor, "_encoded", lambda *args: encoded.append(args) or bytes(128))
    compiled = made_matmul.compile(signature={"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp16", "M": "i32",
                                              "N": "i32", "K": "i32"},
                                   constexprs=dict(BLOCK_M=128, BLOCK_N=64, BLOCK_K=32), num_warps=4)
    values = Launcher(compiled)._with_hidden([0x1000, 0x2000, 0x3000, 300, 200, 96])
    assert len(values) == 9 and values[6:] == [bytes(128)] * 3
    # (element, address, shape, strides, copy box, swizzle, itemsize) per map, in parameter order
    assert [e[1:4] for e in encoded] == [(0x1000, (300, 96), (96, 1)), (0x2000, (96, 200), (200, 1)),
                                         (0x3000, (300, 200), (200, 1))]
    assert [e[4] for e in encoded] == [(128, 32), (32, 64), (128, 64)]


def test_one_base_may_be_described_with_two_boxes():
    @tl.jit
    def two_boxes(x_ptr, n):
        wide = tl.make_tensor_descriptor(x_ptr, [n, n], [n, 1], [16, 64])
        tall = tl.make_tensor_descriptor(x_ptr, [n, n], [n, 1], [64, 16])
        wide.store([0, 0], tl.reshape(tall.load([0, 0]), (16, 64)))

    kernel = _build(two_boxes, {"x_ptr": "*fp16", "n": "i32"})
    boxes = [p.type.block_shape for p in kernel.params[2:]]
    assert boxes == [(16, 64), (64, 16)]
