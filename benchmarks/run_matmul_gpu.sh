#!/bin/bash
# One call on the GPU machine for the Hopper machinery (issue 4): install, every GPU test,
# compute-sanitizer memcheck and racecheck on small matmuls, then the matmul benchmark.
# Logs and JSON under $OUT. Usage: bash benchmarks/run_matmul_gpu.sh [pytest args...]
set -o pipefail
export PYTHONUNBUFFERED=1 WEFT_CACHE_DIR=/tmp/weft-cache
OUT=${OUT:-/tmp/weft-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
timeout 240 python3 -m pytest -m gpu -q -x -p no:randomly "$@" tests 2>&1 | tee "$OUT/pytest_gpu.log" | tail -30
status=$?
for tool in memcheck racecheck; do
  timeout 120 compute-sanitizer --tool $tool --report-api-errors no --error-exitcode 9 python3 -m benchmarks.sanitize_matmul \
    >"$OUT/sanitizer_$tool.log" 2>&1
  echo "compute-sanitizer $tool: exit $? ($(grep -c 'ERROR SUMMARY' "$OUT/sanitizer_$tool.log") summaries)"
  grep -E 'ERROR SUMMARY|WRONG|Error' "$OUT/sanitizer_$tool.log" | head -5
done
timeout 400 python3 -m benchmarks.matmul --out "$OUT/matmul.json" 2>&1 | tee "$OUT/matmul.log" | tail -40
exit $status
