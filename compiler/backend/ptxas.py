"""Assemble PTX into a cubin with `ptxas -v`, keeping its resource report (registers,
spills, shared memory, performance advisories). compiler/cuda_tools.py finds ptxas."""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path
from typing import Optional

from ..cuda_tools import MISSING_PTXAS, PtxasError, find_ptxas

__all__ = ["PtxasError", "assemble", "find_ptxas", "parse_report"]


# -v report lines, one block per entry function:
#   ptxas info    : Compiling entry function 'k' for 'sm_90a'
#       0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
#   ptxas info    : Used 8 registers, used 1 barriers, 1024 bytes smem, 384 bytes cmem[0]
_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")
_BARRIERS = re.compile(r"used (\d+) barriers")
_EMPTY = {"registers": 0, "spill_stores": 0, "spill_loads": 0, "stack_frame": 0,
          "shared_bytes": 0, "barriers": 0}


# ptxas's performance advisories, e.g. "(C7515) Potential Performance Loss: wgmma.mma_async
# instructions are serialized due to ...": the code is right but slow (serialized wgmmas
# no longer overlap each other or the code around them), so tests of fast kernels assert
# there are none.
_ADVISORY = re.compile(r"Potential Performance Loss: (.*)")


def parse_report(text: str) -> dict:
    """Parse `ptxas -v` output into {registers, spill_stores, spill_loads, stack_frame,
    shared_bytes, barriers, text, performance_warnings} for the first entry function,
    plus `kernels`: the same numbers per entry name when the PTX holds several."""
    kernels: dict[str, dict] = {}
    current = None
    for line in text.splitlines():
        entry = _ENTRY.search(line)
        if entry:
            current = kernels.setdefault(entry.group(1), dict(_EMPTY))
            continue
        if current is None:
            continue
        frame = _FRAME.search(line)
        if frame:
            current["stack_frame"], current["spill_stores"], current["spill_loads"] = (
                int(g) for g in frame.groups())
        used = _USED.search(line)
        if used:
            current["registers"] = int(used.group(1))
            smem = _SMEM.search(line)
            if smem:
                current["shared_bytes"] = int(smem.group(1))
            barriers = _BARRIERS.search(line)
            if barriers:
                current["barriers"] = int(barriers.group(1))
    first = next(iter(kernels.values()), _EMPTY)
    return {**first, "kernels": kernels, "text": text,
            "performance_warnings": [m.group(1).strip() for m in _ADVISORY.finditer(text)]}


def assemble(ptx: str, arch: str = "sm_90a", max_registers: Optional[int] = None,
             opt_level: int = 3, ptxas: Optional[str] = None) -> tuple[bytes, dict]:
    """Assemble `ptx` with `ptxas -v`; return (cubin bytes, parsed report).

    Raises PtxasError (with ptxas's log) when no ptxas is found or assembly fails.
    """
    path = ptxas or find_ptxas()
    if path is None:
        raise PtxasError(MISSING_PTXAS)
    if opt_level not in (0, 1, 2, 3):
        raise ValueError(f"opt_level must be 0..3, got {opt_level!r}")
    with tempfile.TemporaryDirectory(prefix="weft-ptxas-") as tmp:
        src, out = Path(tmp, "kernel.ptx"), Path(tmp, "kernel.cubin")
        src.write_text(ptx)
        cmd = [path, "-v", f"-arch={arch}", f"-O{opt_level}", str(src), "-o", str(out)]
        if max_registers is not None:
            cmd[1:1] = [f"--maxrregcount={int(max_registers)}"]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise PtxasError(f"running {path} failed: {exc}") from exc
        # ptxas writes -v info and errors to stderr; keep both streams for the log.
        log = (proc.stdout + proc.stderr).replace(str(src), "kernel.ptx")
        if proc.returncode != 0 or not out.exists():
            raise PtxasError(f"ptxas ({path}) rejected the PTX for {arch} "
                             f"(exit code {proc.returncode}):", log)
        cubin = out.read_bytes()
    return cubin, parse_report(log)
