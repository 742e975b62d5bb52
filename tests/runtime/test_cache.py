"""runtime/cache.py: keys, exact round trips, atomic writes, corrupt entries as misses."""

import os

import pytest

from weft.runtime import cache

VERSIONS = {"format": cache.FORMAT, "weft": "0.1.0", "llvmlite": "0.50.0", "ptxas": "V13.0.88"}


def _key(**changes):
    args = dict(kernel="fingerprint of k", constexprs={"BLOCK": 128, "ACC": "fp32"},
                specialization={"x": "divisible_by_16", "n": ""}, num_warps=4,
                options={"num_stages": 3}, target="sm_90a",
                signature={"x": "*fp32", "n": "i32"}, versions=VERSIONS)
    args.update(changes)
    return cache.make_key(**args)


def test_key_is_stable_and_order_independent():
    assert _key() == _key()
    assert _key() == _key(constexprs={"ACC": "fp32", "BLOCK": 128})
    assert len(_key()) == 64


@pytest.mark.parametrize("change", [
    dict(kernel="fingerprint of k2"),
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


@pytest.mark.parametrize("blobs", [False, True])
def test_round_trip_is_exact(cache_dir, make_vadd, blobs):
    kernel = (_long_kernel if blobs else _kernel)(make_vadd)
    key = _key()
    path = cache.put(key, kernel)
    assert path == cache_dir / key[:2] / f"{key}.weft"
    assert cache.get(key) == kernel
    assert cache.get(_key(num_warps=8)) is None
    assert os.listdir(path.parent) == [path.name]  # no temporary files left behind


def _long_kernel(make_vadd):
    """A kernel whose PTX and cubin are long enough to be stored as blobs."""
    return make_vadd(asm={"source": "def vadd(...)", "ptx": "// ptx line\n" * 1000,
                          "cubin": bytes(range(256)) * 40}, metadata={"registers": 12})


def test_entries_are_readable_text(cache_dir, make_vadd):
    kernel = _long_kernel(make_vadd)
    path = cache.put(_key(), kernel)
    head = path.read_bytes().split(b"\n", 3)
    assert head[0] == b"weft-cache 3" and len(head[1]) == 64
    json_text, blobs = head[3][:int(head[2])], head[3][int(head[2]):]
    assert b'"name": "vadd"' in json_text
    # The PTX is long: it follows the JSON as plain text, which names where it lies.
    assert b'"__blob__"' in json_text
    assert kernel.asm["ptx"].encode() in blobs and kernel.asm["ptx"].encode() not in json_text
    assert cache.decode_kernel(path.read_bytes()) == kernel


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty", "header"])
def test_corrupt_entry_is_a_miss_and_is_removed(cache_dir, make_vadd, damage):
    kernel = _long_kernel(make_vadd)
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


# ----------------------------------------------------------------------------- dependencies
# Each case: files of a kernel module (and helpers), with {V} the value an edit changes.
# A "fresh process" is a fresh import of the edited files (new JITFunction, empty memory
# cache), as a new process would see them; the disk cache is the test's.

KERNEL = '''
from weft import lowlevel as ll
{imports}
{globals}

@ll.jit
def kernel(x_ptr, y_ptr, n):
    offsets = ll.arange(0, 512, layout=LAYOUT)
    x = ll.load(x_ptr + offsets, mask=offsets < n)
    ll.store(y_ptr + offsets, {result}, mask=offsets < n)
'''
PLAIN = "LAYOUT = ll.BlockedLayout([1], [32], [4], [0])"
DEPENDENCY_CASES = {
    "layout global": dict(globals="LAYOUT = ll.BlockedLayout([{V}], [32], [4], [0])",
                          result="x * 1234", values=(1, 4)),  # other addresses per thread
    "tuple global": dict(globals=PLAIN + "\nSCALES = (7, {V})", result="x * SCALES[1]"),
    "int constant": dict(globals=PLAIN + "\nSCALE = {V}", result="x * SCALE"),
    "constexpr_function body": dict(
        globals=PLAIN + "\n\n@ll.constexpr_function\ndef factor():\n    return {V}\n",
        result="x * factor()"),
    "global a constexpr_function names": dict(
        globals=PLAIN + "\nBASE = {V}\n\n@ll.constexpr_function\ndef factor():\n    return BASE\n",
        result="x * factor()"),
    "jitted callee": dict(globals=PLAIN + "\n\n@ll.jit\ndef scale(x):\n    return x * {V}\n",
                          result="scale(x)"),
    "callee of a callee": dict(
        globals=PLAIN + "\n\n@ll.jit\ndef inner(x):\n    return x * {V}\n\n"
                        "@ll.jit\ndef outer(x):\n    return inner(x) + 0\n",
        result="outer(x)"),
    "helper in another module": dict(
        imports="import dep_helpers", globals=PLAIN, result="dep_helpers.scale(x)",
        helpers="from weft import lowlevel as ll\nFACTOR = {V}\n\n"
                "@ll.jit\ndef scale(x):\n    return x * FACTOR\n"),
}
SIGNATURE = {"x_ptr": "*i32", "y_ptr": "*i32", "n": "i32"}


def _write_case(folder, case, value, comment=""):
    fill = {"imports": case.get("imports", ""), "globals": case["globals"], "result": case["result"]}
    text = KERNEL.format(**{k: v.replace("{V}", str(value)) for k, v in fill.items()})
    (folder / "dep_kernel.py").write_text(text.replace("\n@ll.jit", f"\n{comment}@ll.jit"))
    if "helpers" in case:
        helpers = case["helpers"].replace("{V}", str(value))
        (folder / "dep_helpers.py").write_text(helpers.replace("\n@ll.jit", f"\n{comment}@ll.jit"))


def _fresh_compile(folder):
    """(ptx, compiled now?) of the kernel as a new process would import it."""
    import functools
    import importlib
    import linecache
    import sys

    for name in ("dep_kernel", "dep_helpers"):
        sys.modules.pop(name, None)
    importlib.invalidate_caches()
    linecache.checkcache()
    module = importlib.import_module("dep_kernel")
    calls = []
    compile_fn = module.kernel.compile_fn

    @functools.wraps(compile_fn)  # the same name: the compiler's name is part of the key
    def counting(*args):
        calls.append(args)
        return compile_fn(*args)

    module.kernel.compile_fn = counting
    compiled = module.kernel.compile(SIGNATURE, num_warps=4)
    return compiled.asm["ptx"], bool(calls)


@pytest.fixture
def kernel_folder(tmp_path, cache_dir, monkeypatch):
    folder = tmp_path / "kernels"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setattr("sys.dont_write_bytecode", True)  # edits within a second: no stale .pyc
    yield folder
    import sys

    for name in ("dep_kernel", "dep_helpers"):
        sys.modules.pop(name, None)


@pytest.mark.parametrize("kind", list(DEPENDENCY_CASES))
def test_editing_a_dependency_misses_and_a_comment_hits(kernel_folder, kind):
    case = DEPENDENCY_CASES[kind]
    old, new = case.get("values", (1234, 4321))
    _write_case(kernel_folder, case, old)
    ptx, compiled = _fresh_compile(kernel_folder)
    assert compiled
    assert _fresh_compile(kernel_folder) == (ptx, False)  # a new process: a disk hit
    _write_case(kernel_folder, case, new)
    edited, compiled = _fresh_compile(kernel_folder)
    assert compiled, f"editing the {kind} must recompile"
    assert edited != ptx
    if "values" not in case:  # the edited number is in the code
        assert f", {old};" in ptx and f", {new};" in edited and f", {old};" not in edited
    # Comments and blank lines are not code: the entry still serves.
    _write_case(kernel_folder, case, new, comment="# a comment\n\n# another one\n")
    assert _fresh_compile(kernel_folder) == (edited, False)


def test_the_kernel_itself_misses_on_code_and_hits_on_comments(kernel_folder):
    case = DEPENDENCY_CASES["int constant"]
    _write_case(kernel_folder, dict(case, result="x * 1234"), 0)
    ptx, _ = _fresh_compile(kernel_folder)
    source = (kernel_folder / "dep_kernel.py").read_text()
    (kernel_folder / "dep_kernel.py").write_text(source.replace(
        "    x = ll.load", "    # load the inputs\n\n    x = ll.load").replace("x * 1234", "x  *  1234"))
    assert _fresh_compile(kernel_folder) == (ptx, False)
    (kernel_folder / "dep_kernel.py").write_text(source.replace("x * 1234", "x * 1235"))
    edited, compiled = _fresh_compile(kernel_folder)
    assert compiled and ", 1235;" in edited


def test_library_helpers_are_dependencies():
    """The attention kernel's own helpers (steps, rings, ...) are recorded, not skipped as
    weft's compiler: the toolchain fingerprint does not cover weft.kernels."""
    from weft.runtime import dependencies

    assert dependencies.is_covered("weft.lowlevel.hopper") or dependencies.is_covered(
        f"{dependencies._PACKAGE}.lowlevel")
    assert not dependencies.is_covered(f"{dependencies._PACKAGE}.kernels.attention.steps")


def test_fingerprints_see_values_not_addresses():
    from weft import lowlevel as ll
    from weft.runtime.dependencies import fingerprint

    layout = ll.BlockedLayout([1], [32], [4], [0])
    assert fingerprint(layout) == fingerprint(ll.BlockedLayout([1], [32], [4], [0]))
    assert fingerprint(layout) != fingerprint(ll.BlockedLayout([2], [32], [4], [0]))
    assert fingerprint((1, 2)) != fingerprint((1, 2.0)) != fingerprint([1, 2])
    assert fingerprint(frozenset({"a", "b", "c"})) == fingerprint(frozenset({"c", "b", "a"}))

    def closure(k):
        return lambda: k

    assert fingerprint(closure(1)) == fingerprint(closure(1)) != fingerprint(closure(2))


def test_key_of_the_attention_kernel_on_a_disk_hit_is_cheap():
    """What a new process pays before it can take the attention forward from the disk:
    its key and the check of its ~90 recorded dependencies (the budget is 5 ms; the bound
    here is generous for shared machines)."""
    import time

    from weft.compiler.frontend import build_kernel
    from weft.compiler.frontend_expr import record_resolved_globals
    from weft.kernels.attention import default_config
    from weft.kernels.attention.pingpong_config import claim_ahead, lazy_max, rescale_above
    from weft.kernels.attention.kernels import flash_attention_fa3
    from weft.runtime import dependencies

    config = default_config(128, False)
    box = lambda rows: f"tensordesc<bf16[1,1,{rows},64]>"  # noqa: E731
    signature = {"q_desc": box(64), "k_desc": box(config.block_n), "v_desc": box(config.block_n),
                 "o_desc": box(64), "lse_ptr": "*fp32", "counter_ptr": "*i32", "softmax_scale": "fp32",
                 "seq_q": "i32", "seq_k": "i32", "heads": "i32", "kv_group": "i32", "num_m_tiles": "i32",
                 "batch_heads": "i32", "group": "i32"}
    constexprs = dict(BLOCK_N=config.block_n, HEAD_DIM=128, STAGES=config.stages, CAUSAL=False,
                      WRITE_LSE=True, PRODUCER_REGS=config.producer_regs,
                      CONSUMER_REGS=config.consumer_regs, CONSUMERS=config.consumers, O_BUFFER=False,
                      Q_BUFFERS=config.consumers, EXP2_FMA=float(config.exp2_fma_share),
                      REPLICATED=True, PER_WARP=None, RESCALE_ABOVE=rescale_above(config),
                      CLAIM_AHEAD=claim_ahead(config), DYNAMIC=True, LAZY_MAX=lazy_max(config))
    with record_resolved_globals() as resolved:
        build_kernel(flash_attention_fa3, signature, constexprs, 4, {})
    recorded = dependencies.describe(resolved)
    modules = {module for module, _, _ in recorded}
    assert {"weft.kernels.attention.steps", "weft.kernels.attention.rings"} <= modules
    cache.toolchain_versions()  # read once per process, before any kernel
    best = float("inf")
    for _ in range(5):
        dependencies._CODE_DIGESTS.clear()  # a new process digests every function once
        start = time.process_time()
        cache.make_key(flash_attention_fa3.fingerprint(), constexprs, {}, 4, {}, "sm_90a",
                       signature=signature)
        assert dependencies.all_match(recorded, flash_attention_fa3._namespaces(constexprs))
        best = min(best, time.process_time() - start)
    print(f"\nkey + {len(recorded)} dependencies of the attention forward on a disk hit: "
          f"{best * 1e3:.2f} ms CPU")
    assert best < 0.025


# ----------------------------------------------------------------------------- size cap

def _fill(directory, sizes, make_vadd):
    """Entries of about `sizes` bytes, used oldest first; returns their paths."""
    paths = []
    for i, size in enumerate(sizes):
        kernel = make_vadd(asm={"ptx": "x" * size})
        path = cache.put(_key(num_warps=i + 1), kernel, directory, max_bytes=1 << 40)
        os.utime(path, (1000 + i, 1000 + i))
        paths.append(path)
    return paths


def test_a_write_past_the_cap_evicts_the_least_recently_used(cache_dir, make_vadd):
    old, used, newer = _fill(cache_dir, [4000, 4000, 4000], make_vadd)
    assert cache.get(_key(num_warps=2), cache_dir) is not None  # a hit makes it recent
    size = newer.stat().st_size
    latest = cache.put(_key(num_warps=9), make_vadd(asm={"ptx": "x" * 4000}), cache_dir,
                       max_bytes=3 * size + 100)
    assert not old.exists() and used.exists() and newer.exists() and latest.exists()
    # An entry larger than the cap is still kept: the kernel just compiled stays.
    big = cache.put(_key(num_warps=10), make_vadd(asm={"ptx": "x" * 20000}), cache_dir, max_bytes=1000)
    assert big.exists() and [p for p in cache_dir.rglob("*.weft")] == [big]


def test_the_cap_comes_from_weft_cache_size(cache_dir, make_vadd, monkeypatch):
    from weft.compiler import config

    assert config.current({}).cache_max_bytes == 1 << 30
    assert config.current({"WEFT_CACHE_SIZE": "2G"}).cache_max_bytes == 2 << 30
    assert config.current({"WEFT_CACHE_SIZE": "300k"}).cache_max_bytes == 300 << 10
    with pytest.raises(config.ConfigError, match="WEFT_CACHE_SIZE='lots' is not a size"):
        config.current({"WEFT_CACHE_SIZE": "lots"})
    paths = _fill(cache_dir, [3000, 3000], make_vadd)
    monkeypatch.setenv("WEFT_CACHE_SIZE", str(paths[1].stat().st_size + 100))
    cache.put(_key(num_warps=7), make_vadd(), cache_dir)
    assert not paths[0].exists() and not paths[1].exists()


def test_two_processes_writing_at_once_leave_a_consistent_cache(cache_dir):
    """Writers that evict each other's entries at the same time: no error, no partial or
    temporary file left, and the directory ends under its cap."""
    import subprocess
    import sys

    script = f'''
import sys
from weft.runtime import cache
from weft.compiler.compiled import CompiledKernel, Param
base = int(sys.argv[1])
for i in range(40):
    kernel = CompiledKernel("k", (Param("x", "*fp32"),), 4, 0, {{"ptx": "x" * 2000}})
    key = cache.make_key(f"k{{base + i}}", {{}}, {{}}, 4, versions={{}})
    cache.put(key, kernel, max_bytes=20000)
    assert cache.get(key) in (None, kernel)
'''
    workers = [subprocess.Popen([sys.executable, "-c", script, str(n * 100)], stderr=subprocess.PIPE)
               for n in range(2)]
    for worker in workers:
        _, err = worker.communicate(timeout=120)
        assert worker.returncode == 0, err.decode()
    entries = list(cache_dir.rglob("*.weft"))
    assert entries and not list(cache_dir.rglob("*.tmp"))
    assert sum(p.stat().st_size for p in entries) <= 20000 + 2 * 2200  # each writer keeps its own last entry
    assert all(cache.get(p.stem, cache_dir) is not None for p in entries)


def test_the_suite_uses_a_temporary_cache(tmp_path_factory):
    """tests/conftest.py points WEFT_CACHE_DIR into pytest's temporary folder, so running
    the suite never fills the user's ~/.cache/weft."""
    from weft.compiler import config

    base = tmp_path_factory.getbasetemp()
    assert config.current().cache_dir.resolve().is_relative_to(base.resolve())
