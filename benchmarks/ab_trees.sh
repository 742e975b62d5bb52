#!/bin/bash
# A/B on the device: weft trees (copies of the package, e.g. `git archive <commit>`), each
# run in its own processes, trees alternating: the attention benchmark beside cuDNN, the
# matmul benchmark beside cuBLAS (CUDA-graph time) and benchmarks/eager_calls.py (do_bench
# on the Python calls, host path included). Logs and JSON under $OUT/<n>-<tree>-<what>.
# Each tree runs its own benchmarks/ from its root, its package first on PYTHONPATH.
#   TREES=".ab/base .ab/new .ab/base .ab/new" bash benchmarks/ab_trees.sh; python3 -m benchmarks.ab_summary $OUT
set -u
ATTENTION_ARGS=${ATTENTION_ARGS:---quick --systems weft,cudnn}
STEPS=${STEPS:-attention matmul eager}  # e.g. STEPS=eager for the host path alone
here=$(pwd)
export PYTHONUNBUFFERED=1
python3 -m pip uninstall -y -q weft >/dev/null 2>&1  # an editable install would shadow PYTHONPATH
i=0
for tree in $TREES; do
  i=$((i + 1)); name=$i-$(basename "$tree")
  pkg=/tmp/ab_pkg/$(basename "$tree")
  [ -d "$pkg/weft" ] || { mkdir -p "$pkg" && cp -r "$tree" "$pkg/weft"; }
  run() {  # what, timeout, command...
    local what=$1 limit=$2; shift 2
    (cd "$pkg/weft" && PYTHONPATH=$pkg WEFT_CACHE_DIR=/tmp/ab_cache/$(basename "$tree") timeout "$limit" "$@" \
       > "$OUT/$name-$what.log" 2>&1; echo "$name $what: rc $?")
  }
  step() { [[ " $STEPS " == *" $1 "* ]]; }
  step attention && run attention "${T_ATTENTION:-200}" python3 -m benchmarks.attention $ATTENTION_ARGS --out "$OUT/$name-attention.json"
  step matmul && run matmul "${T_MATMUL:-150}" python3 -m benchmarks.matmul --quick --out "$OUT/$name-matmul.json"
  step eager && run eager "${T_EAGER:-120}" python3 "$here/benchmarks/eager_calls.py" --out "$OUT/$name-eager.json"
done
