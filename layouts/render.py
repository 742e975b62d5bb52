"""Pictures of layouts: which thread and register owns each element, which bank each
shared-memory element sits in. Text tables for terminals and error messages, SVG for docs.

A distributed layout (in-dims `register`, `lane`, `warp`, `block`) renders one cell per
tensor element, `T5:R2` meaning thread 5 (lane + 32 * warp) holds it in register 2. When
several threads or registers hold one element (a broadcast), the cell shows the first
owner and `+k` for the k other copies, or every owner with `owners="all"`. A shared layout
(in-dim `offset`) renders each element's offset and its bank: the 4-byte word
`offset * element_bits / 8 // 4` modulo 32. Rows are dim0 (for rank 3 and up, every dim
but the last, labelled `i,j`), columns the last dim; a 1-D layout is one row.

Big layouts are cut to `max_rows` x `max_cols` (64 x 64 by default) with a note saying
what was left out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional
from xml.sax.saxutils import escape

import numpy as np

from .errors import LayoutError
from .linear_layout import LinearLayout

BANKS = 32
BANK_BYTES = 4
_PALETTE = (  # one light colour per warp / bank group; text stays readable on all of them
    "#8dd3c7", "#ffffb3", "#bebada", "#fb8072", "#80b1d3", "#fdb462", "#b3de69", "#fccde5",
)
_SHARED_DIMS = ("offset", "block")


@dataclass(frozen=True)
class _Grid:
    """The rendered window of a layout: per visible element, its owners' in-dim values."""

    rows: int  # total rows of the tensor (product of all dims but the last)
    cols: int  # total columns (size of the last dim)
    shown_rows: int
    shown_cols: int
    row_labels: tuple[str, ...]
    owners: tuple[tuple[dict[str, int], ...], ...]  # flat over the window, row-major
    counts: np.ndarray  # number of owners of each visible element, (shown_rows, shown_cols)


def _ordered_out_dims(layout: LinearLayout) -> tuple[str, ...]:
    """Out-dims in tensor order: dim0, dim1, ... when so named, else as given."""
    names = layout.out_dim_names
    if all(n.startswith("dim") and n[3:].isdigit() for n in names):
        return tuple(sorted(names, key=lambda n: int(n[3:])))
    return names


def _grid(layout: LinearLayout, max_rows: int, max_cols: int) -> _Grid:
    if max_rows < 1 or max_cols < 1:
        raise LayoutError(f"max_rows and max_cols must be positive, got {max_rows} and {max_cols}")
    out_names = _ordered_out_dims(layout)
    if not out_names:
        raise LayoutError("cannot render a layout with no out-dims")
    layout = layout.transpose_outs(out_names)
    sizes = [layout.out_dims[n] for n in out_names]
    cols = sizes[-1]
    rows = int(np.prod(sizes[:-1], dtype=np.int64)) if len(sizes) > 1 else 1
    shown_rows, shown_cols = min(rows, max_rows), min(cols, max_cols)

    coords = layout.table()
    element = np.zeros(coords.shape[0], dtype=np.int64)
    for axis, size in enumerate(sizes):
        element = element * size + coords[:, axis]
    row, col = element // cols, element % cols
    visible = np.nonzero((row < shown_rows) & (col < shown_cols))[0]
    # Stable sort keeps the inputs of each element in increasing flat order: lowest
    # warp, then lane, then register first.
    visible = visible[np.argsort(row[visible] * shown_cols + col[visible], kind="stable")]
    cell = row[visible] * shown_cols + col[visible]
    counts = np.bincount(cell, minlength=shown_rows * shown_cols)

    in_values = {}
    shift = 0
    for name, size in layout.in_dims.items():
        in_values[name] = (visible >> shift) & (size - 1)
        shift += size.bit_length() - 1
    names = list(in_values)
    owners: list[list[dict[str, int]]] = [[] for _ in range(shown_rows * shown_cols)]
    columns = [in_values[n].tolist() for n in names]
    for position, c in enumerate(cell.tolist()):
        owners[c].append({n: values[position] for n, values in zip(names, columns)})

    row_labels = []
    for r in range(shown_rows):
        index, parts = r, []
        for size in reversed(sizes[:-1]):
            parts.append(str(index % size))
            index //= size
        row_labels.append(",".join(reversed(parts)))
    return _Grid(
        rows, cols, shown_rows, shown_cols, tuple(row_labels),
        tuple(tuple(o) for o in owners), counts.reshape(shown_rows, shown_cols),
    )


def _is_shared(layout: LinearLayout) -> bool:
    return "offset" in layout.in_dims


