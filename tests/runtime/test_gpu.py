"""The driver and launcher on a real GPU: hand-written sm_90a PTX, checked against numpy.

Every test here carries the `gpu` marker (skipped without a CUDA device)."""

import time

import numpy as np
import pytest

from weft.compiler import hardware
from weft.compiler.compiled import CompiledKernel, Param
from weft.compiler.backend import ptxas
from weft.runtime import driver
from weft.runtime.jit import JITFunction, constexpr
from weft.runtime.launcher import Launcher

pytestmark = pytest.mark.gpu

# Thread t stores 3t at the t-th int from the end of `nbytes` of dynamic shared memory,
# then reads its mirror image: out[t] = 3 (ntid - 1 - t). Needs the > 48 KB opt-in when
# nbytes is large.
BIG_SMEM_PTX = """\
.version 8.0
.target sm_90a
.address_size 64
.extern .shared .align 16 .b8 dsmem[];

.visible .entry big_smem(
    .param .u64 big_smem_out,
    .param .u32 big_smem_nbytes
)
{
    .reg .b32   %r<10>;
    .reg .b64   %rd<3>;

    mov.u32         %r1, %tid.x;
    mov.u32         %r9, %ntid.x;
    ld.param.u32    %r2, [big_smem_nbytes];
    mov.u32         %r5, dsmem;
    add.s32         %r2, %r2, %r5;
    shl.b32         %r3, %r1, 2;
    sub.s32         %r4, %r2, %r3;
    sub.s32         %r4, %r4, 4;
    mul.lo.s32      %r6, %r1, 3;
    st.shared.u32   [%r4], %r6;
    bar.sync        0;
    sub.s32         %r7, %r9, %r1;
    shl.b32         %r7, %r7, 2;
    sub.s32         %r8, %r2, %r7;
    ld.shared.u32   %r6, [%r8];
    ld.param.u64    %rd1, [big_smem_out];
    cvta.to.global.u64 %rd1, %rd1;
    mul.wide.u32    %rd2, %r1, 4;
    add.s64         %rd1, %rd1, %rd2;
    st.global.u32   [%rd1], %r6;
    ret;
}
"""

# out[blockIdx.x] = the block's rank in its cluster (always 0 without a cluster launch).
CLUSTER_RANK_PTX = """\
.version 8.0
.target sm_90a
.address_size 64

.visible .entry cluster_rank(
    .param .u64 cluster_rank_out
)
{
    .reg .b32   %r<3>;
    .reg .b64   %rd<3>;

    mov.u32         %r1, %cluster_ctarank;
    mov.u32         %r2, %ctaid.x;
    ld.param.u64    %rd1, [cluster_rank_out];
    cvta.to.global.u64 %rd1, %rd1;
    mul.wide.u32    %rd2, %r2, 4;
    add.s64         %rd1, %rd1, %rd2;
    st.global.u32   [%rd1], %r1;
    ret;
}
"""


class DeviceBuffer:
    """Device memory from cuMemAlloc, exposed through __cuda_array_interface__ only."""

    def __init__(self, host: np.ndarray):
        d = driver.cuda()
        driver.current_device()  # makes a context current if none is
        self.nbytes, self.dtype, self.shape = host.nbytes, host.dtype, host.shape
        self.ptr = driver.check(d.cuMemAlloc(self.nbytes), "cuMemAlloc")
        driver.check(d.cuMemcpyHtoD(self.ptr, np.ascontiguousarray(host), self.nbytes),
                     "cuMemcpyHtoD")
        self.__cuda_array_interface__ = {"data": (int(self.ptr), False), "version": 3,
                                         "typestr": host.dtype.str, "shape": host.shape}

    def numpy(self) -> np.ndarray:
        out = np.empty(self.shape, self.dtype)
        driver.synchronize()
        driver.check(driver.cuda().cuMemcpyDtoH(out, self.ptr, self.nbytes), "cuMemcpyDtoH")
        return out

    def __del__(self):
        try:
            driver.cuda().cuMemFree(self.ptr)
        except Exception:
            pass


def _vadd(kind, make_vadd, vadd_ptx):
    if kind == "ptx":
        return make_vadd()
    cubin, report = ptxas.assemble(vadd_ptx)
    return make_vadd(asm={"ptx": vadd_ptx, "cubin": cubin}, metadata={"ptxas": report})


def test_device_properties():
    props = driver.device_properties(driver.current_device())
    assert driver.has_gpu() and props.sm_count > 0 and props.warp_size == 32
    assert props.max_shared_optin > hardware.STATIC_SHARED_LIMIT
    print(f"\n{props}")


