"""compiler/config.py: every flag, read on demand."""

from pathlib import Path

import pytest

from weft.compiler import config
from weft.compiler.config import ConfigError


def test_defaults_with_an_empty_environment():
    c = config.current({})
    assert c.dump == frozenset()
    assert c.cache_dir == Path("~/.cache/weft").expanduser()
    assert (c.cache_enabled, c.emulate, c.ptxas, c.debug, c.verify) == (
        True, False, None, False, False)
    assert c.emulate_shuffle is None


def test_every_flag():
    c = config.current({"WEFT_DUMP": "layout, ptx,,infer_layouts", "WEFT_CACHE_DIR": "/tmp/x",
                        "WEFT_EMULATE": "1", "WEFT_PTXAS": "/opt/ptxas",
                        "WEFT_VERIFY": "true", "WEFT_NO_CACHE": "1", "WEFT_EMULATE_SHUFFLE": " 7 "})
    assert c.dump == {"layout", "ptx", "infer_layouts"}
    assert c.should_dump("ptx") and not c.should_dump("llir")
    assert c.cache_dir == Path("/tmp/x")
    assert (c.cache_enabled, c.emulate, c.ptxas, c.debug, c.verify) == (
        False, True, "/opt/ptxas", False, True)
    assert c.emulate_shuffle == 7


def test_debug_implies_verify_and_all_dumps_everything():
    c = config.current({"WEFT_DEBUG": "1", "WEFT_DUMP": "all"})
    assert c.verify and c.should_dump("anything")


def test_read_on_demand(monkeypatch):
    monkeypatch.setenv("WEFT_EMULATE", "1")
    assert config.emulate() and config.current().emulate
    monkeypatch.setenv("WEFT_EMULATE", "0")
    assert not config.emulate()
    monkeypatch.setenv("WEFT_DUMP", "llir")
    assert config.should_dump("llir") and not config.should_dump("ptx")
    assert config.emulate_shuffle() is None
    monkeypatch.setenv("WEFT_EMULATE_SHUFFLE", "3")
    assert config.emulate_shuffle() == 3


def test_a_bad_switch_names_the_variable():
    with pytest.raises(ConfigError, match=r"WEFT_EMULATE='maybe' is not a switch; use 1 or 0"):
        config.current({"WEFT_EMULATE": "maybe"})


def test_a_bad_seed_names_the_variable():
    with pytest.raises(ConfigError, match=r"WEFT_EMULATE_SHUFFLE='x' is not a seed; use an integer"):
        config.current({"WEFT_EMULATE_SHUFFLE": "x"})
