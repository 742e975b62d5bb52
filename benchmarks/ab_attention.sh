#!/bin/bash
# A/B on the device: weft trees side by side (each a copy of the package, e.g. made with
# `git archive <commit>`), each run by benchmarks/attention.py beside cuDNN in its own
# process, one after the other on the same machine; logs and JSON under $OUT/<n>-<tree>.
#   TREES="ab_old ab_new" ARGS="--systems weft,cudnn --head-dims 64" bash benchmarks/ab_attention.sh
# then `python3 benchmarks/ab_table.py $OUT` puts the runs side by side.
set -u
ARGS=${ARGS:---systems weft,cudnn}
export PYTHONUNBUFFERED=1
python3 -m pip uninstall -y -q weft >/dev/null 2>&1  # an editable install would shadow PYTHONPATH
i=0
for tree in $TREES; do
  i=$((i + 1)); name=$i-$(basename "$tree")  # a tree may run twice (a drift check)
  pkg=/tmp/ab_pkg/$tree
  rm -rf "$pkg" && mkdir -p "$pkg" && cp -r "$tree" "$pkg/weft"
  (cd /tmp && PYTHONPATH=$pkg WEFT_CACHE_DIR=/tmp/ab_cache/$tree timeout "${T:-280}" \
     python3 -m weft.benchmarks.attention $ARGS --out "$OUT/$name.json" > "$OUT/$name.log" 2>&1
   echo "$name: rc $? ($(PYTHONPATH=$pkg python3 -c 'import weft; print(weft.__file__)'))")
done
