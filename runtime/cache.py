"""The on-disk kernel cache: one file per compiled kernel, under `WEFT_CACHE_DIR`
(default `~/.cache/weft`), at most `WEFT_CACHE_SIZE` bytes (least recently used entries
go first).

Two levels, as the key cannot know before the frontend runs which globals a kernel reads:
- the key (`make_key`): sha256 over what is known at the call, the kernel's own
  fingerprint (its bytecode, so comments do not count; runtime/dependencies.py), constexpr
  values, signature, specialization, num_warps and other options, the target, and the
  toolchain (weft's compiler code, llvmlite, ptxas, Python);
- the entry's dependencies: (module, name, fingerprint) of every global and module
  attribute the frontend resolved (layouts, tuples, constants, @jit callees at any depth,
  constexpr functions and what they name). `get` takes the entry only when the caller's
  `accept` finds them all unchanged in its process; otherwise it is a miss and the new
  compile replaces the entry.

Entry format (`<cache_dir>/<key[:2]>/<key>.weft`), chosen so entries can be inspected
with a text editor and loading one never executes code (unlike pickle):

    weft-cache 3\n
    <sha256 hex of the rest>\n
    <byte length of the JSON>\n
    <UTF-8 JSON {"dependencies": [[module, name, fingerprint], ...],
                 "kernel": the CompiledKernel}>
    <blobs: the long strings and bytes, raw, one after another>

A string or bytes value of at least BLOB_MIN bytes (the IR, PTX and cubin) is stored as a
blob and named in the JSON as {"__blob__": [offset, length, "str" or "bytes"]}: parsing
a megabyte of LLVM IR as a JSON string took longer than everything else a warm hit does.
In the JSON, shorter bytes are {"__bytes__": base64}, tuples {"__tuple__": [...]},
and dicts whose keys are not plain strings {"__dict__": [[key, value], ...]}, so an entry
round-trips exactly. Writes go to a temporary file in the same directory and are moved
into place with `os.replace`, so readers see the old entry, the new one, or none; an entry
that is truncated or altered anyway fails its checksum, is deleted and reads as a miss.
A hit touches the entry's modification time; a write that takes the directory past its
size cap deletes the entries touched longest ago (two processes may evict at once: each
deletion of a file already gone is skipped, and a reader holding an entry open keeps it).
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import hashlib
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from ..compiler import config
from ..compiler.compiled import CompiledKernel, Param
from . import dependencies

FORMAT = "weft-cache 3"
BLOB_MIN = 4096
_log = logging.getLogger("weft.cache")


class CacheError(TypeError):
    """A compiled kernel holds something the cache cannot store (e.g. an object in
    metadata that is not JSON-like)."""


# ----------------------------------------------------------------------------- keys

def _canonical(value: Any) -> Any:
    """A deterministic, JSON-able stand-in for a key component."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return repr(value)  # keeps -0.0, nan and inf distinct and exact
    if isinstance(value, bytes):
        return {"bytes": hashlib.sha256(value).hexdigest()}
    if isinstance(value, Mapping):
        return {"dict": sorted(([_canonical(k), _canonical(v)] for k, v in value.items()),
                               key=repr)}
    if isinstance(value, (tuple, list)):
        return [_canonical(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return {"set": sorted((_canonical(v) for v in value), key=repr)}
    # Functions (their bytecode, not their comments), classes, @jit functions, layouts and
    # other objects: see runtime/dependencies.py.
    return {"value": dependencies.fingerprint(value)}


canonical = _canonical  # other caches keyed the same way (runtime/autotune_cache.py)


def toolchain_versions() -> dict:
    """Versions that change generated code. llvmlite pins one LLVM release per version,
    so its version stands for LLVM's without loading the LLVM library."""
    from .. import __version__ as weft_version
    from ..compiler.cuda_tools import ptxas_version
    try:
        import llvmlite
        llvmlite_version = llvmlite.__version__
    except ImportError:
        llvmlite_version = None
    try:
        ptxas = ptxas_version()
    except Exception:  # a bad WEFT_PTXAS surfaces when assembling, not here
        ptxas = None
    return {"format": FORMAT, "weft": weft_version, "compiler": compiler_fingerprint(),
            "llvmlite": llvmlite_version, "ptxas": ptxas,
            # Function fingerprints are bytecode, which each Python version spells its own way.
            "python": sys.implementation.cache_tag, "optimize": sys.flags.optimize}


@functools.lru_cache(maxsize=None)
def compiler_fingerprint() -> str:
    """A hash of the code that turns a kernel into a cubin and its metadata (compiler/,
    with the ptxas finder and report parser, layouts/, the languages). The version number alone
    misses every change made between releases, so an edited or upgraded weft would be
    handed kernels its older self compiled."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    paths = [path for folder in ("compiler", "layouts", "lowlevel", "highlevel")
             for path in sorted((root / folder).rglob("*.py"))]
    for path in paths:
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def make_key(kernel: str, constexprs: Mapping[str, Any], specialization: Any,
             num_warps: int, options: Optional[Mapping[str, Any]] = None,
             target: str = "sm_90a", signature: Any = None,
             versions: Optional[Mapping[str, Any]] = None) -> str:
    """The sha256 hex key of one compilation, from what is known before the frontend runs
    (`kernel`: the kernel function's fingerprint). The globals it resolves are checked
    against the entry's recorded dependencies instead. `versions` defaults to
    `toolchain_versions()`; tests pass their own."""
    parts = {
        "kernel": kernel,
        "signature": _canonical(signature),
        "constexprs": _canonical(dict(constexprs)),
        "specialization": _canonical(specialization),
        "num_warps": int(num_warps),
        "options": _canonical(dict(options or {})),
        "target": target,
        "versions": _canonical(dict(toolchain_versions() if versions is None else versions)),
    }
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


# ----------------------------------------------------------------------------- encoding

class _Blobs:
    """The long strings and bytes of one entry, kept raw after its JSON."""

    def __init__(self, data: bytes = b""):
        self.data, self.parts, self.size = data, [], 0

    def put(self, value) -> dict:
        raw = value.encode() if isinstance(value, str) else bytes(value)
        self.parts.append(raw)
        self.size += len(raw)
        return {"__blob__": [self.size - len(raw), len(raw), "str" if isinstance(value, str) else "bytes"]}

    def get(self, start: int, length: int, kind: str):
        raw = self.data[start:start + length]
        if len(raw) != length:
            raise ValueError("a blob runs past the end of the entry")
        return raw.decode() if kind == "str" else raw


def _encode(value: Any, where: str, blobs: Optional[_Blobs] = None) -> Any:
    if blobs is not None and isinstance(value, (str, bytes, bytearray)) and len(value) >= BLOB_MIN:
        return blobs.put(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (bytes, bytearray)):
        return {"__bytes__": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, tuple):
        return {"__tuple__": [_encode(v, where, blobs) for v in value]}
    if isinstance(value, list):
        return [_encode(v, where, blobs) for v in value]
    if isinstance(value, dict):
        if all(isinstance(k, str) and not k.startswith("__") for k in value):
            return {k: _encode(v, f"{where}.{k}", blobs) for k, v in value.items()}
        return {"__dict__": [[_encode(k, where, blobs), _encode(v, where, blobs)]
                             for k, v in value.items()]}
    raise CacheError(f"cannot cache {where}: {type(value).__qualname__} is not JSON-like "
                     "(use str, int, float, bool, None, bytes, tuple, list or dict)")


def _resolve_blobs(value: Any, blobs: _Blobs) -> Any:
    """`value` with each {"__blob__": ...} replaced by the string or bytes it names."""
    if isinstance(value, list):
        return [_resolve_blobs(v, blobs) for v in value]
    if isinstance(value, dict):
        if "__blob__" in value:
            return blobs.get(*value["__blob__"])
        return {k: _resolve_blobs(v, blobs) for k, v in value.items()}
    return value


def _decode(value: Any) -> Any:
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if isinstance(value, dict):
        if "__bytes__" in value:
            return base64.b64decode(value["__bytes__"])
        if "__tuple__" in value:
            return tuple(_decode(v) for v in value["__tuple__"])
        if "__dict__" in value:
            return {_hashable(_decode(k)): _decode(v) for k, v in value["__dict__"]}
        return {k: _decode(v) for k, v in value.items()}
    return value


def _hashable(value: Any) -> Any:
    return tuple(_hashable(v) for v in value) if isinstance(value, list) else value


def encode_kernel(compiled: CompiledKernel, dependencies: Sequence[Sequence[str]] = ()) -> bytes:
    """The file contents (header, checksum, JSON, blobs) for one kernel and the
    (module, name, fingerprint) dependencies it was compiled against. Every dataclass field
    is stored, so fields added to CompiledKernel later are kept too."""
    blobs = _Blobs()
    document = {}
    for field in dataclasses.fields(CompiledKernel):
        value = getattr(compiled, field.name)
        if field.name == "params":
            value = [[p.name, p.type] + ([list(p.hidden)] if p.hidden else []) for p in value]
        document[field.name] = _encode(value, field.name, blobs)
    entry = {"dependencies": [list(d) for d in dependencies], "kernel": document}
    payload = json.dumps(entry, sort_keys=True).encode()
    body = f"{len(payload)}\n".encode() + payload + b"".join(blobs.parts)
    return f"{FORMAT}\n{hashlib.sha256(body).hexdigest()}\n".encode() + body


def decode_entry(data: bytes) -> tuple[list, dict]:
    """(dependencies, kernel document, blobs in place) of `encode_kernel`'s output;
    ValueError when it is truncated or altered."""
    header, _, rest = data.partition(b"\n")
    digest, _, body = rest.partition(b"\n")
    if header.decode(errors="replace") != FORMAT:
        raise ValueError(f"not a {FORMAT!r} entry")
    if hashlib.sha256(body).hexdigest().encode() != digest:
        raise ValueError("checksum mismatch (truncated or corrupt entry)")
    length, _, rest = body.partition(b"\n")
    payload_length = int(length)
    entry = json.loads(rest[:payload_length])
    document = _resolve_blobs(entry["kernel"], _Blobs(rest[payload_length:]))
    return entry["dependencies"], document


def kernel_from_document(document: dict) -> CompiledKernel:
    values = {}
    for field in dataclasses.fields(CompiledKernel):
        if field.name in document:
            values[field.name] = _decode(document[field.name])
        elif field.default is dataclasses.MISSING and \
                field.default_factory is dataclasses.MISSING:
            raise ValueError(f"entry lacks field {field.name!r}")
    values["params"] = tuple(Param(name, type_, tuple(hidden[0]) if hidden else None)
                             for name, type_, *hidden in values["params"])
    return CompiledKernel(**values)


def decode_kernel(data: bytes) -> CompiledKernel:
    """The kernel of `encode_kernel`'s output; ValueError when it is truncated or altered."""
    return kernel_from_document(decode_entry(data)[1])


# ----------------------------------------------------------------------------- store

def cache_dir() -> Path:
    return config.current().cache_dir


def entry_path(key: str, directory: Optional[Path] = None) -> Path:
    if len(key) < 8 or not all(c in "0123456789abcdef" for c in key):
        raise ValueError(f"cache key must be a hex digest, got {key!r}")
    return Path(directory or cache_dir()) / key[:2] / f"{key}.weft"


def get(key: str, directory: Optional[Path] = None,
        accept: Optional[Callable[[list], bool]] = None) -> Optional[CompiledKernel]:
    """The cached kernel for `key`, or None. `accept(dependencies)` says whether the
    entry's recorded dependencies still hold; when it says no, the entry is a miss (the
    caller's new compile replaces it). A corrupt entry is removed and is a miss."""
    path = entry_path(key, directory)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        _log.warning("weft cache: cannot read %s (%s); recompiling", path, exc)
        return None
    try:
        recorded, document = decode_entry(data)
        if accept is not None and not accept(recorded):
            return None
        kernel = kernel_from_document(document)
    except Exception as exc:  # any parse failure means the entry is unusable
        _log.warning("weft cache: discarding corrupt entry %s (%s)", path, exc)
        _remove(path)
        return None
    try:
        os.utime(path)  # recently used: evicted last
    except OSError:
        pass
    return kernel


def put(key: str, compiled: CompiledKernel, directory: Optional[Path] = None,
        dependencies: Sequence[Sequence[str]] = (), max_bytes: Optional[int] = None) -> Path:
    """Store `compiled` (compiled against `dependencies`) under `key` atomically, then
    evict least recently used entries past `max_bytes` (default: WEFT_CACHE_SIZE); returns
    the entry's path. CacheError when the kernel holds values the format cannot store."""
    path = entry_path(key, directory)
    write_atomically(path, encode_kernel(compiled, dependencies))
    evict(path.parent.parent, config.current().cache_max_bytes if max_bytes is None else max_bytes,
          keep=path)
    return path


def write_atomically(path: Path, data: bytes) -> None:
    """Write `data` to a temporary file beside `path`, then move it into place: readers
    see the old contents, the new ones, or no file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem[:16]}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        _remove(Path(tmp))
        raise


# A temporary file this old was left by a writer that died.
_STALE_TEMPORARY_S = 3600


def evict(directory: Path, max_bytes: int, keep: Optional[Path] = None) -> int:
    """Delete the least recently used entries of `directory` until the rest fit in
    `max_bytes` (`keep`, the entry just written, stays); returns how many went."""
    entries, total, now = [], 0, time.time()
    for folder in _scan(directory):
        for item in _scan(folder):
            try:
                stat = item.stat(follow_symlinks=False)
            except OSError:
                continue  # deleted meanwhile
            if item.name.endswith(".tmp"):
                if now - stat.st_mtime > _STALE_TEMPORARY_S:
                    _remove(Path(item.path))
                continue
            if item.name.endswith(".weft"):
                entries.append((stat.st_mtime, stat.st_size, item.path))
                total += stat.st_size
    removed = 0
    for _, size, path in sorted(entries):
        if total <= max_bytes:
            break
        if keep is not None and path == str(keep):
            continue
        _remove(Path(path))
        total -= size
        removed += 1
    return removed


def _scan(directory) -> list:
    try:
        with os.scandir(directory) as items:
            return [item for item in items if not item.is_symlink()]
    except (FileNotFoundError, NotADirectoryError):
        return []


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except OSError:  # already gone (another process evicted it) or not ours to remove
        pass
