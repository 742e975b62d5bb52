"""runtime/jit.py: binding, constexprs, dispatch to GPU or emulator, caches (no GPU:
the compiler, emulator and cuLaunchKernelEx are fakes)."""

import time

import numpy as np
import pytest

from weft.compiler.compiled import CompiledKernel, Param
from weft.runtime import driver
from weft.runtime.arguments import ArgumentTypeError, LaunchError
from weft.runtime.jit import JITFunction, constexpr, jit

SCALE = 2


class FakeCupyArray:
    def __init__(self, address, device=0, typestr="<f4"):
        self.__cuda_array_interface__ = {"data": (address, False), "typestr": typestr,
                                         "shape": (4,), "version": 3}
        self.device = device

    def __dlpack_device__(self):
        return (2, self.device)


def helper(x):
    return x


def add_kernel(x, y, out, n, BLOCK: constexpr, EVEN: "wl.constexpr" = True):
    helper(x)
    return SCALE


class FakeCompiler:
    """Records compile requests; returns a vadd-like CompiledKernel (or an "IR" string
    for the emulator target)."""

    def __init__(self, ptx):
        self.calls = []
        self.ptx = ptx

    def __call__(self, jit_fn, signature, constexprs, specialization, options):
        self.calls.append(dict(signature=signature, constexprs=constexprs,
                               specialization=specialization, options=options))
        if options["target"] == "emulator":
            return f"layout IR of {jit_fn.__name__} {constexprs}"
        params = tuple(Param(n, t) for n, t in signature.items())
        return CompiledKernel("vadd", params, options["num_warps"], 0, {"ptx": self.ptx},
                              {"constexprs": constexprs})


class FakeEmulator:
    def __init__(self):
        self.calls = []

    def __call__(self, kernel, grid, args):
        self.calls.append((kernel, grid, args))
        args[2][:] = args[0] + args[1]


@pytest.fixture
def compiler(vadd_ptx):
    return FakeCompiler(vadd_ptx)


@pytest.fixture
def launches(monkeypatch):
    calls = []
    monkeypatch.setattr(driver.cuda(), "cuLaunchKernelEx",
                        lambda config, f, params, extra: calls.append(
                            ((config.gridDimX, config.gridDimY, config.gridDimZ),
                             config.blockDimX, f)) or (0,))
    monkeypatch.setattr(driver, "load_module", lambda kind, data: ("module", kind))
    monkeypatch.setattr(driver, "get_function", lambda module, name: f"function {name}")
    monkeypatch.setattr(driver, "current_context", lambda: 1)
    monkeypatch.setattr(driver, "primary_context", lambda device: 1)
    monkeypatch.setattr(driver, "device_properties", lambda device: driver.DeviceProperties(
        device, "fake", (9, 0), 132, 232448, 233472, 1024, 32))
    return calls


def test_constexpr_parameters_from_annotations_and_names(compiler):
    k = JITFunction(add_kernel, compiler)
    assert k.constexpr_names == ("BLOCK", "EVEN")
    assert k.runtime_names == ("x", "y", "out", "n")
    assert JITFunction(helper, compiler, constexpr_names=["x"]).constexpr_names == ("x",)
    assert k.__name__ == "add_kernel" and k.__doc__ is None
    with pytest.raises(TypeError, match="parameter name 'num_warps' is reserved"):
        JITFunction(lambda x, num_warps: None)


