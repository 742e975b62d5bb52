"""The runs of benchmarks/ab_trees.sh side by side: for each tree run, weft's TFLOP/s over
its reference's in the same process (cuDNN for attention, cuBLAS and torch._scaled_mm for
matmul, by CUDA-graph time; cuDNN and cuBLAS again for the eager calls).

    python3 -m benchmarks.ab_summary $OUT
"""

from __future__ import annotations

import glob
import json
import os
import sys


def _attention(rows):
    for row in rows["rows"]:
        weft, ref = row.get("weft", {}).get("tflops"), row.get("cudnn", {}).get("tflops")
        key = f"attn {row['batch']}x{row['heads']}x{row['seq_q']}x{row['head_dim']}{' causal' if row['causal'] else ''}"
        yield key, weft, ref


def _matmul(rows):
    for row in rows:
        ref = next((row[n]["tflops"] for n in ("cublas", "scaled_mm") if "tflops" in row.get(n, {})), None)
        for name, cell in row.items():
            if name.startswith("weft") and isinstance(cell, dict):
                yield f"mm {'x'.join(map(str, row['shape']))} {row['dtype']} {name}", cell.get("tflops"), ref


def _eager(rows):
    """Per shape, weft beside its reference by eager time (do_bench on the Python call) and
    by CUDA-graph time (the GPU work alone)."""
    def rate(row, field):
        ms = row.get(field)
        return row["tflops"] * row["eager_ms"] / ms if ms and row.get("tflops") else None

    refs = {str(r["shape"]): r for r in rows if not r["system"].endswith("weft")}
    for r in rows:
        ref = refs.get(str(r["shape"]), {})
        if r["system"].endswith("weft"):
            for field in ("eager_ms", "graph_ms"):
                yield (f"{field[:-3]} {r['system'].split()[0]} {r['shape']}", rate(r, field),
                       rate(ref, field))


READERS = {"attention": _attention, "matmul": _matmul, "eager": _eager}


def main(folder: str) -> None:
    table: dict[str, dict[str, str]] = {}
    runs = []
    for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
        run, _, what = os.path.basename(path)[:-5].rpartition("-")
        if what not in READERS:
            continue
        runs.append(run) if run not in runs else None
        for key, weft, ref in READERS[what](json.load(open(path))):
            cell = f"{weft:.0f}/{weft / ref:.3f}" if weft and ref else "-"
            table.setdefault(key, {})[run] = cell
    print(f"{'weft TFLOP/s / ratio to reference':>44} " + " ".join(f"{r:>14}" for r in runs))
    for key, cells in table.items():
        print(f"{key:>44} " + " ".join(f"{cells.get(r, '-'):>14}" for r in runs))


if __name__ == "__main__":
    main(sys.argv[1])
