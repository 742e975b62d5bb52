"""The eager host path of matmul and flash_attention stays thin (issue 41): a repeated call
takes the prepared launch, with a bounded number of Python frames between the caller and
the driver's launch, and any change to a fact the launch depends on (pointer, shape,
stride, dtype) misses the cache and launches what the long way launches.

Run under fake_gpu (CPU torch tensors seen as device 0, the driver stubbed and recording),
so no kernel runs: the launches are compared by their recorded arguments. The budget
counts Python frames with cProfile, not wall time, so it holds on a loaded machine."""

import cProfile
import os
import pstats

import pytest

torch = pytest.importorskip("torch")

from .fake_gpu import fake_gpu  # noqa: E402
from .test_host_fast_path import MATMUL_CONFIG, _Calls, _long_way_only, _normalized, _qkv  # noqa: E402
from weft.kernels.attention import flash_attention, host as attention_host  # noqa: E402
from weft.kernels.matmul import host as matmul_host, matmul  # noqa: E402
from weft.runtime import driver  # noqa: E402

BF16, FP16 = torch.bfloat16, torch.float16
_FAKE_FILE = os.path.join("kernels", "fake_gpu.py")

# Python frames per steady-state call, the fake driver's own and this file's left out.
# The plain calls: the wrapper, torch_route (with torch.compiler.is_compiling and
# torch.jit.is_scripting), the host function, its signature (and gpu_signature,
# config.emulate), the cache lookup, the prepared call and the prepared launch; a Config
# passed in adds its dataclass __hash__ twice (the cache lookup and the LRU update). The
# autograd routes add the torch_ops lookup, its wrapper, the Function's forward, the setup
# and torch's ctx.save_for_backward (and mark_non_differentiable for the log-sum-exp).
# The budgets are those counts exactly (the code before the prepared-call rework took
# 18, 20, 33 and 39): a frame more is a regression to look at, or a torch whose
# is_compiling or ctx methods grew one.
BUDGETS = {"matmul": 13, "attention": 11, "matmul autograd": 18, "attention autograd": 17}


WARM_UP, PROFILED = 3, 20


def _weft_frames_per_call(call, calls: int = PROFILED) -> float:
    for _ in range(WARM_UP):
        call()
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(calls):
        call()
    profile.disable()
    stats = pstats.Stats(profile).stats
    here = os.path.abspath(__file__)
    frames = sum(entry[1] for (filename, _, _), entry in stats.items()
                 if filename != "~" and not filename.endswith(_FAKE_FILE) and os.path.abspath(filename) != here)
    return frames / calls


def _cases():
    q, k, v = _qkv(b=1, h=4, hk=4, s=128, d=64)
    a, b = torch.randn(64, 128).to(BF16), torch.randn(128, 96).to(BF16)
    qg, ag = q.clone().requires_grad_(), a.clone().requires_grad_()
    return {
        "matmul": lambda: matmul(a, b, config=MATMUL_CONFIG),
        "attention": lambda: flash_attention(q, k, v, causal=True),
        "matmul autograd": lambda: matmul(ag, b, config=MATMUL_CONFIG),
        "attention autograd": lambda: flash_attention(qg, k, v, causal=True),
    }


@pytest.mark.parametrize("name", sorted(BUDGETS))
def test_a_repeated_call_stays_within_its_frame_budget(name):
    with fake_gpu(record=False) as fake, pytest.MonkeyPatch.context() as patch:
        long_way = _Calls(patch, matmul_host if name.startswith("matmul") else attention_host)
        call = _cases()[name]
        call()
        assert long_way.count == 1
        launches = fake.launch_count
        frames = _weft_frames_per_call(call)
        assert long_way.count == 1, "a repeated call went the long way"
        assert fake.launch_count - launches == WARM_UP + PROFILED  # one launch a call
    assert frames <= BUDGETS[name], f"{name}: {frames} Python frames per call, budget {BUDGETS[name]}"


def _matmul_operands():
    g = torch.Generator().manual_seed(3)

    def randn(*shape):
        return torch.randn(*shape, generator=g).to(BF16)
    a, b = randn(96, 64), randn(64, 80)
    wide = randn(96, 128)
    return [
        ("first", a, b),
        ("new pointer", a.clone(), b),
        ("new pointer of b", a, b.clone()),
        ("new shape", a[:48], b),
        ("new stride", wide[:, :64], b),  # a's shape, rows 128 apart
        ("K-major b", a, b.T.contiguous().T),
        ("new dtype", a.to(FP16), b.to(FP16)),
    ]


def test_matmul_misses_the_cache_on_any_changed_fact_and_launches_what_the_long_way_does():
    """Each operand set once (the long way, kept), then all again (the fast path): every
    fast launch equals the long way's launch for the same inputs, byte for byte but for
    the output's address."""
    operands = _matmul_operands()
    with fake_gpu() as fake, pytest.MonkeyPatch.context() as patch:
        long_way = _Calls(patch, matmul_host)
        for round_ in range(2):
            for what, x, y in operands:
                before = long_way.count
                c = matmul(x, y, config=MATMUL_CONFIG)
                fast = fake.launches[-1]
                assert long_way.count == before + (1 - round_), f"{what}, round {round_}"
                with _long_way_only():
                    ref = matmul(x, y, config=MATMUL_CONFIG)
                assert (c.shape, c.stride(), c.dtype) == (ref.shape, ref.stride(), ref.dtype)
                assert c.data_ptr() != ref.data_ptr()
                assert _normalized(fake, fast, (c,)) == _normalized(fake, fake.launches[-1], (ref,)), what


def test_the_autograd_route_takes_the_fast_path_and_keeps_its_graph():
    """A q that requires grad: the repeated call launches the prepared launch and its
    output still carries the Function's backward node, O and the LSE saved."""
    q, k, v = _qkv(b=1, h=2, hk=1, s=128, d=64)
    q.requires_grad_()
    with fake_gpu() as fake, pytest.MonkeyPatch.context() as patch:
        long_way = _Calls(patch, attention_host)
        outs = [flash_attention(q, k, v, return_lse=True) for _ in range(3)]
        assert long_way.count == 1
        for out, lse in outs:
            assert type(out.grad_fn).__name__ == "_EagerFlashAttentionBackward"
            assert out.requires_grad and not lse.requires_grad
            saved = out.grad_fn.saved_tensors
            assert saved[3].data_ptr() == out.data_ptr() and saved[4].data_ptr() == lse.data_ptr()
        assert len({out.data_ptr() for out, _ in outs}) == 3  # a new O each call
        assert fake.launches[-1]["params"] != fake.launches[-2]["params"]
        with torch.no_grad():  # no gradient: the plain host path, same prepared launch
            assert not flash_attention(q, k, v).requires_grad
        assert long_way.count == 2  # return_lse=False is another signature


def test_a_failed_counter_reset_raises_a_driver_error():
    q, k, v = _qkv(b=1, h=2, hk=2, s=128, d=64)
    with fake_gpu() as fake:
        for _ in range(2):  # the long way (zeroed by torch), then the prepared call
            flash_attention(q, k, v, causal=True)
        assert fake.memsets, "this config resets a tile counter before each launch"
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(type(fake), "memset32", lambda self, *args: (1,))
            with pytest.raises(driver.DriverError, match="cuMemsetD32Async"):
                flash_attention(q, k, v, causal=True)
