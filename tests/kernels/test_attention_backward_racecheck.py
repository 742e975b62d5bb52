"""The attention backward's handoffs are clean as compute-sanitizer's racecheck sees them:
on the emulator with WEFT_EMULATE_RACECHECK (runtime/emulator/racecheck.py), which reports an
ordinary shared-memory access ordered before another partition's only through a named
barrier and one thread's mbarrier arrive. The keys split's defaults stage L and delta in the
Q/dO ring (the producer's stores, the consumers' loads) and at head_dim 256 hand P^T from
one consumer to the other in shared memory: each releases with an arrival from every thread.
The columns split's pipelined walk stands for the layout whose shared scores only wgmma
reads. Gradients are checked against float64 numpy as well."""

import pytest

from weft.compiler import config
from weft.kernels.attention.backward_host import columns_split_config, keys_split_config

from .test_attention_backward import _check, _inputs


@pytest.mark.parametrize("head_dim, make_config, causal, seq_q, seq_k", [
    (128, lambda: keys_split_config(128), True, 100, 200),  # two slots of stats, two bands of keys
    (64, lambda: keys_split_config(64), False, 100, 200),   # 128 query rows a step
    # one band, P^T handed between its two consumers: one slot (dQ by TMA), or two, where
    # only P^T's own release orders its reads before the next step's store
    (256, lambda: keys_split_config(256), True, 100, 130),
    (256, lambda: keys_split_config(256, "atomics"), False, 100, 70),
    (128, lambda: columns_split_config(128, pipelined=True), True, 100, 200),
], ids=["keys-d128", "keys-d64", "keys-d256", "keys-d256-atomics", "columns-d128-pipelined"])
def test_backward_is_racecheck_clean(monkeypatch, head_dim, make_config, causal, seq_q, seq_k):
    monkeypatch.setenv("WEFT_EMULATE_RACECHECK", "1")
    assert config.current().emulate_racecheck
    # GQA (the ring's slots reused across the group's heads), tails of both block sizes
    _check(*_inputs(1, 2, 1, seq_q, seq_k, head_dim, "bhsd", seed=41), causal, layout="bhsd", config=make_config())