def test_host_arrays_run_on_the_emulator(cache_dir, compiler):
    emulator = FakeEmulator()
    k = jit(add_kernel, compile_fn=compiler, emulate_fn=emulator)
    x, y, out = np.ones(16, np.float32), np.full(16, 2, np.float32), np.zeros(16, np.float32)
    k[(2,)](x, y, out, 16, BLOCK=8)
    np.testing.assert_array_equal(out, 3)
    assert compiler.calls == [dict(
        signature={"x": "*fp32", "y": "*fp32", "out": "*fp32", "n": "i32"},
        constexprs={"BLOCK": 8, "EVEN": True},
        specialization={"x": "divisible_by_16", "y": "divisible_by_16",
                        "out": "divisible_by_16", "n": "divisible_by_16"},
        options={"num_warps": 4, "target": "emulator"})]
    kernel, grid, args = emulator.calls[0]
    assert kernel == "layout IR of add_kernel {'BLOCK': 8, 'EVEN': True}"
    assert grid == (2, 1, 1) and args[0] is x and args[3] == 16
    assert not list(cache_dir.rglob("*.weft"))  # emulator results stay in memory
    k[lambda meta: (meta["n"] // meta["BLOCK"],)](x, y, out, 16, BLOCK=8)
    assert len(compiler.calls) == 1 and emulator.calls[1][1] == (2, 1, 1)


def test_new_variants_compile_only_when_the_key_changes(cache_dir, compiler):
    k = JITFunction(add_kernel, compiler, lambda kernel, grid, args: None)
    x = np.zeros(64, np.float32)
    run = k[1]
    run(x, x, x, 32, 8)
    run(x, x, x, 48, 8)  # same specialization
    run(x, x, x, 33, 8)  # n no longer divisible by 16
    run(x, x, x, 1, 8)  # n == 1
    run(x, x, x, 2**40, 8)  # i64
    run(x, x, x, 32, BLOCK=16)
    run(x, x, x, 32, BLOCK=True)  # True == 1 but is another constexpr
    run(x, x, x, 32, BLOCK=1)
    run(x[1:], x, x, 32, 8)  # misaligned pointer
    run(x, x, x, 32, 8, num_warps=8)
    run(x, x, x, 32, 8, num_stages=3)
    run(x, x, x, 32, constexpr(8))  # a wrapped constexpr is its value
    specs = [(c["specialization"]["x"], c["signature"]["n"], c["specialization"]["n"],
              c["constexprs"]["BLOCK"], c["options"]) for c in compiler.calls]
    e = {"num_warps": 4, "target": "emulator"}
    assert specs == [
        ("divisible_by_16", "i32", "divisible_by_16", 8, e),
        ("divisible_by_16", "i32", "", 8, e),
        ("divisible_by_16", "i32", "equal_to_1", 8, e),
        ("divisible_by_16", "i64", "divisible_by_16", 8, e),
        ("divisible_by_16", "i32", "divisible_by_16", 16, e),
        ("divisible_by_16", "i32", "divisible_by_16", True, e),
        ("divisible_by_16", "i32", "divisible_by_16", 1, e),
        ("", "i32", "divisible_by_16", 8, e),
        ("divisible_by_16", "i32", "divisible_by_16", 8, {"num_warps": 8, "target": "emulator"}),
        ("divisible_by_16", "i32", "divisible_by_16", 8, {**e, "num_stages": 3}),
    ]


def test_weft_emulate_forces_the_emulator(cache_dir, compiler, monkeypatch):
    emulator = FakeEmulator()
    k = JITFunction(add_kernel, compiler, lambda *a: emulator.calls.append(a))
    monkeypatch.setenv("WEFT_EMULATE", "1")
    a = FakeCupyArray(0x1000)
    k[4](a, a, a, 16, BLOCK=4)
    assert compiler.calls[0]["options"]["target"] == "emulator"
    assert emulator.calls[0][1] == (4, 1, 1) and emulator.calls[0][2][0] is a


def test_missing_emulator_and_mixed_memory_are_errors(cache_dir, compiler):
    k = JITFunction(add_kernel, compiler)
    x = np.zeros(4, np.float32)
    with pytest.raises(LaunchError) as info:
        k[1](x, x, x, 4, BLOCK=4)
    assert str(info.value) == (
        "kernel 'add_kernel' must run on the CPU emulator (host arrays or WEFT_EMULATE=1), "
        "but this JITFunction has no emulate_fn; pass device arrays for a GPU launch, or "
        "build it with emulate_fn")
    with pytest.raises(LaunchError) as info:
        k[1](x, FakeCupyArray(0x100), x, 4, BLOCK=4)
    assert str(info.value) == (
        "kernel 'add_kernel' got host arrays (x, out) and device arrays (y); pass all arrays "
        "on the GPU, or all on the host to run on the CPU emulator")
    with pytest.raises(LaunchError, match="has no compiler"):
        JITFunction(add_kernel)[1](FakeCupyArray(16), FakeCupyArray(16), FakeCupyArray(16),
                                   4, BLOCK=4)


def test_binding_errors(compiler):
    k = JITFunction(add_kernel, compiler, FakeEmulator())
    x = np.zeros(4, np.float32)
    cases = [
        (lambda: k[1](x, x, x), "kernel 'add_kernel' is missing arguments 'n', 'BLOCK'"),
        (lambda: k[1](x, x, x, 4, 4, True, 5),
         "kernel 'add_kernel' takes 6 arguments (x, y, out, n, BLOCK, EVEN), got 7"),
        (lambda: k[1](x, x, x, 4, BLOCK=4, WIDTH=2),
         "kernel 'add_kernel' has no parameter 'WIDTH'; its parameters are x, y, out, n, "
         "BLOCK, EVEN"),
        (lambda: k[1](x, x, x, 4, 8, BLOCK=4),
         "kernel 'add_kernel' got two values for 'BLOCK'"),
        (lambda: k[(0, 1)](x, x, x, 4, BLOCK=4),
         "grid (0, 1, 1) of kernel 'add_kernel' has a zero dimension; every grid dimension "
         "must be at least 1 (skip the launch for empty inputs)"),
    ]
    for call, message in cases:
        with pytest.raises(LaunchError) as info:
            call()
        assert str(info.value) == message
    with pytest.raises(TypeError, match=r"is launched as add_kernel\[grid\]\(...\)"):
        k(x, x, x, 4, BLOCK=4)


def test_gpu_dispatch_launches_and_uses_the_disk_cache(cache_dir, compiler, launches):
    a, b, c = FakeCupyArray(0x1000), FakeCupyArray(0x2000), FakeCupyArray(0x3000)
    k = JITFunction(add_kernel, compiler)
    k[(3, 2)](a, b, c, 64, BLOCK=32, num_warps=2)
    k[(3, 2)](a, b, c, 96, BLOCK=32, num_warps=2)
    assert launches == [((3, 2, 1), 64, "function vadd")] * 2
    assert len(compiler.calls) == 1
    assert compiler.calls[0]["options"] == {"num_warps": 2, "target": "sm_90a"}
    entries = list(cache_dir.rglob("*.weft"))
    assert len(entries) == 1
    # A fresh JITFunction (a new process, in effect) finds the kernel on disk.
    JITFunction(add_kernel, compiler)[1](a, b, c, 64, BLOCK=32, num_warps=2)
    assert len(compiler.calls) == 1 and len(launches) == 3
    # A corrupt entry is rebuilt, not fatal.
    entries[0].write_bytes(entries[0].read_bytes()[:-40])
    JITFunction(add_kernel, compiler)[1](a, b, c, 64, BLOCK=32, num_warps=2)
    assert len(compiler.calls) == 2 and len(launches) == 4
    assert cache_dir.rglob("*.weft")


def test_gpu_dtype_mismatch_after_compile(cache_dir, launches, vadd_ptx):
    def fixed_fp32(jit_fn, signature, constexprs, specialization, options):
        return CompiledKernel("vadd", tuple(Param(n, "*fp32" if t.startswith("*") else t)
                                            for n, t in signature.items()),
                              4, 0, {"ptx": vadd_ptx})
    k = JITFunction(add_kernel, fixed_fp32)
    a = FakeCupyArray(0x1000)
    with pytest.raises(ArgumentTypeError, match=r"argument 'y' of kernel 'vadd' was compiled "
                                                r"for \*fp32 but got .* of dtype fp16"):
        k[1](a, FakeCupyArray(0x10, typestr="<f2"), a, 4, BLOCK=4)


def test_no_cache_flag_skips_the_disk(cache_dir, compiler, launches, monkeypatch):
    monkeypatch.setenv("WEFT_NO_CACHE", "1")
    a = FakeCupyArray(0x1000)
    JITFunction(add_kernel, compiler)[1](a, a, a, 4, BLOCK=4)
    assert not cache_dir.exists()


def test_compile_ahead_of_time(cache_dir, compiler):
    k = JITFunction(add_kernel, compiler)
    compiled = k.compile(("*fp32", "*fp32", "*fp32", "i32"), {"BLOCK": 64}, num_warps=8)
    assert compiled.num_warps == 8 and compiler.calls[0]["specialization"] == dict.fromkeys(
        ("x", "y", "out", "n"), "")
    assert k.compile({"x": "*fp32", "y": "*fp32", "out": "*fp32", "n": "i32"},
                     {"BLOCK": 64}, num_warps=8) is compiled
    assert k.launcher(compiled) is k.launcher(compiled)
    with pytest.raises(LaunchError) as info:
        k.compile({"x": "*fp32"}, {"BLOCK": 64})
    assert str(info.value) == ("signature of kernel 'add_kernel' must name exactly "
                               "['x', 'y', 'out', 'n']; missing ['y', 'out', 'n'], "
                               "unexpected []")
    with pytest.raises(LaunchError, match="needs a value for constexpr 'BLOCK'"):
        k.compile(("*fp32",) * 3 + ("i32",))
    with pytest.raises(LaunchError, match=r"has no constexpr parameters \['n'\]"):
        k.compile(("*fp32",) * 3 + ("i32",), {"BLOCK": 1, "n": 3})


def test_fingerprint_is_the_code_not_the_comments(compiler):
    def kernel_a(x):  # a comment
        return x + 1

    def kernel_b(x):

        return x + 1

    def kernel_c(x):
        return x + 2

    for other in (kernel_b, kernel_c):  # the same name: only the body differs
        other.__code__ = other.__code__.replace(co_name="kernel_a", co_qualname=kernel_a.__qualname__)
        other.__name__, other.__qualname__ = "kernel_a", kernel_a.__qualname__
    a, b, c = (JITFunction(f, compiler) for f in (kernel_a, kernel_b, kernel_c))
    assert a.fingerprint() == b.fingerprint() != c.fingerprint()


def test_jit_dispatch_overhead(cache_dir, compiler, monkeypatch):
    monkeypatch.setattr(driver.cuda(), "cuLaunchKernelEx", lambda c, f, p, e: (0,))
    k = JITFunction(add_kernel, compiler)
    compiled = k.compile(("*fp32", "*fp32", "*fp32", "i32"), {"BLOCK": 64})
    args = (FakeCupyArray(0x1000), FakeCupyArray(0x2000), FakeCupyArray(0x3000), 4096)
    run = k[(64,)]
    monkeypatch.setattr(driver, "load_module", lambda kind, data: "m")
    monkeypatch.setattr(driver, "get_function", lambda m, name: "f")
    monkeypatch.setattr(driver, "current_context", lambda: 1)
    monkeypatch.setattr(driver, "primary_context", lambda device: 1)
    monkeypatch.setattr(driver, "device_properties", lambda device: driver.DeviceProperties(
        device, "fake", (9, 0), 132, 232448, 233472, 1024, 32))
    for _ in range(100):
        run(*args, BLOCK=64)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(20000):
            run(*args, BLOCK=64)
        best = min(best, (time.perf_counter() - start) / 20000 * 1e6)
    print(f"\ncached JIT dispatch + launch of a 4-argument kernel with one constexpr, "
          f"driver stubbed: {best:.2f} us")
    assert compiled is not None and best < 40  # generous: shared CI machines are noisy
