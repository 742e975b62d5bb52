#!/bin/bash
# A/B on the device: weft trees side by side (each a copy of the package, e.g. made with
# `git archive <commit>`), each run by benchmarks/attention.py beside cuDNN in its own
# process, one after the other on the same machine; logs and JSON under $OUT/<n>-<tree>.
#   TREES="ab_old ab_new" ARGS="--systems weft,cudnn --head-dims 64" bash benchmarks/ab_attention.sh
# then `python3 -m benchmarks.ab_table $OUT` puts the runs side by side. Each tree runs its
# own benchmarks/ from its root (`python3 -m benchmarks.attention`), with the tree's package
# on PYTHONPATH; trees from before benchmarks/ left the package (it imported itself as
# weft.benchmarks) run the same way.
set -u
ARGS=${ARGS:---systems weft,cudnn}
export PYTHONUNBUFFERED=1
python3 -m pip uninstall -y -q weft >/dev/null 2>&1  # an editable install would shadow PYTHONPATH
i=0
for tree in $TREES; do
  i=$((i + 1)); name=$i-$(basename "$tree")  # a tree may run twice (a drift check)
  pkg=/tmp/ab_pkg/$tree
  rm -rf "$pkg" && mkdir -p "$pkg" && cp -r "$tree" "$pkg/weft"
  (cd "$pkg/weft" && PYTHONPATH=$pkg WEFT_CACHE_DIR=/tmp/ab_cache/$tree timeout "${T:-280}" \
     python3 -m benchmarks.attention $ARGS --out "$OUT/$name.json" > "$OUT/$name.log" 2>&1
   echo "$name: rc $? ($(PYTHONPATH=$pkg python3 -c 'import weft; print(weft.__file__)'))")
done
