#!/bin/bash
# Nsight Compute on the tutorial's attention backward kernel, Triton's beside weft.highlevel's
# (benchmarks/profile_tutorial_backward.py), one profiled launch each, and a short table of
# what the loops' speed turns on (benchmarks/ncu_table.py): time, SM and memory throughput,
# occupancy and its limits, registers, shared memory, warp stall reasons, tensor pipe.
#   HEAD_DIM=64 SYSTEMS=triton,weft.hl MASKS=nocausal,causal bash benchmarks/ncu_tutorial_backward.sh
# --clock-control none: the card runs at the clock it finds (device METHOD.md: leave clocks alone).
set -u
OUT=${OUT:-/tmp/ncu_tutorial_backward}
mkdir -p "$OUT"
name="d${HEAD_DIM:-64}"
SECTIONS="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats
    --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis"
METRICS='regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,regex:sm__pipe_tensor.*cycles_active\.avg\.pct_of_peak_sustained_active'
run() {
    timeout 150 ncu --clock-control none --kernel-name regex:attention_backward_kernel $SECTIONS "$@" \
        -f -o "$OUT/$name" python3 -m benchmarks.profile_tutorial_backward "${HEAD_DIM:-64}" \
        "${SYSTEMS:-triton,weft.hl}" "${MASKS:-nocausal,causal}" > "$OUT/$name.log" 2>&1
}
run --metrics "$METRICS" || { echo "ncu with --metrics failed (rc $?): sections only"; tail -3 "$OUT/$name.log"; run; }
echo "ncu rc $?"; grep -v "^==PROF==" "$OUT/$name.log" | tail -4
ncu -i "$OUT/$name.ncu-rep" --page details --csv > "$OUT/$name.details.csv" 2>&1
ncu -i "$OUT/$name.ncu-rep" --page raw --csv > "$OUT/$name.raw.csv" 2>&1
python3 -m benchmarks.ncu_table "$OUT/$name.details.csv" "$OUT/$name.raw.csv"
