"""The prepared-launch fast path of flash_attention and matmul (kernels/_launch.py
PreparedCall): a call whose signature matches a recent one repeats that launch on new
outputs. Without a GPU the GPU host path runs under fake_gpu.fake_gpu (CPU
torch tensors seen as device 0, the driver stubbed and recording), and every fast launch
is checked byte for byte against the launch the long way makes for the same inputs."""

import contextlib
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from .fake_gpu import fake_gpu  # noqa: E402
from weft.kernels import _launch  # noqa: E402
from weft.kernels.attention import flash_attention, host as attention_host  # noqa: E402
from weft.kernels.attention import reference_attention  # noqa: E402
from weft.kernels.attention import PingpongConfig, SimpleConfig  # noqa: E402
from weft.kernels.matmul import host as matmul_host, matmul  # noqa: E402
from weft.kernels.matmul.config import Config as MatmulConfig  # noqa: E402
from weft.runtime import tensor_descriptor  # noqa: E402

BF16, FP16 = torch.bfloat16, torch.float16
MATMUL_CONFIG = MatmulConfig(block_k=64, stages=3)  # the autotuner needs CUDA events


def _qkv(b=1, h=2, hk=1, s=96, sk=None, d=64, dtype=BF16, layout="bhsd", seed=0):
    g = torch.Generator().manual_seed(seed)
    sk = s if sk is None else sk

    def make(heads, seq):
        shape = (b, heads, seq, d) if layout == "bhsd" else (b, seq, heads, d)
        return torch.randn(shape, generator=g).to(dtype)
    return make(h, s), make(hk, sk), make(hk, sk)


@contextlib.contextmanager
def _long_way_only():
    """Every call takes the long way and keeps nothing (the reference launch)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(attention_host, "prepared_call", lambda key: None)
        patch.setattr(attention_host, "keep_prepared_call", lambda key, call: None)
        patch.setattr(matmul_host, "prepared_call", lambda key: None)
        patch.setattr(matmul_host, "keep_prepared_call", lambda key, call: None)
        yield


def _normalized(fake, launch, outputs):
    """A recorded launch with every output's address written as a name: the launches of
    two calls on the same inputs are then equal exactly when they launch the same work."""
    names = {int(t.data_ptr()): f"<output {i}>".encode().ljust(8) for i, t in enumerate(outputs)}
    # A map with its address patched in place (the fake keeps the address apart from the
    # digest of the other fields in that mode) is the encoding at the patched address.
    by_tail = {raw[8:]: fields for raw, fields in fake.maps.items()} if fake.address_in_place else {}
    params = []
    for raw in launch["params"]:
        fields = fake.maps.get(raw)
        if fields is None and len(raw) == 128 and raw[8:] in by_tail:
            fields = by_tail[raw[8:]]
            fields = (*fields[:2], int.from_bytes(raw[:8], "little"), *fields[3:])
        if fields is not None:  # a tensor map: the fields it was encoded from
            params.append(tuple(names.get(f, f) for f in fields))
            continue
        words = [raw[i:i + 8] for i in range(0, len(raw), 8)]
        params.append(b"".join(names.get(int.from_bytes(w, "little"), w) if len(w) == 8 else w for w in words))
    return dict(launch, params=params)


def _attention_outputs(result, return_lse):
    return result if return_lse else (result,)


class _Calls:
    """Counts the calls that went the long way (built a kernel call)."""

    def __init__(self, patch, module):
        self.count = 0
        original = module._kernel_call

        def counted(*args, **kwargs):
            self.count += 1
            return original(*args, **kwargs)
        patch.setattr(module, "_kernel_call", counted)


def _check_attention_sequence(fake, calls):
    """Run `calls` (q, k, v, kwargs) twice in order: the second time each repeats a
    prepared launch, which must equal the long way's launch for the same inputs."""
    with pytest.MonkeyPatch.context() as patch:
        long_way = _Calls(patch, attention_host)
        for round_ in range(2):
            for q, k, v, kwargs in calls:
                before = long_way.count
                memsets = len(fake.memsets)
                result = flash_attention(q, k, v, **kwargs)
                fast = fake.launches[-1]
                outs = _attention_outputs(result, kwargs.get("return_lse", False))
                if round_ == 1:
                    assert long_way.count == before, f"not repeated: {kwargs}"
                    counter = fake.memsets[memsets:]
                else:
                    counter = []
                with _long_way_only():
                    reference = flash_attention(q, k, v, **kwargs)
                slow = fake.launches[-1]
                ref_outs = _attention_outputs(reference, kwargs.get("return_lse", False))
                assert [tuple(o.shape) for o in outs] == [tuple(o.shape) for o in ref_outs]
                assert [o.dtype for o in outs] == [o.dtype for o in ref_outs]
                a, b = _normalized(fake, fast, outs), _normalized(fake, slow, ref_outs)
                counter_index = _param_index(fake, fast, "counter_ptr")
                if counter_index is not None:
                    if counter:  # zeroed on the launch stream before the launch
                        assert counter == [(int.from_bytes(fast["params"][counter_index], "little"), 0, 1,
                                            fast["stream"])]
                    a["params"][counter_index] = b["params"][counter_index] = b"counter"
                if not kwargs.get("return_lse"):  # an lse the caller never sees
                    lse_index = _param_index(fake, fast, "lse_ptr")
                    a["params"][lse_index] = b["params"][lse_index] = b"lse"
                assert a == b, kwargs
    assert len(_launch._CALLS.entries) <= _launch.PREPARED_CALLS


