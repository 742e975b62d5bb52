"""BackwardConfig.releases: who arrives on the keys split's handoffs made of ordinary shared
loads and stores (the staged L and delta, head_dim 256's P^T; p_releases: P^T's alone). Every
kind gives the float64 gradients on the emulator, and as compute-sanitizer's racecheck sees
them (the emulator's WEFT_EMULATE_RACECHECK) a partition's one arrival after its named
barrier leaves the stats slot's reuse unordered. ("warp" passes the emulator's view, which
orders whole warps; racecheck itself reported hazards on it on the GPU:
docs/attention-journal.md.)"""

import dataclasses

import pytest

from weft.compiler import config
from weft.kernels.attention import backward
from weft.kernels.attention.backward_host import RELEASES, BackwardConfig, backward_constexprs, keys_split_config

from .test_attention_backward import _check, _inputs


def test_each_kind_is_the_kernels_constant_of_its_name():
    kinds = {"thread": backward.THREAD_RELEASES, "warp": backward.WARP_RELEASES,
             "partition": backward.PARTITION_RELEASES}
    assert {name: RELEASES.index(name) for name in RELEASES} == kinds
    for name in ("warp", "partition"):
        made = backward_constexprs(dataclasses.replace(keys_split_config(256), releases=name), True)
        assert made["RELEASES"] == made["P_RELEASES"] == kinds[name]  # p_releases None: as releases
        made = backward_constexprs(dataclasses.replace(keys_split_config(256), p_releases=name), True)
        assert "RELEASES" not in made and made["P_RELEASES"] == kinds[name]
    made = backward_constexprs(keys_split_config(256), True)
    assert "RELEASES" not in made and "P_RELEASES" not in made  # the kernel's defaults: "thread"


def test_unknown_or_misplaced_releases_are_refused():
    with pytest.raises(ValueError, match="releases must be one of"):
        dataclasses.replace(keys_split_config(128), releases="lane")
    with pytest.raises(ValueError, match="p_releases must be one of"):
        dataclasses.replace(keys_split_config(256), p_releases="")
    for field in ("releases", "p_releases"):
        with pytest.raises(ValueError, match="releases and p_releases are options of split='keys'"):
            BackwardConfig(head_dim=128, consumers=2, **{field: "warp"})


@pytest.mark.parametrize("fields, causal, seq_q, seq_k", [
    # head_dim 256: one band, stats and P^T handed over, one slot
    (dict(releases="warp"), True, 100, 130),
    (dict(releases="partition"), False, 70, 100),
    (dict(releases="warp", p_releases="partition"), True, 130, 70),
])
def test_gradients_match_float64(fields, causal, seq_q, seq_k):
    _check(*_inputs(1, 2, 1, seq_q, seq_k, 256, "bhsd", seed=7), causal, layout="bhsd",
           config=dataclasses.replace(keys_split_config(256), **fields))


def test_racecheck_view_flags_a_partitions_one_arrival(monkeypatch):
    """The default ("thread") passes the same case: test_attention_backward_racecheck.py."""
    monkeypatch.setenv("WEFT_EMULATE_RACECHECK", "1")
    assert config.current().emulate_racecheck
    with pytest.raises(Exception, match="racecheck hazard"):
        _check(*_inputs(1, 2, 1, 100, 200, 128, "bhsd", seed=41), True, layout="bhsd",
               config=dataclasses.replace(keys_split_config(128), releases="partition"))
