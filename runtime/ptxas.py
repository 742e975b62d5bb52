"""Find ptxas (and cuobjdump) and assemble PTX into a cubin, keeping its resource report.

ptxas comes with weft: its `nvidia-cuda-nvcc` dependency ships it. Without one the driver
JIT-compiles the PTX at load time, and no cubin or register report exists. The search
order is `WEFT_PTXAS`, then `PATH`, then the `nvidia-cuda-nvcc` wheel
(`nvidia/cu13/bin/ptxas` or `nvidia/cuda_nvcc/bin/ptxas` under site-packages), then the
copy shipped inside Triton's wheel (`triton/backends/nvidia/bin/ptxas`).

cuobjdump (for `weft compile --dump sass`) comes from the `sass` extra: the
`nvidia-cuda-cuobjdump` wheel, with `nvidia-cuda-nvdisasm`, which cuobjdump runs to
disassemble; both put their tool in `nvidia/cu13/bin`.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import site
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

from ..compiler import config

# Relative to a site-packages directory, newest CUDA first.
_WHEEL_PATHS = (
    "nvidia/cu13/bin/ptxas",
    "nvidia/cuda_nvcc/bin/ptxas",
    "triton/backends/nvidia/bin/ptxas",
)


# Relative to a site-packages directory: where the `sass` extra's wheel puts cuobjdump.
_CUOBJDUMP_WHEEL_PATHS = ("nvidia/cu13/bin/cuobjdump",)


class PtxasError(RuntimeError):
    """ptxas is missing or rejected the PTX; `log` holds its full output."""

    def __init__(self, message: str, log: str = ""):
        super().__init__(f"{message}\n{log}".rstrip() if log else message)
        self.log = log


MISSING_PTXAS = ("ptxas not found; install the `nvidia-cuda-nvcc` wheel (a dependency of weft: "
                 "reinstall weft), put ptxas on PATH or set WEFT_PTXAS (without it the driver "
                 "JIT compiles PTX)")


def _site_dirs() -> list[str]:
    dirs = [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    try:
        dirs += site.getsitepackages()
    except AttributeError:  # virtualenv's old site.py has no getsitepackages
        pass
    user = site.getusersitepackages() if hasattr(site, "getusersitepackages") else None
    if user:
        dirs.append(user)
    return list(dict.fromkeys(dirs))


def _candidates() -> list[tuple[str, str]]:
    """(where it came from, path) in search order; paths may not exist."""
    found = []
    explicit = config.current().ptxas
    if explicit:
        found.append(("WEFT_PTXAS", explicit))
    on_path = shutil.which("ptxas")
    if on_path:
        found.append(("PATH", on_path))
    for directory in _site_dirs():
        for rel in _WHEEL_PATHS:
            found.append((rel.split("/")[0] + " wheel", os.path.join(directory, rel)))
    return found


def find_ptxas() -> Optional[str]:
    """The first usable ptxas, or None. A WEFT_PTXAS that does not exist is an error,
    since the user asked for that exact file."""
    explicit = config.current().ptxas
    if explicit and not _is_executable(explicit):
        raise PtxasError(f"WEFT_PTXAS={explicit!r} is not an executable file; "
                         "fix the path or unset WEFT_PTXAS to search PATH and wheels")
    for _, path in _candidates():
        if _is_executable(path):
            return path
    return None


def find_cuobjdump() -> Optional[str]:
    """cuobjdump on PATH, else the one of the `sass` extra's wheel, or None. Its folder
    holds the nvdisasm it runs (the CUDA toolkit's bin/, or the wheels' nvidia/cu13/bin)."""
    on_path = shutil.which("cuobjdump")
    if on_path:
        return on_path
    for directory in _site_dirs():
        for rel in _CUOBJDUMP_WHEEL_PATHS:
            path = os.path.join(directory, rel)
            if _is_executable(path):
                return path
    return None


def _is_executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


@functools.lru_cache(maxsize=None)
def _version_of(path: str) -> str:
    out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
    match = re.search(r"release (\S+), (V\S+)", out.stdout)
    return match.group(2) if match else out.stdout.strip().splitlines()[-1]


def ptxas_version() -> Optional[str]:
    """The version string (e.g. "V13.0.88") of the ptxas `find_ptxas` picks, or None."""
    path = find_ptxas()
    return _version_of(path) if path else None


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