def _param_index(fake, launch, name):
    names = fake.param_names[launch["function"]]
    return names.index(name) if name in names else None


def test_attention_repeats_the_long_ways_launch_when_any_fact_changes():
    """Pointer, shape, stride, dtype, causal, scale, config, layout and return_lse each
    change the launch; each call, repeated, must launch what the long way launches."""
    q, k, v = _qkv()
    q2, k2, v2 = _qkv(seed=1)  # same shapes, new addresses
    wide = _qkv(h=4, hk=2)  # q/k/v as views of every other head: new strides
    qs, ks, vs = (x[:, ::2] for x in wide)
    simple = SimpleConfig(head_dim=64, block_n=64)
    calls = [
        (q, k, v, {}),
        (q2, k2, v2, {}),
        (*_qkv(s=160, sk=130), {}),
        (qs, ks, vs, {}),
        (*_qkv(dtype=FP16), {}),
        (q, k, v, dict(causal=True)),
        (q, k, v, dict(softmax_scale=0.3)),
        (q, k, v, dict(softmax_scale=0.7, return_lse=True)),
        (q, k, v, dict(config=simple)),
        (*_qkv(layout="bshd"), dict(layout="bshd")),
    ]
    with fake_gpu() as fake:
        _check_attention_sequence(fake, calls)


def test_output_descriptors_are_encoded_again_where_the_address_cannot_be_patched():
    """A driver whose tensor map does not hold the address as is: the probe says so and
    each call encodes O's map for its new address."""
    q, k, v = _qkv()
    with fake_gpu(address_in_place=False) as fake:
        assert tensor_descriptor.address_field() is None
        _check_attention_sequence(fake, [(q, k, v, {}), (q, k, v, dict(causal=True))])
    with fake_gpu(address_in_place=True):
        assert tensor_descriptor.address_field() == 0


def test_matmul_repeats_the_long_ways_launch():
    a = torch.randn(80, 64).to(BF16)
    b = torch.randn(64, 72).to(BF16)
    bt = torch.randn(72, 64).to(BF16).T  # K-major b
    with fake_gpu() as fake, pytest.MonkeyPatch.context() as patch:
        long_way = _Calls(patch, matmul_host)
        fp32_out = dict(out_dtype=torch.float32, config=MatmulConfig(block_k=64, stages=2))
        calls = [(a, b, {}), (a, bt, {}), (a, b, fp32_out), (a[:40], b, {})]
        for round_ in range(2):
            for x, y, kwargs in calls:
                before = long_way.count
                kwargs = dict(dict(config=MATMUL_CONFIG), **kwargs)
                c = matmul(x, y, **kwargs)
                fast = fake.launches[-1]
                assert long_way.count == before + (1 - round_)
                with _long_way_only():
                    ref = matmul(x, y, **kwargs)
                assert (c.shape, c.stride(), c.dtype) == (ref.shape, ref.stride(), ref.dtype)
                assert _normalized(fake, fast, (c,)) == _normalized(fake, fake.launches[-1], (ref,))


