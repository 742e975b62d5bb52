#!/bin/bash
# One call on the GPU machine for flash attention (issue 5): install, the attention GPU
# tests, compute-sanitizer memcheck and racecheck on a small case, a sweep of kernel
# configs (TFLOP/s per Config, for tuning), then benchmarks/attention.py if it exists.
# Logs and JSON under $OUT. Usage: bash benchmarks/run_attention_gpu.sh [pytest args...]
#   STEPS="tests sanitize sweep bench" (default: all; e.g. STEPS=bench for the benchmark alone)
#   BENCH=quick (default: seq 4096 only) | full (the FA3 grid, several minutes)
#   BENCH_ARGS="--systems weft_persistent,weft_tiles,cudnn,triton --causal only" (passed on)
#   BENCH_TIMEOUT=400, TESTS_TIMEOUT=180 (seconds); pytest args add tests (e.g. `tests` for all)
set -o pipefail
# The kernel cache keys on kernel source and toolchain versions, not on weft's compiler
# source: a cache kept on a warm machine would serve kernels built by an older compiler.
# Key the directory on every Python file of the tree instead.
TREE=$(find . -name '*.py' -not -path './.*' -not -path '*/__pycache__/*' | LC_ALL=C sort | xargs cat | sha1sum | cut -c1-16)
export PYTHONUNBUFFERED=1 WEFT_CACHE_DIR=/tmp/weft-cache/$TREE
OUT=${OUT:-/tmp/weft-out}
BENCH=${BENCH:-quick}
STEPS=${STEPS:-tests sanitize sweep bench}
step() { [[ " $STEPS " == *" $1 "* ]]; }
status=0
mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"

if step tests; then
  timeout "${TESTS_TIMEOUT:-180}" python3 -m pytest -m gpu -q -x -p no:randomly "$@" tests/kernels/test_attention_gpu.py 2>&1 \
    | tee "$OUT/pytest_attention_gpu.log" | tail -30
  status=$?
fi

