"""A short table from Nsight Compute's CSV pages of a few launches (benchmarks/ncu_tutorial_backward.sh):
one column a profiled launch, in launch order, named from the profiled script's "launched ..."
lines where the log beside the CSVs has them; rows the metrics that say where a loop's time
goes. Usage: python3 -m benchmarks.ncu_table DETAILS.csv RAW.csv"""

from __future__ import annotations

import csv
import os
import re
import sys

DETAILS = ("Duration", "Compute (SM) Throughput", "Memory Throughput", "L2 Cache Throughput", "DRAM Throughput",
           "Registers Per Thread", "Dynamic Shared Memory Per Block", "Static Shared Memory Per Block",
           "Theoretical Occupancy", "Achieved Occupancy", "Block Limit Registers", "Block Limit Shared Mem",
           "Warp Cycles Per Issued Instruction", "Issue Slots Busy", "Executed Ipc Active", "L1/TEX Hit Rate",
           "L2 Hit Rate", "Mem Busy", "Max Bandwidth")
STALL = re.compile(r"smsp__average_warps_issue_stalled_(.*)_per_issue_active\.ratio")
RAW = re.compile(r"sm__pipe_tensor.*|sm__inst_executed_pipe_tensor.*")


def _names(details_path: str, count: int) -> list[str]:
    log = re.sub(r"\.details\.csv$", ".log", details_path)
    names = re.findall(r"^launched (.*)$", open(log).read(), re.M) if os.path.exists(log) else []
    return names if len(names) == count else [f"launch {i}" for i in range(count)]


def main(details_path: str, raw_path: str) -> None:
    rows = [row for row in csv.DictReader(line for line in open(details_path) if line.startswith('"'))]
    ids = sorted({row["ID"] for row in rows}, key=int)
    table: dict[str, dict[str, str]] = {}
    for row in rows:
        if row["Metric Name"] in DETAILS:
            table.setdefault(f"{row['Metric Name']} ({row['Metric Unit']})", {})[row["ID"]] = row["Metric Value"]
    raw = list(csv.reader(line for line in open(raw_path) if line.startswith('"')))
    if len(raw) > 2:
        header, launches = raw[0], raw[2:]
        for column, metric in enumerate(header):
            match = STALL.fullmatch(metric)
            label = f"stall {match.group(1)}" if match else \
                metric.replace(".avg.pct_of_peak_sustained_active", " %") if RAW.fullmatch(metric) else None
            if label is None:
                continue
            values = {ids[i]: launch[column] for i, launch in enumerate(launches) if i < len(ids)}
            if match and all(_number(value) < 0.05 for value in values.values()):
                continue  # a stall reason no launch spends time on
            table[label] = values
    names = _names(details_path, len(ids))
    width = max([len(name) for name in table] + [10])
    print(f"{'':<{width}}" + "".join(f"{name[:22]:>24}" for name in names))
    for name, values in table.items():
        print(f"{name:<{width}}" + "".join(f"{values.get(i, '-')[:22]:>24}" for i in ids))


def _number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


if __name__ == "__main__":
    main(*sys.argv[1:3])
