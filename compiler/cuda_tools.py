"""Find the CUDA tools weft runs, ptxas (and cuobjdump), and ptxas's version.

Assembling is the backend's (compiler/backend/ptxas.py); this module imports no llvmlite, so
the runtime can key its disk cache on the ptxas version without loading LLVM.

ptxas comes with weft: its `nvidia-cuda-nvcc` dependency ships it. Without one the driver
JIT-compiles the PTX at load time, and no cubin or register report exists. The search
order is `WEFT_PTXAS`, then `PATH`, then the `nvidia-cuda-nvcc` wheel
(`nvidia/cu13/bin/ptxas` or `nvidia/cuda_nvcc/bin/ptxas` under site-packages), then the
copy shipped inside Triton's wheel (`triton/backends/nvidia/bin/ptxas`).

cuobjdump (for `weft compile --dump sass`) comes from the `sass` extra: the
`nvidia-cuda-cuobjdump` wheel, with `nvidia-cuda-nvdisasm`, which cuobjdump runs to
disassemble; both put their tool in `nvidia/cu13/bin`.

libdevice (NVIDIA's bitcode math library, linked where a kernel calls `__nv_*` math) comes
from the same `nvidia-cuda-nvcc` wheel (`nvvm/libdevice/libdevice.10.bc`), else Triton's
wheel, else a CUDA toolkit.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import site
import subprocess
import sys
from typing import Optional

from . import config

# Relative to a site-packages directory, newest CUDA first.
_WHEEL_PATHS = (
    "nvidia/cu13/bin/ptxas",
    "nvidia/cuda_nvcc/bin/ptxas",
    "triton/backends/nvidia/bin/ptxas",
)


# Relative to a site-packages directory: where the `sass` extra's wheel puts cuobjdump.
_CUOBJDUMP_WHEEL_PATHS = ("nvidia/cu13/bin/cuobjdump",)


# Relative to a site-packages directory, newest CUDA first.
_LIBDEVICE_WHEEL_PATHS = (
    "nvidia/cu13/nvvm/libdevice/libdevice.10.bc",
    "nvidia/cuda_nvcc/nvvm/libdevice/libdevice.10.bc",
    "triton/backends/nvidia/lib/libdevice.10.bc",
)
_LIBDEVICE_TOOLKIT_PATHS = ("/usr/local/cuda/nvvm/libdevice/libdevice.10.bc",)


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


def find_libdevice() -> Optional[str]:
    """libdevice.10.bc from the `nvidia-cuda-nvcc` wheel (or Triton's, or a CUDA toolkit),
    or None."""
    wheel_paths = [os.path.join(d, rel) for d in _site_dirs() for rel in _LIBDEVICE_WHEEL_PATHS]
    for path in wheel_paths + list(_LIBDEVICE_TOOLKIT_PATHS):
        if os.path.isfile(path):
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