# Small cases per tool: causal with tails, GQA, the FA3 kernel and the simple one; then
# more tiles than an H200 has SMs, so some persistent CTAs walk two tiles.
SMALL='
import torch
from weft.kernels.attention import Config, flash_attention
torch.manual_seed(0)
for config in (None, Config(head_dim=128, variant="simple")):
    q = torch.randn(1, 4, 200, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 2, 300, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(1, 2, 300, 128, device="cuda", dtype=torch.bfloat16)
    out, lse = flash_attention(q, k, v, causal=True, return_lse=True, config=config)
    torch.cuda.synchronize()
    print("ok", config, out.float().abs().mean().item(), lse.mean().item())
q, k, v = (torch.randn(1, 140, 150, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
out = flash_attention(q, k, v, config=Config(head_dim=64, block_n=128, consumers=3, consumer_regs=160, persistent=True))
torch.cuda.synchronize()
print("ok persistent, 140 tiles", out.float().abs().mean().item())
q, k, v = (torch.randn(1, 2, 300, 256, device="cuda", dtype=torch.bfloat16) for _ in range(3))
out = flash_attention(q, k, v, causal=True)  # head_dim 256: O rescaled per warp (ll.warp_any)
torch.cuda.synchronize()
print("ok head_dim 256", out.float().abs().mean().item())
q, k, v = (torch.randn(2, 4, 1024, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
paired = Config(head_dim=128, cluster=2)  # pairs of query tiles in clusters of two CTAs
out = flash_attention(q, k, v, config=paired)
torch.cuda.synchronize()
print("ok clusters", out.float().abs().mean().item())
'
# racecheck is slow on every shared-memory access: tiny cases per mask (2 tiles of a
# causal GQA problem with tails on persistent CTAs, the tile counter included), then one
# persistent CTA walking 4 tiles at head_dim 64, 128 (non-causal: a partition per consumer
# warpgroup, releasing ring slots warp by warp) and 256, so the Q ring's buffers (two
# tiles' at 64 and 128, three warpgroups' at 256) and the K/V ring wrap around, and at
# head_dim 64 non-causal, whose second tile of each head leaves its third warpgroup out of
# the turns (kernels.turn_takers); then one cluster of two CTAs.
TINY='
import torch
from weft.kernels.attention import Config, flash_attention, host
torch.manual_seed(0)
q = torch.randn(1, 2, 70, 64, device="cuda", dtype=torch.bfloat16)
k, v = (torch.randn(1, 1, 130, 64, device="cuda", dtype=torch.bfloat16) for _ in range(2))
for causal in (False, True):
    out = flash_attention(q, k, v, causal=causal)
    torch.cuda.synchronize()
    print("ok tiny", causal, out.float().abs().mean().item())
# Checked on the CPU (float64): a reference kernel would run under racecheck too.
walk = lambda *args: 1
for d, causal in ((64, True), (64, False), (128, False), (256, True)):
    q, k, v = (torch.randn(1, 2, 200 if d == 256 else 300, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    host.persistent_grid, grid = walk, host.persistent_grid
    out = flash_attention(q, k, v, causal=causal)
    host.persistent_grid = grid
    q, k, v, out = (x.cpu().double() for x in (q, k, v, out))
    mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).triu(1) & causal
    ref = torch.softmax((q @ k.transpose(-1, -2) / d ** 0.5).masked_fill(mask, float("-inf")), -1) @ v
    print("ok one CTA", d, causal, ((out - ref).norm() / ref.norm()).item())
# One cluster of two CTAs walking two pairs of query tiles (two heads of two tiles), each
# CTA loading half of every K/V tile into both by multicast, releasing slots on both.
q, k, v = (torch.randn(1, 2, 256, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
host.persistent_cluster_grid, grid = (lambda *args: 2), host.persistent_cluster_grid
out = flash_attention(q, k, v, config=Config(head_dim=128, cluster=2))
host.persistent_cluster_grid = grid
q, k, v, out = (x.cpu().double() for x in (q, k, v, out))
ref = torch.softmax(q @ k.transpose(-1, -2) / 128 ** 0.5, -1) @ v
print("ok one cluster", ((out - ref).norm() / ref.norm()).item())
'
for tool in memcheck racecheck; do
  step sanitize || break
  script=$SMALL; [ $tool = racecheck ] && script=$TINY
  timeout 200 compute-sanitizer --tool $tool --report-api-errors no --error-exitcode 9 python3 -c "$script" \
    >"$OUT/sanitizer_attention_$tool.log" 2>&1
  echo "compute-sanitizer $tool: exit $? ($(grep -c 'ERROR SUMMARY' "$OUT/sanitizer_attention_$tool.log") summaries)"
  grep -E 'SUMMARY|WRONG|Error|^ok' "$OUT/sanitizer_attention_$tool.log" | head -6
done

# Configs side by side (CUDA events, 20 launches after a warm-up); bf16, bhsd.
SWEEP='
import json, math, sys, torch
from weft.kernels.attention import Config, default_config, flash_attention
C = Config
cases = {
    (4, 16, 4096, 128): [None, C(head_dim=128, stages=3), C(head_dim=128, block_n=64, stages=4),
                         C(head_dim=128, variant="simple"), C(head_dim=128, consumers=1)],
    (4, 32, 4096, 64): [None, C(head_dim=64), C(head_dim=64, block_n=64, consumers=3, consumer_regs=160),
                        C(head_dim=64, block_n=128, consumers=3, consumer_regs=160, stages=3),
                        C(head_dim=64, stages=4), C(head_dim=64, variant="simple")],
    (4, 8, 4096, 256): [None, C(head_dim=256, block_n=32, stages=4),
                        C(head_dim=256, block_n=64, variant="simple")],
}
rows = []
for (b, h, s, d), configs in cases.items():
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    for causal in (False, True):
        ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        for config in configs:
            name = "default" if config is None else str(config)
            try:
                out = flash_attention(q, k, v, causal=causal, config=config)
                error = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(20):
                    flash_attention(q, k, v, causal=causal, config=config)
                end.record()
                end.synchronize()
                seconds = start.elapsed_time(end) / 20 / 1e3
                tflops = 4 * b * h * s * s * d * (0.5 if causal else 1) / seconds / 1e12
                row = dict(shape=[b, h, s, d], causal=causal, config=name, tflops=round(tflops, 1), error=error)
            except Exception as exc:
                row = dict(shape=[b, h, s, d], causal=causal, config=name, failed=f"{type(exc).__name__}: {exc}"[:300])
            rows.append(row)
            print(json.dumps(row), flush=True)
json.dump(rows, open(sys.argv[1], "w"), indent=1)
'
if step sweep; then
  timeout 150 python3 -c "$SWEEP" "$OUT/attention_sweep.json" 2>&1 | tee "$OUT/attention_sweep.log" | tail -40
fi

if step bench && [ -f benchmarks/attention.py ]; then
  flag=--quick; [ "$BENCH" = full ] && flag=
  timeout "${BENCH_TIMEOUT:-400}" python3 -m benchmarks.attention $flag $BENCH_ARGS --out "$OUT/attention.json" 2>&1 \
    | tee "$OUT/attention.log" | tail -50
fi
exit $status