def test_signature_names_every_fact_of_the_launch(monkeypatch):
    q, k, v = _qkv()
    with fake_gpu():
        key = attention_host._call_signature
        base = key(q, k, v, False, None, False, "bhsd", None)
        assert base is not None and base == key(q[:], k, v, False, None, False, "bhsd", None)  # same facts
        other = _qkv(seed=1)
        changed = [
            key(other[0], k, v, False, None, False, "bhsd", None),  # address
            key(q[:, :, :64], k, v, False, None, False, "bhsd", None),  # shape
            key(q.transpose(1, 2).contiguous().transpose(1, 2), k, v, False, None, False, "bhsd", None),  # stride
            key(q.to(FP16), k, v, False, None, False, "bhsd", None),  # dtype
            key(q, k, v, True, None, False, "bhsd", None),
            key(q, k, v, False, 0.5, False, "bhsd", None),
            key(q, k, v, False, None, True, "bhsd", None),
            key(q, k, v, False, None, False, "bshd", None),
            key(q, k, v, False, None, False, "bhsd", PingpongConfig(head_dim=64)),
        ]
        assert None not in changed and len({base, *changed}) == len(changed) + 1
        monkeypatch.setenv("WEFT_EMULATE", "1")
        assert key(q, k, v, False, None, False, "bhsd", None) != base
        monkeypatch.delenv("WEFT_EMULATE")
        _launch._STREAM[0] = lambda device: 0x55  # another current torch stream
        assert key(q, k, v, False, None, False, "bhsd", None) != base
        # A scale whose value could change in place is never part of a signature.
        assert key(q, k, v, False, torch.tensor(0.5), False, "bhsd", None) is None
        assert matmul_host._call_signature(q[0, 0], k[0, 0].T, None, None) is not None
        assert matmul_host._call_signature(q[0, 0], k[0, 0].T, None, None) != \
            matmul_host._call_signature(q[0, 0], k[0, 0].T, torch.float32, None)
    # Off the (stubbed) GPU: CPU tensors and numpy arrays always take the long way.
    assert attention_host._call_signature(q, k, v, False, None, False, "bhsd", None) is None
    assert attention_host._call_signature(*(x.float().numpy() for x in (q, k, v)), False, None, False,
                                          "bhsd", None) is None


def test_the_cache_is_bounded_and_least_recently_used_goes_first():
    _launch.clear_prepared_calls()
    for i in range(_launch.PREPARED_CALLS + 3):
        _launch.keep_prepared_call(i, f"call {i}")
    assert _launch.prepared_call(3) == "call 3"  # now the most recent
    _launch.keep_prepared_call("new", "call new")
    entries = _launch._CALLS.entries
    assert len(entries) == _launch.PREPARED_CALLS and 3 in entries and 4 not in entries
    _launch.clear_prepared_calls()


@pytest.mark.parametrize("causal", [False, True])
def test_emulator_results_stay_right_as_inputs_change(causal):
    """The emulator path (CPU tensors) keeps nothing between calls: right answers as the
    inputs change under it."""
    calls = [_qkv(s=70, sk=90), _qkv(s=70, sk=90, seed=2), _qkv(h=2, hk=2, s=40, sk=40)]
    for q, k, v in calls:
        out = flash_attention(q, k, v, causal=causal)
        ref = reference_attention(q, k, v, causal=causal)
        assert np.abs(out.float().numpy() - ref).max() < 2e-2
    assert not _launch._CALLS.entries
    a, b = torch.randn(40, 64).to(BF16), torch.randn(64, 24).to(BF16)
    for x in (a, a[:17], a * 2):
        c = matmul(x, b)
        assert np.allclose(c.float().numpy(), matmul_host.reference_matmul(x, b), rtol=2e-2, atol=2e-2)


# ----------------------------------------------------------------------------- on a GPU

def _close(out, ref, tol=2e-2):
    out, ref = out.float(), ref.float()
    return float((out - ref).abs().max() / max(ref.abs().max().item(), 1e-6)) < tol


