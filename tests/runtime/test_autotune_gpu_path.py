"""runtime/autotune.py off the emulator, and runtime/benchmark.py, with no GPU: the driver's
launches, events and memory calls are fakes, so what is timed, launched and zeroed is
known exactly."""

import json

import numpy as np
import pytest

import weft
from weft.compiler.compiled import CompiledKernel, Param
from weft.runtime import autotune_cache, benchmark, driver
from weft.runtime.jit import JITFunction, constexpr


class CudaArray:
    """CUDA memory at a made-up address, seen through __cuda_array_interface__ only."""

    def __init__(self, address, n=1024):
        self.__cuda_array_interface__ = {"data": (address, False), "typestr": "<f4", "shape": (n,),
                                         "version": 3}

    def __dlpack_device__(self):
        return (2, 0)


def device_add(x, y, out, n, BLOCK: constexpr):
    pass  # compiled by the fake compiler below, never parsed


@pytest.fixture
def fake_gpu(monkeypatch, tmp_path, vadd_ptx):
    """(a JITFunction whose launches go nowhere, the blockDim.x of each launch)."""
    monkeypatch.setenv("WEFT_CACHE_DIR", str(tmp_path / "cache"))
    for name in ("WEFT_NO_CACHE", "WEFT_EMULATE", "WEFT_AUTOTUNE_QUIET"):
        monkeypatch.delenv(name, raising=False)
    launches = []
    monkeypatch.setattr(driver.cuda(), "cuLaunchKernelEx",
                        lambda config, f, params, extra: launches.append(config.blockDimX) or (0,))
    monkeypatch.setattr(driver, "load_module", lambda kind, data: ("module", kind))
    monkeypatch.setattr(driver, "get_function", lambda module, name: f"function {name}")
    monkeypatch.setattr(driver, "current_context", lambda: 1)
    monkeypatch.setattr(driver, "primary_context", lambda device: 1)
    monkeypatch.setattr(driver, "current_device", lambda: 0)
    monkeypatch.setattr(driver, "device_properties", lambda device: driver.DeviceProperties(
        device, "Fake H100", (9, 0), 132, 232448, 233472, 1024, 32))

    def compile_fn(jit_fn, signature, constexprs, specialization, options):
        params = tuple(Param(n, t) for n, t in signature.items())
        return CompiledKernel("vadd", params, options["num_warps"], 0, {"ptx": vadd_ptx}, {})
    return JITFunction(device_add, compile_fn), launches


def test_off_the_emulator_the_cuda_event_bench_times_and_the_device_keys_the_entry(fake_gpu, monkeypatch, tmp_path):
    kernel, launches = fake_gpu
    calls = []

    def fake_do_bench(kernel_call, warmup, rep, quantiles):
        calls.append((kernel_call.config.num_warps, warmup, rep, quantiles))
        kernel_call()
        return [{4: 2.0, 8: 1.0}[kernel_call.config.num_warps]] * 3
    monkeypatch.setattr(benchmark, "do_bench", fake_do_bench)
    configs = [weft.Config({"BLOCK": 128}, num_warps=4), weft.Config({"BLOCK": 256}, num_warps=8)]
    tuner = weft.autotune(configs, key=["n"], warmup=5, rep=20)(kernel)
    x = CudaArray(0x10000)
    tuner[lambda meta: (meta["n"] // meta["BLOCK"],)](x, x, x, 1024)
    assert calls == [(4, 5, 20, (0.5, 0.2, 0.8)), (8, 5, 20, (0.5, 0.2, 0.8))]
    assert launches == [128, 256, 256]  # two timed calls, then the launch with 8 warps
    (entry,) = (tmp_path / "cache" / autotune_cache.FOLDER).glob("*.json")
    document = json.loads(entry.read_text())
    assert document["device"] == "Fake H100 sm_90" and len(document["configs"]) == 2
    monkeypatch.setattr(driver, "device_properties", lambda device: driver.DeviceProperties(
        device, "Fake H200", (9, 0), 132, 232448, 233472, 1024, 32))
    weft.autotune(configs, key=["n"], warmup=5, rep=20)(kernel)[(4,)](x, x, x, 1024)
    assert len(calls) == 4  # another device: timed again


def test_cuda_arrays_are_zeroed_and_restored_through_the_driver(monkeypatch):
    log = []
    monkeypatch.setattr(driver, "memset_d8_async", lambda address, n, stream: log.append(("zero", address, n)))
    monkeypatch.setattr(driver, "allocate", lambda n: log.append(("allocate", n)) or 0x9000)
    monkeypatch.setattr(driver, "copy_device_to_device_async",
                        lambda dst, src, n, stream: log.append(("copy", dst, src, n)))
    monkeypatch.setattr(driver, "free", lambda address: log.append(("free", address)))
    monkeypatch.setattr(driver, "synchronize", lambda: None)
    array = CudaArray(0x4000, n=10)
    benchmark.zero(array)
    restore = benchmark.snapshot(array)
    restore()
    restore.release()
    assert log == [("zero", 0x4000, 40), ("allocate", 40), ("copy", 0x9000, 0x4000, 40),
                   ("copy", 0x4000, 0x9000, 40), ("free", 0x9000)]


def test_do_bench_sizes_its_runs_from_an_estimate_and_flushes_l2_before_each_timed_call(monkeypatch):
    clock, log = [0.0], []

    class Event:
        at = None
    monkeypatch.setattr(driver, "create_event", Event)
    monkeypatch.setattr(driver, "record_event", lambda event, stream: setattr(event, "at", clock[0]))
    monkeypatch.setattr(driver, "elapsed_ms", lambda start, end: end.at - start.at)
    monkeypatch.setattr(driver, "destroy_event", lambda event: None)
    monkeypatch.setattr(driver, "synchronize", lambda: None)
    monkeypatch.setattr(driver, "allocate", lambda n: 0x1000)
    monkeypatch.setattr(driver, "memset_d32_async", lambda address, words, stream: log.append("flush"))
    monkeypatch.setattr(benchmark, "_flush_buffer", None)
    # 1 first call + 5 for the estimate + 10 / 2 ms warm-up calls take 2 ms each; the
    # 20 / 2 ms timed calls take 1, 2, ..., 10 ms.
    durations = iter([2.0] * 11 + [float(t) for t in range(1, 11)])

    def call():
        log.append("call")
        clock[0] += next(durations)
    assert benchmark.do_bench(call, warmup=10, rep=20, quantiles=(0.5, 0.2)) == \
        pytest.approx([5.5, float(np.quantile(np.arange(1, 11), 0.2))])
    assert log.count("call") == 21 and log[-20:] == ["flush", "call"] * 10
    with pytest.raises(StopIteration):
        call()  # every duration was used: no call more, no call fewer
    with pytest.raises(ValueError, match="return_mode"):
        benchmark.do_bench(call, return_mode="average")
