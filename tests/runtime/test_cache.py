"""runtime/cache.py: keys, exact round trips, atomic writes, corrupt entries as misses."""

import os

import pytest

from weft.runtime import cache

VERSIONS = {"format": cache.FORMAT, "weft": "0.1.0", "llvmlite": "0.50.0", "ptxas": "V13.0.88"}


def _key(**changes):
    args = dict(source="def k(x): pass", constexprs={"BLOCK": 128, "ACC": "fp32"},
                specialization={"x": "divisible_by_16", "n": ""}, num_warps=4,
                options={"num_stages": 3}, target="sm_90a", callee_sources=["def f(): pass"],
                signature={"x": "*fp32", "n": "i32"}, versions=VERSIONS)
    args.update(changes)
    return cache.make_key(**args)


def test_key_is_stable_and_order_independent():
    assert _key() == _key()
    assert _key() == _key(constexprs={"ACC": "fp32", "BLOCK": 128})
    assert len(_key()) == 64


@pytest.mark.parametrize("change", [
    dict(source="def k(x): return"),
    dict(callee_sources=["def f(): return"]),
    dict(constexprs={"BLOCK": 64, "ACC": "fp32"}),
    dict(constexprs={"BLOCK": 128.0, "ACC": "fp32"}),  # 128 and 128.0 compile differently
    dict(constexprs={"BLOCK": True, "ACC": "fp32"}),
    dict(specialization={"x": "", "n": ""}),
    dict(num_warps=8),
    dict(options={"num_stages": 4}),
    dict(target="sm_100a"),
    dict(signature={"x": "*bf16", "n": "i32"}),
    dict(versions={**VERSIONS, "weft": "0.2.0"}),
    dict(versions={**VERSIONS, "llvmlite": "0.51.0"}),
    dict(versions={**VERSIONS, "ptxas": "V13.1.0"}),
])
def test_key_changes_with_every_input(change):
    assert _key(**change) != _key()


def test_default_versions_include_weft_and_llvmlite():
    import llvmlite

    versions = cache.toolchain_versions()
    assert versions["weft"] == "0.1.0" and versions["llvmlite"] == llvmlite.__version__
    assert cache.make_key("src", {}, (), 4) == cache.make_key("src", {}, (), 4)


def _kernel(make_vadd):
    return make_vadd(
        asm={"source": "def vadd(...)", "ptx": "// ptx", "cubin": b"\x7fELF\x00\xff" * 10},
        metadata={"registers": 12, "report": {"text": "ok"}, "shape": (128, 64),
                  "by_int": {1: "one", (2, 3): [4, 5]}, "__tricky": None},
        cluster=(2, 1, 1))


def test_round_trip_is_exact(cache_dir, make_vadd):
    kernel = _kernel(make_vadd)
    key = _key()
    path = cache.put(key, kernel)
    assert path == cache_dir / key[:2] / f"{key}.weft"
    assert cache.get(key) == kernel
    assert cache.get(_key(num_warps=8)) is None
    assert os.listdir(path.parent) == [path.name]  # no temporary files left behind


def test_entries_are_readable_text(cache_dir, make_vadd):
    path = cache.put(_key(), _kernel(make_vadd))
    head = path.read_bytes().split(b"\n", 2)
    assert head[0] == b"weft-cache 1" and len(head[1]) == 64
    assert b'"name": "vadd"' in head[2]


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty", "header"])
def test_corrupt_entry_is_a_miss_and_is_removed(cache_dir, make_vadd, damage):
    kernel = _kernel(make_vadd)
    key = _key()
    path = cache.put(key, kernel)
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "flip":
        data[-10] ^= 0x55
    elif damage == "empty":
        data = b""
    else:
        data[:10] = b"WEFT-CACHE"
    path.write_bytes(bytes(data))
    assert cache.get(key) is None
    assert not path.exists()
    cache.put(key, kernel)  # rebuilt
    assert cache.get(key) == kernel


def test_failed_write_keeps_the_old_entry(cache_dir, make_vadd, monkeypatch):
    key = _key()
    old = _kernel(make_vadd)
    path = cache.put(key, old)

    def crash(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(cache.os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        cache.put(key, make_vadd(num_warps=8))
    monkeypatch.undo()
    assert cache.get(key, cache_dir) == old
    assert os.listdir(path.parent) == [path.name]


def test_values_json_cannot_hold_are_refused(cache_dir, make_vadd):
    with pytest.raises(cache.CacheError) as info:
        cache.put(_key(), make_vadd(metadata={"ir": object()}))
    assert str(info.value) == ("cannot cache metadata.ir: object is not JSON-like (use str, "
                               "int, float, bool, None, bytes, tuple, list or dict)")


def test_bad_keys_are_refused(cache_dir):
    with pytest.raises(ValueError, match="cache key must be a hex digest"):
        cache.get("../../etc/passwd")
