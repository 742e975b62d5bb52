"""Autotuning results on disk, so a later process does not time the configs again.

One file per (kernel, key values, argument types, device, toolchain, timing method), under
`<WEFT_CACHE_DIR>/autotune/<sha256>.json`, holding one record per config that was ever
timed there: `{"timing": [ms, ...]}` or `{"error": "why it failed to compile"}`. Records
are per config, not one winner, so a config added to the decorator's list later is the
only one timed; the best is chosen among the configs listed now. Files are plain JSON
(open one to see what was timed), written atomically (runtime/cache.py); one that does not
parse reads as empty and is rewritten. WEFT_NO_CACHE=1 neither reads nor writes them.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any, Mapping, Optional

from ..compiler import config
from . import cache

FORMAT = "weft-autotune 1"
FOLDER = "autotune"
_log = logging.getLogger("weft.autotune")


def entry_key(parts: Mapping[str, Any]) -> str:
    """The sha256 hex name of the file for these key parts (any values runtime/cache.py
    can canonicalize), the toolchain's versions included."""
    document = {**{k: cache.canonical(v) for k, v in parts.items()},
                "versions": cache.canonical(cache.toolchain_versions())}
    return hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()


def config_id(options: Mapping[str, Any]) -> str:
    """A config's name inside an entry: its constexprs and launch options, canonical."""
    return json.dumps(cache.canonical(dict(options)), sort_keys=True, separators=(",", ":"))


def _path(key: str) -> Optional[Path]:
    settings = config.current()
    return settings.cache_dir / FOLDER / f"{key}.json" if settings.cache_enabled else None


def load(key: str) -> dict[str, dict]:
    """config id -> record for the entry `key`; empty when there is none (or no cache)."""
    path = _path(key)
    if path is None:
        return {}
    try:
        document = json.loads(path.read_text())
        if document.get("format") != FORMAT:
            return {}
        return {str(k): dict(v) for k, v in document["configs"].items() if _is_record(v)}
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        _log.warning("weft.autotune: ignoring unreadable results %s (%s)", path, exc)
        return {}


def store(key: str, records: Mapping[str, dict], description: Mapping[str, Any]) -> None:
    """Add `records` to the entry `key` (records already there for other configs stay).
    `description` (kernel name, key values, device) is stored for people reading the file."""
    path = _path(key)
    if path is None or not records:
        return
    merged = {**load(key), **records}
    document = {"format": FORMAT, **{k: str(v) for k, v in description.items()}, "configs": merged}
    try:
        cache.write_atomically(path, json.dumps(document, indent=1, sort_keys=True).encode())
    except OSError as exc:  # caching is best effort
        _log.warning("weft.autotune: not caching results in %s: %s", path, exc)


def _is_record(value: Any) -> bool:
    if not isinstance(value, dict):
        return False
    if "timing" in value:
        timing = value["timing"]
        return isinstance(timing, list) and bool(timing) and all(isinstance(t, (int, float)) for t in timing)
    return isinstance(value.get("error"), str)