@pytest.mark.gpu
@pytest.mark.parametrize("b, h, hk, s, sk, d, causal, layout", [
    (2, 8, 8, 1024, 1024, 128, False, "bhsd"),
    (2, 8, 2, 1000, 1100, 128, True, "bhsd"),  # GQA, tails, causal
    (1, 16, 1, 513, 700, 64, False, "bshd"),  # MQA
    (1, 4, 4, 300, 300, 256, True, "bhsd"),
])
def test_gpu_fast_path_matches_the_long_way_and_torch(b, h, hk, s, sk, d, causal, layout):
    def make(heads, seq):
        shape = (b, heads, seq, d) if layout == "bhsd" else (b, seq, heads, d)
        return torch.randn(shape, device="cuda", dtype=BF16)

    def torch_attention(q, k, v):
        if layout == "bshd":
            q, k, v = (x.transpose(1, 2) for x in (q, k, v))
        k, v = (x.repeat_interleave(h // hk, dim=1) for x in (k, v))
        mask = None
        if causal:  # bottom-right aligned, for whatever lengths this call has
            rows, cols = q.shape[2], k.shape[2]
            mask = torch.ones(rows, cols, dtype=torch.bool, device="cuda").tril(cols - rows)
        o = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask)
        return o.transpose(1, 2) if layout == "bshd" else o

    _launch.clear_prepared_calls()
    for _ in range(2):  # new tensors at new addresses, same shapes: the second call is prepared
        q, k, v = make(h, s), make(hk, sk), make(hk, sk)
        first = flash_attention(q, k, v, causal=causal, layout=layout)
        again, lse = flash_attention(q, k, v, causal=causal, layout=layout, return_lse=True)
        third = flash_attention(q, k, v, causal=causal, layout=layout)
        with _long_way_only():
            slow = flash_attention(q, k, v, causal=causal, layout=layout)
        torch.cuda.synchronize()
        assert torch.equal(first, slow) and torch.equal(again, slow) and torch.equal(third, slow)
        assert _close(first, torch_attention(q, k, v))
        assert torch.isfinite(lse).all()
    # Another shape in between, then back: each signature keeps its own launch.
    q2, k2, v2 = make(h, s // 2 + 1), make(hk, sk), make(hk, sk)
    assert _close(flash_attention(q2, k2, v2, causal=causal, layout=layout), torch_attention(q2, k2, v2))
    assert _close(flash_attention(q, k, v, causal=causal, layout=layout), torch_attention(q, k, v))


@pytest.mark.gpu
@pytest.mark.parametrize("m, n, kk", [(4096, 4096, 4096), (64, 11008, 4096), (1000, 1000, 1000)])
@pytest.mark.parametrize("deterministic", [True, False])
def test_gpu_matmul_fast_path_matches_the_long_way_and_torch(m, n, kk, deterministic):
    """Bit for bit under torch's deterministic mode (no split-K); otherwise a split-K
    config (decode, few tiles) adds its parts with atomics in arrival order, so the
    fast and the long way agree to rounding."""
    _launch.clear_prepared_calls()
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(deterministic, warn_only=True)
    try:
        for _ in range(2):
            a = torch.randn(m, kk, device="cuda", dtype=BF16)
            b = torch.randn(kk, n, device="cuda", dtype=BF16)
            first, second = matmul(a, b), matmul(a, b)
            with _long_way_only():
                slow = matmul(a, b)
            torch.cuda.synchronize()
            if deterministic:
                assert torch.equal(first, slow) and torch.equal(second, slow)
            else:
                assert _close(first, slow) and _close(second, slow)
            assert _close(second, a.float() @ b.float())
    finally:
        torch.use_deterministic_algorithms(before)
    assert math.isfinite(float(second.float().sum()))


def test_no_prepared_call_is_kept_during_cuda_graph_capture():
    """A launch holds its first call's tensors; during capture those live in the graph's
    memory pool, so calls under capture take the long way and keep nothing (torch.compile's
    CUDA graph trees refuse pool tensors kept alive)."""
    q, k, v = _qkv()
    a, b = torch.randn(80, 64).to(BF16), torch.randn(64, 72).to(BF16)
    with fake_gpu(), pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.cuda, "is_available", lambda: True)
        patch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
        long_way = _Calls(patch, matmul_host)
        for _ in range(2):
            matmul(a, b, config=MATMUL_CONFIG)
            flash_attention(q, k, v)
        assert long_way.count == 2 and not _launch._CALLS.entries
        patch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
        matmul(a, b, config=MATMUL_CONFIG)
        assert len(_launch._CALLS.entries) == 1


def test_calls_through_the_torch_operators_keep_no_tensors():
    """torch.compile(mode="reduce-overhead") runs a graph's first calls outside capture with
    every allocation in the graph's memory pool, and refuses pool tensors kept alive: calls
    through the weft operators keep no prepared call and no split-K scratch, while the same
    eager calls do."""
    torch_ops = pytest.importorskip("weft.kernels.torch_ops")
    from weft.kernels.matmul.config import configs_for

    q, k, v = _qkv()
    a, b = torch.randn(16, 4096).to(BF16), torch.randn(4096, 64).to(BF16)  # decode, long K: split-K
    config = next(c for c in configs_for(16, 16, 16, 64, 4096, sm_count=132) if c.split_k > 1)
    with fake_gpu(), pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.cuda, "is_available", lambda: True)
        patch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
        _launch.clear_prepared_calls()
        matmul_host._SCRATCH.clear()
        for _ in range(2):
            torch.ops.weft.matmul(a, b, None, torch_ops.config_text(config))
            torch.ops.weft.flash_attention(q, k, v)
        assert not _launch._CALLS.entries and not matmul_host._SCRATCH
        matmul(a, b, config=config)
        flash_attention(q, k, v)
        assert len(_launch._CALLS.entries) == 2 and matmul_host._SCRATCH
