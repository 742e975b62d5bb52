#!/bin/bash
# One call on the GPU machine: install, GPU tests, then benchmarks; logs and JSON under $OUT.
# Usage: bash benchmarks/run_gpu.sh [pytest args...]
set -o pipefail
export PYTHONUNBUFFERED=1 WEFT_CACHE_DIR=/tmp/weft-cache
OUT=${OUT:-/tmp/weft-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
python3 -m pytest -m gpu -q -p no:randomly "$@" tests 2>&1 | tee "$OUT/pytest_gpu.log" | tail -25
status=$?
python3 -m benchmarks.memory_bound --out "$OUT/memory_bound.json" 2>&1 | tee "$OUT/memory_bound.log" | tail -30
exit $status