def _bank(offset: int, element_bits: int) -> int:
    return (offset * element_bits // 8 // BANK_BYTES) % BANKS


def _owner_label(owner: dict[str, int], layout: LinearLayout, element_bits: int, show: str) -> str:
    """Short text for one owner: `T5:R2`, `B1:T5:R2`, or `17/b8` for shared memory."""
    sizes = layout.in_dims
    parts = []
    if sizes.get("block", 1) > 1:
        parts.append(f"B{owner['block']}")
    if _is_shared(layout):
        offset = owner["offset"]
        bank = _bank(offset, element_bits)
        text = {"offset": str(offset), "bank": f"b{bank}", "both": f"{offset}/b{bank}"}[show]
        parts.append(text)
    else:
        if "lane" in sizes or "warp" in sizes:
            thread = owner.get("lane", 0) + sizes.get("lane", 1) * owner.get("warp", 0)
            parts.append(f"T{thread}")
        if "register" in sizes:
            parts.append(f"R{owner['register']}")
    for name in sizes:
        if name not in ("register", "lane", "warp", "block", "offset"):
            parts.append(f"{name}={owner[name]}")
    return ":".join(parts)


def _cell_text(owners, layout, element_bits, show, all_owners) -> str:
    if not owners:
        return "."
    first = _owner_label(owners[0], layout, element_bits, show)
    if len(owners) == 1:
        return first
    if all_owners:
        return "|".join(_owner_label(o, layout, element_bits, show) for o in owners)
    return f"{first}+{len(owners) - 1}"


def _describe(layout: LinearLayout) -> str:
    ins = " ".join(f"{n}={s}" for n, s in layout.in_dims.items())
    outs = "x".join(str(layout.out_dims[n]) for n in _ordered_out_dims(layout))
    kind = "shared" if _is_shared(layout) else "distributed"
    return f"{kind} layout {outs} ({ins})"


def _legend(layout: LinearLayout, grid: _Grid, element_bits: int, show: str, all_owners: bool) -> list[str]:
    lines = []
    if _is_shared(layout):
        what = {"offset": "offset", "bank": "bank", "both": "offset/bank"}[show]
        lines.append(
            f"cell = {what} of the element; bank = (offset * {element_bits} / 8 // 4) % 32"
        )
    else:
        sizes = layout.in_dims
        fields = ["B<block>"] if sizes.get("block", 1) > 1 else []
        if "lane" in sizes or "warp" in sizes:
            fields.append("T<thread>")
        if "register" in sizes:
            fields.append("R<register>")
        fields += [f"{n}=<{n}>" for n in sizes if n not in ("register", "lane", "warp", "block")]
        legend = "cell = " + ":".join(fields)
        if "lane" in sizes or "warp" in sizes:
            legend += f", thread = lane + {sizes.get('lane', 1)} * warp"
        lines.append(legend)
    counts = grid.counts
    if counts.size and counts.max() > 1:
        if all_owners:
            lines.append("'|' separates the owners of an element held more than once")
        else:
            lines.append("cell+k: the first owner, and k more threads/registers hold the same element (broadcast)")
    if counts.size and counts.min() == 0:
        lines.append(".: no input maps to this element")
    cut = []
    if grid.shown_rows < grid.rows:
        cut.append(f"rows 0..{grid.shown_rows - 1} of {grid.rows}")
    if grid.shown_cols < grid.cols:
        cut.append(f"columns 0..{grid.shown_cols - 1} of {grid.cols}")
    if cut:
        lines.append(f"showing {', '.join(cut)} (raise max_rows / max_cols for more)")
    return lines


def render_text(
    layout: LinearLayout,
    *,
    element_bits: int = 16,
    max_rows: int = 64,
    max_cols: int = 64,
    owners: str = "first",
    show: str = "both",
    title: Optional[str] = None,
) -> str:
    """A table of the tensor with the owner of each element (see the module docstring).

    `owners` is "first" (first owner, `+k` for more) or "all"; `show` picks what shared
    layouts display: "offset", "bank" or "both"; `element_bits` sizes the banks.
    """
    if owners not in ("first", "all"):
        raise LayoutError(f"owners must be 'first' or 'all', got {owners!r}")
    if show not in ("offset", "bank", "both"):
        raise LayoutError(f"show must be 'offset', 'bank' or 'both', got {show!r}")
    grid = _grid(layout, max_rows, max_cols)
    all_owners = owners == "all"
    cells = [
        _cell_text(o, layout, element_bits, show, all_owners) for o in grid.owners
    ]
    width = max([len(c) for c in cells] + [len(str(grid.shown_cols - 1))])
    label_width = max(len(label) for label in grid.row_labels)
    more_cols = grid.shown_cols < grid.cols

    lines = [title or _describe(layout)]
    lines += _legend(layout, grid, element_bits, show, all_owners)
    header = " " * label_width + " | " + " ".join(
        str(c).rjust(width) for c in range(grid.shown_cols)
    )
    lines.append(header + (" ..." if more_cols else ""))
    lines.append("-" * label_width + "-+-" + "-" * (len(header) - label_width - 3))
    for r in range(grid.shown_rows):
        row_cells = cells[r * grid.shown_cols : (r + 1) * grid.shown_cols]
        line = grid.row_labels[r].rjust(label_width) + " | " + " ".join(
            c.rjust(width) for c in row_cells
        )
        lines.append(line + (" ..." if more_cols else ""))
    if grid.shown_rows < grid.rows:
        lines.append("...".rjust(label_width))
    return "\n".join(lines)


def _fill(owner: Optional[dict[str, int]], layout: LinearLayout, color_by: str, element_bits: int) -> str:
    if owner is None:
        return "#ffffff"
    if color_by == "bank":
        key, count = _bank(owner["offset"], element_bits), BANKS
    elif color_by == "thread":
        lanes = layout.in_dims.get("lane", 1)
        key = owner.get("lane", 0) + lanes * owner.get("warp", 0)
        count = lanes * layout.in_dims.get("warp", 1)
    else:
        if color_by not in owner:
            raise LayoutError(
                f"cannot colour by {color_by!r}: the layout's in-dims are {list(layout.in_dims)}"
            )
        key, count = owner[color_by], layout.in_dims[color_by]
    if count <= len(_PALETTE):
        return _PALETTE[key]
    hue = (key * 360.0 / count) % 360.0
    return f"hsl({hue:.0f},65%,78%)"


def render_svg(
    layout: LinearLayout,
    *,
    element_bits: int = 16,
    max_rows: int = 64,
    max_cols: int = 64,
    color_by: Optional[str] = None,
    cell_width: int = 46,
    cell_height: int = 20,
    title: Optional[str] = None,
) -> str:
    """An SVG picture (a string, no dependencies): one coloured cell per element.

    Cells are coloured per warp for distributed layouts and per bank for shared ones
    (`color_by` may be "warp", "lane", "thread", "register", "bank" or any in-dim), and
    carry the same text as `render_text`'s cells.
    """
    shared = _is_shared(layout)
    color_by = color_by or ("bank" if shared else "warp")
    if color_by == "bank" and not shared:
        raise LayoutError("color_by='bank' needs a shared layout (in-dim 'offset')")
    grid = _grid(layout, max_rows, max_cols)
    left, top = 8 + 7 * max(len(label) for label in grid.row_labels), 48
    heading = title or _describe(layout)
    legend = "; ".join(_legend(layout, grid, element_bits, "both", False))
    # Monospace glyphs are about 0.6 em wide: make room for the heading and legend lines.
    width = max(left + grid.shown_cols * cell_width, 8 * len(heading), 6 * len(legend)) + 8
    height = top + grid.shown_rows * cell_height + 8
    font = max(6, min(11, cell_height - 8))
    text = escape(heading)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="monospace" font-size="{font}">',
        f'<rect width="{width}" height="{height}" fill="#ffffff"/>',
        f'<text x="4" y="16" font-size="13">{text}</text>',
    ]
    parts.append(f'<text x="4" y="30" font-size="10">{escape(legend)}</text>')
    for c in range(grid.shown_cols):
        x = left + c * cell_width + cell_width / 2
        parts.append(f'<text x="{x:.1f}" y="{top - 6}" text-anchor="middle">{c}</text>')
    for r in range(grid.shown_rows):
        y = top + r * cell_height
        parts.append(
            f'<text x="{left - 4}" y="{y + cell_height / 2 + font / 3:.1f}" '
            f'text-anchor="end">{escape(grid.row_labels[r])}</text>'
        )
        for c in range(grid.shown_cols):
            owners = grid.owners[r * grid.shown_cols + c]
            x = left + c * cell_width
            fill = _fill(owners[0] if owners else None, layout, color_by, element_bits)
            label = escape(_cell_text(owners, layout, element_bits, "both", False))
            parts.append(
                f'<rect x="{x}" y="{y}" width="{cell_width}" height="{cell_height}" '
                f'fill="{fill}" stroke="#555555" stroke-width="0.5"/>'
            )
            parts.append(
                f'<text x="{x + cell_width / 2:.1f}" y="{y + cell_height / 2 + font / 3:.1f}" '
                f'text-anchor="middle">{label}</text>'
            )
    parts.append("</svg>")
    return "\n".join(parts) + "\n"
