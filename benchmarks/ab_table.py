"""TFLOP/s of every system in every attention JSON under a folder, side by side: one row
per shape, one column per (file, system). For A/Bs (benchmarks/ab_attention.sh writes
one JSON per tree run) and runs with several `weft:field=value` systems.

    python -m benchmarks.ab_table $OUT
"""

from __future__ import annotations

import glob
import json
import os
import sys


def table(folder: str) -> str:
    cells: dict[tuple, dict[tuple[str, str], str]] = {}
    for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
        name = os.path.basename(path)[:-len(".json")]
        try:
            rows = json.load(open(path))["rows"]
        except (OSError, ValueError, KeyError) as error:
            print(f"{name}: not an attention result ({error!r})", file=sys.stderr)
            continue
        for row in rows:
            shape = (row["head_dim"], row["causal"], row["batch"], row["heads"], row["seq_q"])
            for system, cell in row.items():
                if isinstance(cell, dict) and ("tflops" in cell or "reason" in cell):
                    value = cell.get("tflops")
                    text = f"{value:.0f}" if value else str(cell.get("reason", "?"))[:10]
                    cells.setdefault(shape, {})[(name, system)] = text
    columns = sorted({column for shape in cells.values() for column in shape})
    lines = ["shape".ljust(24) + "".join(f"{f[:8]}.{s.replace('weft:', 'w:')[:12]}".rjust(23)
                                         for f, s in columns)]
    for shape in sorted(cells):
        d, causal, batch, heads, seq = shape
        label = f"d{d} {'causal' if causal else 'full'} {batch}x{heads}x{seq}"
        lines.append(label.ljust(24) + "".join(cells[shape].get(c, "-").rjust(23) for c in columns))
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(sys.argv[1] if len(sys.argv) > 1 else "."))
