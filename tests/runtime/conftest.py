"""Hand-written sm_90a PTX kernels and fakes shared by the runtime tests."""

import pytest

from weft.compiler.compiled import CompiledKernel, Param

# out[i] = x[i] + y[i] for i < n; one thread per element.
VADD_PTX = """\
.version 8.0
.target sm_90a
.address_size 64

.visible .entry vadd(
    .param .u64 vadd_x,
    .param .u64 vadd_y,
    .param .u64 vadd_out,
    .param .u32 vadd_n
)
{
    .reg .pred  %p<2>;
    .reg .b32   %r<6>;
    .reg .f32   %f<4>;
    .reg .b64   %rd<11>;

    mov.u32         %r1, %ctaid.x;
    mov.u32         %r2, %ntid.x;
    mov.u32         %r3, %tid.x;
    mad.lo.s32      %r4, %r1, %r2, %r3;
    ld.param.u32    %r5, [vadd_n];
    setp.ge.s32     %p1, %r4, %r5;
    @%p1 bra        DONE;
    ld.param.u64    %rd1, [vadd_x];
    ld.param.u64    %rd2, [vadd_y];
    ld.param.u64    %rd3, [vadd_out];
    cvta.to.global.u64 %rd4, %rd1;
    cvta.to.global.u64 %rd5, %rd2;
    cvta.to.global.u64 %rd6, %rd3;
    mul.wide.s32    %rd7, %r4, 4;
    add.s64         %rd8, %rd4, %rd7;
    add.s64         %rd9, %rd5, %rd7;
    add.s64         %rd10, %rd6, %rd7;
    ld.global.f32   %f1, [%rd8];
    ld.global.f32   %f2, [%rd9];
    add.f32         %f3, %f1, %f2;
    st.global.f32   [%rd10], %f3;
DONE:
    ret;
}
"""

# Reverses 256 floats through 1 KB of static shared memory: exercises the smem report.
REVERSE_SMEM_PTX = """\
.version 8.0
.target sm_90a
.address_size 64

.visible .entry reverse(
    .param .u64 reverse_x
)
{
    .shared .align 16 .b8 buf[1024];
    .reg .b32   %r<6>;
    .reg .f32   %f<2>;
    .reg .b64   %rd<4>;

    mov.u32         %r1, %tid.x;
    ld.param.u64    %rd1, [reverse_x];
    cvta.to.global.u64 %rd2, %rd1;
    mul.wide.u32    %rd3, %r1, 4;
    add.s64         %rd2, %rd2, %rd3;
    ld.global.f32   %f1, [%rd2];
    shl.b32         %r2, %r1, 2;
    mov.u32         %r3, buf;
    add.s32         %r4, %r3, %r2;
    st.shared.f32   [%r4], %f1;
    bar.sync        0;
    sub.s32         %r5, 1020, %r2;
    add.s32         %r5, %r3, %r5;
    ld.shared.f32   %f1, [%r5];
    st.global.f32   [%rd2], %f1;
    ret;
}
"""


def vadd_kernel(**changes) -> CompiledKernel:
    """A CompiledKernel for VADD_PTX (PTX only: the driver JIT or ptxas makes the cubin)."""
    fields = dict(
        name="vadd",
        params=(Param("x", "*fp32"), Param("y", "*fp32"), Param("out", "*fp32"),
                Param("n", "i32")),
        num_warps=4, shared=0, asm={"source": "def vadd(...)", "ptx": VADD_PTX},
        metadata={"num_warps": 4, "shared": 0})
    fields.update(changes)
    return CompiledKernel(**fields)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """An empty WEFT_CACHE_DIR for the test."""
    path = tmp_path / "weft-cache"
    monkeypatch.setenv("WEFT_CACHE_DIR", str(path))
    monkeypatch.delenv("WEFT_NO_CACHE", raising=False)
    monkeypatch.delenv("WEFT_EMULATE", raising=False)
    return path


@pytest.fixture
def vadd_ptx() -> str:
    return VADD_PTX


@pytest.fixture
def reverse_ptx() -> str:
    return REVERSE_SMEM_PTX


@pytest.fixture
def make_vadd():
    """A factory for vadd CompiledKernels: make_vadd(**field_changes)."""
    return vadd_kernel
