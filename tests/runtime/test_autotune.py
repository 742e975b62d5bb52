"""runtime/autotune.py: weft.autotune / weft.Config / weft.heuristics on both languages.

Kernels run on the CPU emulator (numpy arrays); timing comes from an injected do_bench
that gives each config a fixed time and runs the kernel as the real one would, so which
config wins, what is timed and what is cached are known in advance."""

import numpy as np
import pytest

import weft
from weft import highlevel as tl
from weft import lowlevel as ll
from weft.runtime import autotune_cache
from weft.runtime.arguments import LaunchError
from weft.runtime.autotune import AutotuneError, Autotuner

RNG = np.random.default_rng(39)


@ll.jit
def scaled_add(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: ll.constexpr):
    ll.static_assert(BLOCK <= 512, "BLOCK must be at most 512")
    layout: ll.constexpr = ll.BlockedLayout([BLOCK // 128], [32], [4], [0])
    offsets = ll.program_id(0) * BLOCK + ll.arange(0, BLOCK, layout=layout)
    mask = offsets < n
    x = ll.load(x_ptr + offsets, mask=mask)
    y = ll.load(y_ptr + offsets, mask=mask)
    ll.store(out_ptr + offsets, alpha * x + y, mask=mask)


@ll.jit
def accumulate(x_ptr, out_ptr, n, BLOCK: ll.constexpr):
    """out += x through atomics: repeated launches pile up unless out is reset."""
    layout: ll.constexpr = ll.BlockedLayout([BLOCK // 128], [32], [4], [0])
    offsets = ll.program_id(0) * BLOCK + ll.arange(0, BLOCK, layout=layout)
    mask = offsets < n
    ll.atomic_add(out_ptr + offsets, ll.load(x_ptr + offsets, mask=mask), mask=mask)


@ll.jit
def increment(x_ptr, n, BLOCK: ll.constexpr):
    """x += 1 in place: repeated launches pile up unless x is restored."""
    layout: ll.constexpr = ll.BlockedLayout([BLOCK // 128], [32], [4], [0])
    offsets = ll.program_id(0) * BLOCK + ll.arange(0, BLOCK, layout=layout)
    mask = offsets < n
    ll.store(x_ptr + offsets, ll.load(x_ptr + offsets, mask=mask) + 1.0, mask=mask)


def grid(meta):
    return (-(-meta["n"] // meta["BLOCK"]),)


CONFIGS = [weft.Config({"BLOCK": b}) for b in (128, 256, 512)]
MS = {128: 3.0, 256: 1.0, 512: 2.0}  # made-up milliseconds per BLOCK


class FakeBench:
    """A do_bench that runs the kernel `calls` times and reports MS[BLOCK] (plus a constant
    per key argument `n`, so keys can disagree on the winner), recording what it timed."""

    def __init__(self, ms=None, calls=1, prefer_small_above=None):
        self.ms, self.calls, self.prefer_small_above = ms or MS, calls, prefer_small_above
        self.timed = []

    def __call__(self, kernel_call, quantiles):
        assert quantiles == (0.5, 0.2, 0.8)
        for _ in range(self.calls):
            kernel_call()
        config = kernel_call.config
        self.timed.append(config)
        ms = self.ms[config.kwargs["BLOCK"]]
        return [ms, ms * 0.9, ms * 1.1]


@pytest.fixture(autouse=True)
def empty_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("WEFT_CACHE_DIR", str(tmp_path / "cache"))
    for name in ("WEFT_NO_CACHE", "WEFT_EMULATE", "WEFT_AUTOTUNE_QUIET"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "cache"


def vectors(n, dtype=np.float32):
    return RNG.standard_normal(n).astype(dtype), RNG.standard_normal(n).astype(dtype)


def tuned(kernel=scaled_add, configs=CONFIGS, key=("n",), bench=None, **options):
    return weft.autotune(configs=list(configs), key=list(key), do_bench=bench, **options)(kernel)


def launch_scaled_add(tuner, n, dtype=np.float32):
    x, y = vectors(n, dtype)
    out = np.zeros_like(x)
    tuner[grid](x, y, out, n, 1.5)
    np.testing.assert_allclose(out.astype(np.float64), 1.5 * x.astype(np.float64) + y, rtol=1e-6, atol=1e-6)


def test_the_fastest_config_is_launched_and_the_result_is_right():
    bench = FakeBench()
    tuner = tuned(bench=bench)
    launch_scaled_add(tuner, 700)
    assert tuner.best_config == weft.Config({"BLOCK": 256})
    assert bench.timed == CONFIGS
    (timings,) = tuner.timings.values()
    assert timings[weft.Config({"BLOCK": 128})] == pytest.approx((3.0, 2.7, 3.3))


def test_key_values_and_array_types_select_cache_entries():
    bench = FakeBench()
    tuner = tuned(bench=bench)
    launch_scaled_add(tuner, 700)
    launch_scaled_add(tuner, 700)  # same key: nothing timed
    assert len(bench.timed) == 3
    launch_scaled_add(tuner, 900)  # a new n
    assert len(bench.timed) == 6
    launch_scaled_add(tuner, 900, np.float64)  # a new element type
    assert len(bench.timed) == 9
    assert sorted(key[0] for key in tuner.cache) == [(700,), (900,), (900,)]


def test_a_second_process_reads_the_timings_from_disk(empty_cache):
    bench = FakeBench()
    launch_scaled_add(tuned(bench=bench), 700)
    assert len(bench.timed) == 3
    assert len(list((empty_cache / autotune_cache.FOLDER).glob("*.json"))) == 1
    fresh = tuned(bench=bench)  # a new Autotuner: nothing in memory, as in a new process
    launch_scaled_add(fresh, 700)
    assert len(bench.timed) == 3
    assert fresh.best_config == weft.Config({"BLOCK": 256})


def test_an_unreadable_entry_is_timed_again_and_rewritten(empty_cache):
    bench = FakeBench()
    launch_scaled_add(tuned(bench=bench), 700)
    (entry,) = (empty_cache / autotune_cache.FOLDER).glob("*.json")
    document = entry.read_text()
    entry.write_text(document[: len(document) // 2])  # a torn file
    launch_scaled_add(tuned(bench=bench), 700)
    assert len(bench.timed) == 6 and entry.read_text() == document
    entry.write_text(document.replace('"timing"', '"timeing"'))  # records of no known form
    launch_scaled_add(tuned(bench=bench), 700)
    assert len(bench.timed) == 9 and entry.read_text() == document


def test_without_the_disk_cache_a_second_process_times_again(monkeypatch):
    monkeypatch.setenv("WEFT_NO_CACHE", "1")
    bench = FakeBench()
    launch_scaled_add(tuned(bench=bench), 700)
    launch_scaled_add(tuned(bench=bench), 700)
    assert len(bench.timed) == 6


def test_a_config_added_later_is_the_only_one_timed():
    bench = FakeBench(ms={**MS, 512: 0.5})
    launch_scaled_add(tuned(configs=CONFIGS[:2], bench=bench), 700)
    assert bench.timed == CONFIGS[:2]
    grown = tuned(configs=CONFIGS, bench=bench)
    launch_scaled_add(grown, 700)
    assert bench.timed == CONFIGS[:2] + [CONFIGS[2]]
    assert grown.best_config == CONFIGS[2]
    shrunk = tuned(configs=CONFIGS[:2], bench=bench)  # the best among the configs listed now
    launch_scaled_add(shrunk, 700)
    assert shrunk.best_config == CONFIGS[1] and len(bench.timed) == 3


def test_early_config_prune_then_perf_model_and_top_k_narrow_what_is_timed():
    bench = FakeBench()
    seen = {}

    def early(configs, named_args, **kwargs):
        seen["n"] = named_args["n"]
        return [c for c in configs if c.kwargs["BLOCK"] != 256]

    def model(**args):
        assert args["n"] == 700 and args["num_warps"] == 4
        return -args["BLOCK"]  # estimates favour big blocks

    tuner = tuned(bench=bench, prune_configs_by={"early_config_prune": early, "perf_model": model, "top_k": 1})
    launch_scaled_add(tuner, 700)
    assert seen == {"n": 700}
    assert bench.timed == [CONFIGS[2]]
    assert tuner.best_config == CONFIGS[2]
    halved = tuned(bench=FakeBench(), prune_configs_by={"perf_model": lambda **a: a["BLOCK"], "top_k": 0.67})
    launch_scaled_add(halved, 700)
    assert halved.best_config == CONFIGS[1]  # 128 and 256 kept (2 of 3), 256 faster


def test_on_the_emulator_without_do_bench_the_first_config_after_pruning_runs(empty_cache):
    tuner = tuned(prune_configs_by={"perf_model": lambda **a: -a["BLOCK"], "top_k": 2})
    launch_scaled_add(tuner, 700)
    assert tuner.best_config == CONFIGS[2]
    assert tuner.timings == {}
    assert not (empty_cache / autotune_cache.FOLDER).exists()


def test_a_single_config_is_launched_without_timing():
    bench = FakeBench()
    tuner = tuned(configs=CONFIGS[:1], bench=bench)
    launch_scaled_add(tuner, 300)
    assert bench.timed == [] and tuner.best_config == CONFIGS[0]


@pytest.mark.parametrize("reset", [True, False])
def test_reset_to_zero_clears_an_accumulator_before_every_timed_run_and_the_launch(reset):
    x = RNG.standard_normal(600).astype(np.float32)
    out = np.zeros_like(x)
    tuner = tuned(accumulate, bench=FakeBench(calls=2), reset_to_zero=["out_ptr"] if reset else None)
    tuner[grid](x, out, 600)
    # 3 configs timed twice each, then the launch: 7 accumulations, or 1 after resets.
    np.testing.assert_allclose(out, x * (1 if reset else 7), rtol=1e-5)


@pytest.mark.parametrize("restore", [True, False])
def test_restore_value_gives_the_launch_the_callers_values(restore):
    start = RNG.standard_normal(600).astype(np.float32)
    x = start.copy()
    tuner = tuned(increment, bench=FakeBench(calls=2), restore_value=["x_ptr"] if restore else None)
    tuner[grid](x, 600)
    np.testing.assert_allclose(x, start + (1 if restore else 7), rtol=1e-6)


@ll.jit
def shifted_copy(x_ptr, out_ptr, n, BLOCK: ll.constexpr, EVEN: ll.constexpr, SHIFT: ll.constexpr):
    layout: ll.constexpr = ll.BlockedLayout([BLOCK // 128], [32], [4], [0])
    offsets = ll.program_id(0) * BLOCK + ll.arange(0, BLOCK, layout=layout)
    if EVEN:
        ll.store(out_ptr + offsets, ll.load(x_ptr + offsets) + SHIFT)
    else:
        mask = offsets < n
        ll.store(out_ptr + offsets, ll.load(x_ptr + offsets, mask=mask) + SHIFT, mask=mask)


@pytest.mark.parametrize("n", [512, 700])
def test_heuristics_see_the_arguments_and_the_config(n):
    seen = []

    def even(args):
        seen.append((args["n"], args["BLOCK"]))
        return args["n"] % args["BLOCK"] == 0

    kernel = weft.autotune(configs=CONFIGS[:2], key=["n"], do_bench=FakeBench())(
        weft.heuristics({"EVEN": even, "SHIFT": lambda args: float(args["EVEN"]) + 2.0})(shifted_copy))
    x = RNG.standard_normal(n).astype(np.float32)
    out = np.zeros_like(x)
    kernel[grid](x, out, n)
    assert kernel.best_config == CONFIGS[1]
    assert (n, 256) in seen and (n, 128) in seen
    np.testing.assert_allclose(out, x + (3.0 if n % 256 == 0 else 2.0), rtol=1e-6)


@tl.jit
def hl_scale(x_ptr, out_ptr, n, scale, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * scale, mask=mask)


def test_a_highlevel_kernel_tunes_through_the_triton_names():
    triton = tl  # `from weft import highlevel as triton` stands for `import triton`
    bench = FakeBench()
    kernel = triton.autotune(configs=[triton.Config({"BLOCK": b}, num_warps=w) for b, w in ((128, 4), (256, 8))],
                             key=["n"], do_bench=bench)(hl_scale)
    x = RNG.standard_normal(1000).astype(np.float32)
    out = np.zeros_like(x)
    kernel[lambda meta: (triton.cdiv(meta["n"], meta["BLOCK"]),)](x, out, 1000, -0.5)
    assert kernel.best_config == triton.Config({"BLOCK": 256}, num_warps=8)
    np.testing.assert_allclose(out, x.astype(np.float64) * -0.5, rtol=1e-6)


def test_a_config_that_does_not_compile_is_skipped_and_remembered():
    bench = FakeBench(ms={128: 3.0, 256: 2.0, 1024: 0.1})
    configs = [weft.Config({"BLOCK": b}) for b in (128, 256, 1024)]
    tuner = tuned(configs=configs, bench=bench)
    launch_scaled_add(tuner, 700)
    assert tuner.best_config == configs[1]
    (failures,) = tuner.failures.values()
    assert "BLOCK must be at most 512" in failures[configs[2]]
    again = tuned(configs=configs, bench=bench)
    launch_scaled_add(again, 700)  # the failure came from the disk cache too
    assert len(bench.timed) == 2 and again.best_config == configs[1]


def test_when_every_config_fails_one_error_lists_them_at_the_decorator():
    configs = [weft.Config({"BLOCK": b}) for b in (1024, 2048)]
    tuner = weft.autotune(configs=configs, key=["n"], do_bench=FakeBench(ms={1024: 1.0, 2048: 1.0}))(scaled_add)
    with pytest.raises(AutotuneError) as error:
        launch_scaled_add(tuner, 700)
    message = str(error.value)
    assert message.startswith(f"{__file__}:")
    assert "Config(BLOCK: 1024, num_warps: 4, num_stages: 3)" in message
    assert "Config(BLOCK: 2048, num_warps: 4, num_stages: 3)" in message
    assert message.count("static_assert failed: BLOCK must be at most 512") == 2


def test_the_progress_line_and_its_quiet_switch(capsys, monkeypatch):
    launch_scaled_add(tuned(bench=FakeBench()), 700)
    line = capsys.readouterr().err
    assert "weft.autotune: scaled_add key=(700,): best (BLOCK: 256, num_warps: 4, num_stages: 3) 1 ms" in line
    assert "of 3 configs 3 timed" in line
    monkeypatch.setenv("WEFT_AUTOTUNE_QUIET", "1")
    launch_scaled_add(tuned(bench=FakeBench()), 900)
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("decorate, words", [
    (lambda: weft.autotune(CONFIGS, key=["m"]), ["key names 'm'", "not a parameter", "x_ptr, y_ptr"]),
    (lambda: weft.autotune(CONFIGS, key="n"), ["key must be a list of parameter names", "key=['n']"]),
    (lambda: weft.autotune([weft.Config({"BLOK": 128})], key=["n"]),
     ["'BLOK'", "not a constexpr parameter", "BLOCK"]),
    (lambda: weft.autotune([weft.Config({"alpha": 2.0})], key=["n"]),
     ["'alpha', a runtime parameter", "annotate it `alpha: constexpr`"]),
    (lambda: weft.autotune(CONFIGS, key=["BLOCK"]), ["which the configs set"]),
    (lambda: weft.autotune(CONFIGS, key=["n"], reset_to_zero=["BLOCK"]),
     ["reset_to_zero names 'BLOCK'", "runtime (pointer) parameter"]),
    (lambda: weft.autotune(CONFIGS, key=["n"], restore_value=["z"]), ["restore_value names 'z'"]),
    (lambda: weft.autotune(CONFIGS, key=["n"], prune_configs_by={"top_n": 2}), ["top_n", "top_k"]),
    (lambda: weft.autotune(CONFIGS, key=["n"], prune_configs_by={"top_k": 0}), ["top_k=0"]),
    (lambda: weft.autotune([], key=["n"]), ["at least one Config"]),
    (lambda: weft.heuristics({"EVN": lambda a: True}), ["@heuristics names 'EVN'"]),
])
def test_decorators_written_wrong_say_what_to_change(decorate, words):
    with pytest.raises(AutotuneError) as error:
        decorate()(scaled_add)
    assert str(error.value).startswith(f"{__file__}:")
    for word in words:
        assert word in str(error.value)


def test_launch_mistakes_say_what_to_change():
    with pytest.raises(AutotuneError, match=r"got \['BLOCK'\] at the launch"):
        tuned(bench=FakeBench())[grid](*vectors(10), np.zeros(10, np.float32), 10, 1.0, BLOCK=128)
    with pytest.raises(AutotuneError, match=r"got \['num_warps'\] at the launch"):
        tuned(bench=FakeBench())[grid](*vectors(10), np.zeros(10, np.float32), 10, 1.0, num_warps=8)
    with pytest.raises(LaunchError, match=r"has no parameters \['nn'\]"):
        tuned(bench=FakeBench())[grid](*vectors(10), np.zeros(10, np.float32), 10, 1.0, nn=3)
    with pytest.raises(LaunchError, match=r"missing arguments \['alpha'\]"):
        tuned(bench=FakeBench())[grid](*vectors(10), np.zeros(10, np.float32), 10)
    with pytest.raises(AutotuneError, match="put @jit"):
        weft.autotune(CONFIGS, key=["n"])(lambda x: x)
    with pytest.raises(ValueError, match=r"cluster=\(2, 1, 1\)"):
        weft.Config({"BLOCK": 128}, num_ctas=2)


def test_the_names_exist_in_both_languages():
    assert ll.autotune is tl.autotune is weft.autotune
    assert ll.Config is tl.Config is weft.Config
    assert ll.heuristics is tl.heuristics is weft.heuristics
    assert isinstance(tuned(), Autotuner)


@pytest.mark.gpu
def test_gpu_timing_picks_a_config_and_a_second_tuner_reads_the_disk(capsys):
    torch = pytest.importorskip("torch")
    n = 1 << 22
    x, y = (torch.randn(n, device="cuda") for _ in range(2))
    out = torch.zeros_like(x)
    out[:] = 1.0
    configs = [weft.Config({"BLOCK": b}) for b in (128, 256, 512)]
    tuner = weft.autotune(configs=configs, key=["n"], warmup=5, rep=20, reset_to_zero=["out_ptr"])(scaled_add)
    tuner[grid](x, y, out, n, 2.0)
    torch.cuda.synchronize()
    torch.testing.assert_close(out, 2.0 * x + y)
    (timings,) = tuner.timings.values()
    assert set(timings) == set(configs) and all(0 < t[0] < 100 for t in timings.values())
    assert "3 timed" in capsys.readouterr().err
    again = weft.autotune(configs=configs, key=["n"], warmup=5, rep=20)(scaled_add)
    again[grid](x, y, out, n, 2.0)
    assert again.best_config == tuner.best_config
    assert "0 timed" in capsys.readouterr().err
