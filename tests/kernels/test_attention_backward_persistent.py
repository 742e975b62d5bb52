"""The keys split's persistent walk (BackwardConfig(persistent=True), backward_persistent.py)
on the CPU emulator with race tracking and compute-sanitizer's racecheck rules
(WEFT_EMULATE_RACECHECK): fewer CTAs than tiles, so each CTA walks several tiles of
different lengths (causal), its Q/dO ring running on across them and K/V reloaded after
each; dq, dk and dv against float64 numpy at head_dim 64, 128 and 256, causal and not,
GQA, tails of both block sizes. Its config's errors; its kernel through ptxas without
spills at the default budgets; and (marked gpu) its gradients against float32 torch."""

import dataclasses

import numpy as np
import pytest

from weft.compiler import config as weft_config
from weft.compiler.backend import ptxas
from weft.kernels._launch import EMULATED_CTAS
from weft.kernels.attention import backward_host
from weft.kernels.attention.backward_host import BackwardConfig, keys_split_config

from .test_attention_backward import _check, _inputs
from .test_attention_backward_gpu import GPU_CASES, check_gradients_on_the_gpu
from .test_attention_backward_keys import test_keys_split_assembles_without_spills as assembles_without_spills

needs_ptxas = pytest.mark.skipif(ptxas.find_ptxas() is None, reason="ptxas not found")


def persistent(head_dim, ctas=None, dq_reduce="tma"):
    return dataclasses.replace(keys_split_config(head_dim, dq_reduce), persistent=True, persistent_ctas=ctas)


@pytest.mark.parametrize("batch, heads, kv_heads, seq_q, seq_k, head_dim, causal, ctas, dq_reduce", [
    # GQA; 3 key blocks x 1 head on 2 CTAs: CTA 0 walks key blocks 0 and 2 (5 query blocks,
    # then 1 past the diagonal: the ring's phases run on from the long tile into the short)
    (1, 2, 1, 300, 300, 128, True, 2, "tma"),
    # two batches x two kv heads, 2 key blocks (the last cut at 200): 8 tiles on 3 CTAs
    (2, 2, 2, 100, 200, 128, False, 3, "tma"),
    # head_dim 64 (128 query rows a step), two batches, rows that see no key, cut key block
    (2, 2, 1, 300, 150, 64, True, 3, "tma"),
    (1, 2, 1, 100, 200, 256, True, 2, "tma"),    # head_dim 256: one slot, P^T handed over, 4 tiles of 64 keys
    (1, 3, 1, 70, 140, 256, False, 1, "atomics"),  # MQA, one CTA walks all 3 tiles, dQ by atomics
])
def test_persistent_gradients_match_float64_racecheck_clean(monkeypatch, batch, heads, kv_heads, seq_q, seq_k,
                                                            head_dim, causal, ctas, dq_reduce):
    monkeypatch.setenv("WEFT_EMULATE_RACECHECK", "1")
    assert weft_config.current().emulate_racecheck
    grids = launched_grids(monkeypatch)
    config = persistent(head_dim, ctas, dq_reduce)
    _check(*_inputs(batch, heads, kv_heads, seq_q, seq_k, head_dim, "bhsd", seed=49), causal, layout="bhsd",
           config=config)
    assert grids == [(ctas,)]  # fewer CTAs than tiles: each walks several


def test_persistent_grid_is_the_emulated_wave_capped_by_persistent_ctas_and_the_tiles():
    """persistent_ctas None: the emulator's few CTAs (a GPU's wave); a cap above the tile
    count launches one CTA a tile; not persistent, a CTA a tile."""
    q = np.zeros((1, 1, 64, 128), np.float16)

    def grid(config, key_blocks, heads_of_batches):
        return backward_host._backward_grid(config, None, q, (), {}, key_blocks, heads_of_batches)

    assert grid(persistent(128), 4, 8) == (EMULATED_CTAS,)
    assert grid(persistent(128, ctas=2), 4, 8) == (2,)
    assert grid(persistent(128, ctas=8), 2, 1) == (2,)
    assert grid(dataclasses.replace(keys_split_config(64), persistent=False), 4, 8) == (4, 8)
    assert grid(keys_split_config(128), 4, 8) == (EMULATED_CTAS,)  # the default


def test_persistent_is_refused_outside_the_keys_split():
    with pytest.raises(ValueError, match="persistent is an option of split='keys'"):
        BackwardConfig(head_dim=128, consumers=2, persistent=True)
    with pytest.raises(ValueError, match="persistent_ctas of persistent=True"):
        dataclasses.replace(keys_split_config(64), persistent=False, persistent_ctas=4)
    with pytest.raises(ValueError, match="persistent_ctas must be at least 1"):
        persistent(128, ctas=0)


@needs_ptxas
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_persistent_assembles_without_spills(head_dim):
    """The tile loop's counters beside the walk's registers still fit the default
    budgets (240 a consumer thread) without spills."""
    assembles_without_spills(head_dim, dict(persistent=True))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name", ["bfloat16", "float16"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("batch, heads, kv_heads, seq_q, seq_k, head_dim, layout", GPU_CASES)
@pytest.mark.parametrize("ctas", [None, 3])  # a wave, or 3 CTAs walking many tiles each
def test_gpu_persistent_gradients_match_torch(batch, heads, kv_heads, seq_q, seq_k, head_dim, layout, causal,
                                              dtype_name, ctas):
    """As test_attention_backward_keys.py's GPU test checks the keys split."""
    check_gradients_on_the_gpu(batch, heads, kv_heads, seq_q, seq_k, head_dim, layout, causal, dtype_name,
                               persistent(head_dim, ctas))


def launched_grids(monkeypatch) -> list:
    """The main kernel's grids of the test's launches, recorded as the host picks them."""
    grids = []
    pick = backward_host._backward_grid

    def recording(*args, **kwargs):
        grids.append(pick(*args, **kwargs))
        return grids[-1]

    monkeypatch.setattr(backward_host, "_backward_grid", recording)
    return grids