@pytest.mark.parametrize("kind", ["ptx", "cubin"])
def test_vadd_with_driver_memory(kind, make_vadd, vadd_ptx):
    compiled = _vadd(kind, make_vadd, vadd_ptx)
    if kind == "cubin" and ptxas.find_ptxas() is None:
        pytest.skip("no ptxas")
    n = 1000
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    dx, dy, dout = DeviceBuffer(x), DeviceBuffer(y), DeviceBuffer(np.zeros(n, np.float32))
    Launcher(compiled)(((n + 127) // 128,), (dx, dy, dout, n))
    np.testing.assert_array_equal(dout.numpy(), x + y)


def test_bad_ptx_reports_the_jit_log(vadd_ptx):
    driver.current_device()
    with pytest.raises(driver.DriverError) as info:
        driver.load_module("ptx", vadd_ptx.replace("add.f32  ", "addd.f32 "))
    assert info.value.call == "cuModuleLoadDataEx (PTX JIT)"
    assert "addd" in info.value.log, str(info.value)


def test_dynamic_shared_memory_above_48_kb():
    nbytes = 160 * 1024
    compiled = CompiledKernel("big_smem", (Param("out", "*i32"), Param("nbytes", "i32")),
                              num_warps=8, shared=nbytes, asm={"ptx": BIG_SMEM_PTX})
    out = DeviceBuffer(np.zeros(256, np.int32))
    Launcher(compiled)(1, (out, nbytes))
    np.testing.assert_array_equal(out.numpy(), 3 * np.arange(255, -1, -1))
    # Without the opt-in the same launch is refused, so the launcher really set it.
    fn = driver.get_function(driver.load_module("ptx", BIG_SMEM_PTX), "big_smem")
    with pytest.raises(driver.DriverError, match="cuLaunchKernelEx failed"):
        driver.launch(fn, (1,), (256,), nbytes, None, [])


def test_cluster_launch():
    out = DeviceBuffer(np.full(8, -1, np.int32))
    compiled = CompiledKernel("cluster_rank", (Param("out", "*i32"),), 1, 0,
                              {"ptx": CLUSTER_RANK_PTX}, cluster=(2, 1, 1))
    Launcher(compiled)(8, (out,))
    np.testing.assert_array_equal(out.numpy(), [0, 1] * 4)
    compiled.cluster = None
    Launcher(compiled)(8, (out,))
    np.testing.assert_array_equal(out.numpy(), [0] * 8)


def _array_library():
    try:
        import torch
        if torch.cuda.is_available():
            return "torch"
    except ImportError:
        pass
    try:
        import cupy  # noqa: F401
        return "cupy"
    except ImportError:
        pytest.skip("neither torch nor cupy is installed")


def test_vadd_from_torch_or_cupy_through_the_jit(make_vadd, vadd_ptx, tmp_path, monkeypatch):
    monkeypatch.setenv("WEFT_CACHE_DIR", str(tmp_path))
    library = _array_library()
    n = 100_000
    rng = np.random.default_rng(1)
    hx, hy = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    if library == "torch":
        import torch
        x, y = torch.from_numpy(hx).cuda(), torch.from_numpy(hy).cuda()
        out = torch.empty_like(x)
        to_numpy = lambda t: t.cpu().numpy()  # noqa: E731
    else:
        import cupy
        x, y = cupy.asarray(hx), cupy.asarray(hy)
        out = cupy.empty_like(x)
        to_numpy = cupy.asnumpy

    compiles = []

    def compile_fn(jit_fn, signature, constexprs, specialization, options):
        compiles.append(signature)
        cubin, report = ptxas.assemble(vadd_ptx)
        return make_vadd(asm={"ptx": vadd_ptx, "cubin": cubin}, metadata={"ptxas": report})

    def vadd(x, y, out, n, BLOCK: constexpr):
        pass

    kernel = JITFunction(vadd, compile_fn)
    grid = lambda meta: ((meta["n"] + meta["BLOCK"] - 1) // meta["BLOCK"],)  # noqa: E731
    kernel[grid](x, y, out, n, BLOCK=128)
    np.testing.assert_array_equal(to_numpy(out), hx + hy)
    assert compiles == [{"x": "*fp32", "y": "*fp32", "out": "*fp32", "n": "i32"}]

    if library == "torch":
        import torch
        side = torch.cuda.Stream()
        out.zero_()
        torch.cuda.synchronize()
        with torch.cuda.stream(side):  # launches follow torch's current stream
            kernel[grid](y, y, out, n, BLOCK=128)
        side.synchronize()
        np.testing.assert_array_equal(to_numpy(out), hy + hy)

    g = ((n + 127) // 128,)
    launch = kernel[g]
    for _ in range(200):
        launch(x, y, out, n, BLOCK=128)
    driver.synchronize()
    count = 5000
    start = time.perf_counter()
    for _ in range(count):
        launch(x, y, out, n, BLOCK=128)
    host = (time.perf_counter() - start) / count * 1e6
    driver.synchronize()
    launcher = next(iter(kernel._launchers.values()))
    start = time.perf_counter()
    for _ in range(count):
        launcher(g, (x, y, out, n))
    direct = (time.perf_counter() - start) / count * 1e6
    driver.synchronize()
    print(f"\n{library}: cached launch incl. cuLaunchKernelEx: JIT {host:.2f} us, "
          f"Launcher {direct:.2f} us per launch")
    np.testing.assert_array_equal(to_numpy(out), hx + hy)
