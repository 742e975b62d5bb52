#!/bin/bash
# Warp-stall sampling per SASS instruction (Nsight Compute's source page) of weft's attention
# kernel beside cuDNN's, one launch each, for shapes given as profile_attention's specs.
#   OUT=dir SHAPES="32,32,512,64:causal 4,16,4096,128" bash benchmarks/ncu_source.sh
# --clock-control none: the card runs at the clock it finds (device METHOD.md: leave clocks alone).
set -u
OUT=${OUT:-/tmp/ncu_source}
SYSTEMS=${SYSTEMS:-weft,cudnn}
mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
for spec in ${SHAPES:-32,32,512,64:causal 4,16,4096,128}; do
    name=$(echo "$spec" | tr ',:' '_-')
    timeout 240 ncu --clock-control none --profile-from-start off --section SpeedOfLight --section SourceCounters --section WarpStateStats \
        --section SchedulerStats --section InstructionStats -f -o "$OUT/$name" \
        python3 -m benchmarks.profile_attention "$spec" --systems "$SYSTEMS" > "$OUT/$name.log" 2>&1
    echo "$spec: ncu rc $?"
    ncu -i "$OUT/$name.ncu-rep" --page source --csv --print-source sass > "$OUT/$name.sass.csv" 2>&1
    ncu -i "$OUT/$name.ncu-rep" --page details --csv > "$OUT/$name.details.csv" 2>&1
done
ls -la "$OUT"
