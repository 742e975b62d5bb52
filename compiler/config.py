"""Every environment flag weft reads, in one place (STYLE.md 15).

`current()` reads the environment *now* and returns a frozen `Config`; nothing is read at
import time, so tests can `monkeypatch.setenv` and call code that asks for `current()`.

| variable               | meaning                                                      |
|------------------------|--------------------------------------------------------------|
| `WEFT_DUMP`            | comma-separated stage or pass names whose text is printed    |
|                        | (`all` prints every one), e.g. `WEFT_DUMP=layout,ptx`         |
| `WEFT_CACHE_DIR`       | the on-disk kernel cache (default `~/.cache/weft`)           |
| `WEFT_CACHE_SIZE`      | the disk cache's cap in bytes, K/M/G suffixes allowed        |
|                        | (default `1G`); the least recently used entries go first     |
| `WEFT_NO_CACHE`        | `1` skips the on-disk cache (reads and writes)                |
| `WEFT_EMULATE`         | `1` runs every launch on the CPU emulator, GPU or not        |
| `WEFT_EMULATE_SHUFFLE` | an int seed: the emulator lands TMA loads in an order drawn  |
|                        | from it, not oldest first (the hardware promises no order)   |
| `WEFT_EMULATE_RACECHECK` | `1`: the emulator also reports what compute-sanitizer's     |
|                        | racecheck would: accesses ordered only through a named       |
|                        | barrier and one thread's mbarrier arrive (emulator/racecheck.py) |
| `WEFT_PTXAS`           | an explicit ptxas executable, tried before any other         |
| `WEFT_DEBUG`           | `1` turns on debug mode, which implies `WEFT_VERIFY`         |
| `WEFT_VERIFY`          | `1` runs the IR verifier between passes                      |
| `WEFT_AUTOTUNE_QUIET` | `1` silences the line `weft.autotune` prints on stderr while  |
|                       | it times configs (runtime/autotune.py)                       |
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"", "0", "false", "no", "off"})


class ConfigError(ValueError):
    """An environment flag holds a value weft cannot use."""


@dataclass(frozen=True)
class Config:
    """The environment flags as values; build one with `current()`."""

    dump: frozenset  # stage/pass names to print; "all" prints everything
    cache_dir: Path
    cache_enabled: bool
    cache_max_bytes: int  # the disk cache evicts least recently used entries past this
    emulate: bool
    emulate_shuffle: Optional[int]  # seed of the order TMA loads land in on the emulator
    ptxas: Optional[str]
    debug: bool
    verify: bool
    autotune_quiet: bool = False  # no progress line while autotuning
    emulate_racecheck: bool = False  # the emulator also reports racecheck's hazards

    def should_dump(self, name: str) -> bool:
        """True when `WEFT_DUMP` names this stage or pass (or says `all`)."""
        return name in self.dump or "all" in self.dump


def _flag(environ, name: str) -> bool:
    raw = environ.get(name, "")
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(f"{name}={raw!r} is not a switch; use 1 or 0")


def _names(raw: str) -> frozenset:
    return frozenset(part.strip() for part in raw.split(",") if part.strip())


DEFAULT_CACHE_BYTES = 1 << 30
_SIZE = re.compile(r"(\d+(?:\.\d*)?)\s*([KMGT]?)(?:I?B)?", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _size(environ, name: str, default: int) -> int:
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    match = _SIZE.fullmatch(raw)
    value = int(float(match.group(1)) * _SIZE_UNITS[match.group(2).upper()]) if match else 0
    if value <= 0:
        raise ConfigError(f"{name}={raw!r} is not a size; use a positive number of bytes, "
                          "optionally with K, M or G (e.g. 2G), or WEFT_NO_CACHE=1 for no cache")
    return value


def _seed(environ, name: str) -> Optional[int]:
    raw = environ.get(name, "").strip()
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a seed; use an integer (or leave it unset)") from None


def current(environ=None) -> Config:
    """Read the flags from `environ` (default `os.environ`) into a `Config`."""
    env = os.environ if environ is None else environ
    cache_dir = env.get("WEFT_CACHE_DIR", "").strip()
    debug = _flag(env, "WEFT_DEBUG")
    return Config(
        dump=_names(env.get("WEFT_DUMP", "")),
        cache_dir=Path(cache_dir).expanduser() if cache_dir
        else Path("~/.cache/weft").expanduser(),
        cache_enabled=not _flag(env, "WEFT_NO_CACHE"),
        cache_max_bytes=_size(env, "WEFT_CACHE_SIZE", DEFAULT_CACHE_BYTES),
        emulate=_flag(env, "WEFT_EMULATE"),
        emulate_shuffle=_seed(env, "WEFT_EMULATE_SHUFFLE"),
        ptxas=env.get("WEFT_PTXAS", "").strip() or None,
        debug=debug,
        verify=debug or _flag(env, "WEFT_VERIFY"),
        autotune_quiet=_flag(env, "WEFT_AUTOTUNE_QUIET"),
        emulate_racecheck=_flag(env, "WEFT_EMULATE_RACECHECK"),
    )


# Narrow readers for hot paths that need one flag. `os.environ.get` encodes the key and
# decodes the value at every call, and every launch asks for WEFT_EMULATE, so the
# common case (unset) is answered from the encoded mapping behind os.environ.
_EMULATE_KEY = os.environ.encodekey("WEFT_EMULATE") if hasattr(os.environ, "encodekey") \
    else None


def emulate() -> bool:
    """True under `WEFT_EMULATE=1`."""
    env = os.environ
    data = getattr(env, "_data", None)
    if data is not None and _EMULATE_KEY is not None and data.get(_EMULATE_KEY) is None:
        return False
    return _flag(env, "WEFT_EMULATE")


def emulate_shuffle() -> Optional[int]:
    """The seed under `WEFT_EMULATE_SHUFFLE`, or None (TMA loads land oldest first)."""
    return _seed(os.environ, "WEFT_EMULATE_SHUFFLE")


def emulate_racecheck() -> bool:
    """True under `WEFT_EMULATE_RACECHECK=1`."""
    return _flag(os.environ, "WEFT_EMULATE_RACECHECK")


def should_dump(name: str) -> bool:
    """True when `WEFT_DUMP` names this stage or pass (or says `all`)."""
    names = _names(os.environ.get("WEFT_DUMP", ""))
    return name in names or "all" in names
