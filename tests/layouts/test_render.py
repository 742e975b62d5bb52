"""Text and SVG pictures of layouts: every cell names the owner the layout maps there."""

import re
import xml.etree.ElementTree as ET

import pytest
from hypothesis import given

from weft.layouts import LayoutError, LinearLayout, blocked, nvmma_shared, wgmma_accumulator
from weft.layouts.render import render_svg, render_text
from weft.layouts.strategies import distributed_layouts, shared_layouts

CELL = re.compile(r"T(\d+):R(\d+)(?:\+(\d+))?")


def table_rows(text):
    """The cells of each table row (after the header and the rule line)."""
    lines = text.splitlines()
    rule = next(i for i, line in enumerate(lines) if set(line.replace("+", "")) == {"-"})
    return [line.split(" | ", 1)[1].split() for line in lines[rule + 1 :] if " | " in line]


@given(distributed_layouts(shape=(8, 16), num_warps=2))
def test_each_cell_names_an_owner_of_that_element(layout):
    rows = table_rows(render_text(layout))
    assert len(rows) == 8 and all(len(r) == 16 for r in rows)
    copies = {}
    for register in range(layout.in_dims["register"]):
        for thread in range(64):
            element = layout(register=register, lane=thread % 32, warp=thread // 32)
            copies.setdefault(element, []).append((thread, register))
    for r, row in enumerate(rows):
        for c, cell in enumerate(row):
            thread, register, more = CELL.fullmatch(cell).groups()
            owners = copies[(r, c)]
            assert (int(thread), int(register)) == min(owners)
            assert int(more or 0) == len(owners) - 1


def test_wgmma_accumulator_table_matches_the_ptx_fragment():
    rows = table_rows(render_text(wgmma_accumulator([64, 64], [4, 1], 64)))
    # PTX ISA wgmma D fragment: lane 0 holds (0, 0), (0, 1); lane 1 starts at column 2.
    assert rows[0][:3] == ["T0:R0", "T0:R1", "T1:R0"]
    assert rows[8][0] == "T0:R2" and rows[16][0] == "T32:R0"


def test_broadcast_cells_list_all_owners_on_request():
    layout = blocked([4, 8], [1, 2], [4, 8], [1, 1], [1, 0])
    text = render_text(layout, owners="all")
    assert "T0:R0|T4:R0" in text and "broadcast" not in text
    assert "T0:R0+1" in render_text(layout)


@given(shared_layouts((16, 64), 16))
def test_shared_cells_show_offset_and_bank(layout):
    inverse = layout.invert()
    for r, row in enumerate(table_rows(render_text(layout))):
        for c, cell in enumerate(row):
            offset, bank = cell.split("/b")
            assert int(offset) == inverse(dim0=r, dim1=c)[0]
            assert int(bank) == (int(offset) * 2 // 4) % 32


def test_bank_width_follows_element_bits():
    layout = nvmma_shared([8, 64], 128, 32)
    rows = table_rows(render_text(layout, element_bits=32, show="bank"))
    assert rows[0][:2] == ["b0", "b1"]


def test_big_layouts_are_cut_with_a_note():
    text = render_text(wgmma_accumulator([128, 256], [4, 1], 256), max_rows=4, max_cols=8)
    rows = table_rows(text)
    assert len(rows) == 4 and all(len(r) == 9 and r[-1] == "..." for r in rows)
    assert "rows 0..3 of 128" in text and "columns 0..7 of 256" in text


def test_one_dimensional_layouts_render_as_one_row():
    layout = LinearLayout({"register": [(1,)], "lane": [(2 << b,) for b in range(5)]}, {"dim0": 64})
    rows = table_rows(render_text(layout))
    assert len(rows) == 1 and rows[0][:3] == ["T0:R0", "T0:R1", "T1:R0"]


def test_svg_is_well_formed_with_one_cell_per_element():
    svg = render_svg(wgmma_accumulator([64, 32], [4, 1], 32))
    root = ET.fromstring(svg)
    rects = root.findall("{http://www.w3.org/2000/svg}rect")
    assert len(rects) == 1 + 64 * 32
    assert len({r.get("fill") for r in rects[1:]}) == 4  # one colour per warp
    shared = ET.fromstring(render_svg(nvmma_shared([8, 64], 128, 16)))
    fills = {r.get("fill") for r in shared.findall("{http://www.w3.org/2000/svg}rect")[1:]}
    assert len(fills) == 32  # one colour per bank


def test_bad_options_are_refused():
    layout = wgmma_accumulator([64, 64], [4, 1], 64)
    with pytest.raises(LayoutError, match="bank"):
        render_svg(layout, color_by="bank")
    with pytest.raises(LayoutError, match="owners"):
        render_text(layout, owners="some")
    with pytest.raises(LayoutError, match="max_rows"):
        render_text(layout, max_rows=0)
