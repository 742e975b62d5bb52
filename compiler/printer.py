"""Stable text form of the IR, used by dumps and golden tests.

Values print as `%name` (the Python name the user bound, numbered when reused) or `%N`.
Layouts print once, as aliases `#L0 = ...` at the top, and by alias at each use, so a
dump stays readable however large the layouts are.
"""

from __future__ import annotations

from typing import Any

from ..layouts import LinearLayout
from .ir import Block, Kernel, Op, Value
from .types import SharedType, TensorType


def format_layout(layout: LinearLayout) -> str:
    parts = []
    for name, rows in layout.bases.items():
        if not rows:
            continue
        parts.append(f"{name}=[" + ", ".join("(" + ",".join(map(str, r)) + ")" for r in rows) + "]")
    outs = "x".join(str(s) for s in layout.out_dims.values())
    return "{" + " ".join(parts) + f"}} -> [{outs}]"


class Printer:
    def __init__(self):
        self.names: dict[Value, str] = {}
        self.used: dict[str, int] = {}
        self.layouts: dict[LinearLayout, str] = {}

    def name(self, value: Value) -> str:
        if value not in self.names:
            base = value.hint or ""
            if base and base not in self.used:
                self.used[base] = 0
                self.names[value] = f"%{base}"
            else:
                index = len(self.names)
                self.names[value] = f"%{base}_{index}" if base else f"%{index}"
        return self.names[value]

    def layout(self, layout: LinearLayout) -> str:
        if layout not in self.layouts:
            self.layouts[layout] = f"#L{len(self.layouts)}"
        return self.layouts[layout]

    def type(self, t) -> str:
        if isinstance(t, TensorType):
            shape = "x".join(map(str, t.shape))
            suffix = f", {self.layout(t.layout)}" if t.layout is not None else ""
            return f"tensor<{shape}x{t.element}{suffix}>"
        if isinstance(t, SharedType):
            shape = "x".join(map(str, t.shape))
            return f"shared<{shape}x{t.element}, {self.layout(t.layout)}>"
        return str(t)

    def attribute(self, value: Any) -> str:
        if hasattr(value, "describe"):
            return value.describe()
        if isinstance(value, str):
            return value
        return repr(value)

    def op_lines(self, op: Op, indent: str) -> list[str]:
        results = op.defines()
        head = ", ".join(self.name(r) for r in results)
        head = f"{head} = " if head else ""
        operands = ", ".join(self.name(v) for v in op.uses())
        attributes = " ".join(f"{k}={self.attribute(v)}" for k, v in op.attributes().items())
        text = f"{indent}{head}{op.NAME}"
        if attributes:
            text += f" [{attributes}]"
        if operands:
            text += f" {operands}"
        if results:
            text += " : " + ", ".join(self.type(r.type) for r in results)
        lines = [text]
        for index, region in enumerate(op.nested_blocks()):
            args = ", ".join(f"{self.name(a)}: {self.type(a.type)}" for a in region.args)
            lines[-1] += " {" if index == 0 else ""
            if index > 0:
                lines.append(f"{indent}}} {{")
            if args:
                lines.append(f"{indent}  ^({args})")
            lines.extend(self.block_lines(region, indent + "  "))
        if op.nested_blocks():
            lines.append(f"{indent}}}")
        return lines

    def block_lines(self, block: Block, indent: str) -> list[str]:
        lines = []
        for op in block.ops:
            lines.extend(self.op_lines(op, indent))
        return lines


def print_kernel(kernel: Kernel) -> str:
    """The kernel as stable text: layout aliases, signature, then the body."""
    printer = Printer()
    params = ", ".join(f"{printer.name(p)}: {printer.type(p.type)}" for p in kernel.params)
    body = printer.block_lines(kernel.body, "  ")
    header = [f"{alias} = {format_layout(layout)}" for layout, alias in printer.layouts.items()]
    attrs = f"num_warps={kernel.num_warps}"
    if kernel.shared_bytes:
        attrs += f" shared={kernel.shared_bytes}"
    lines = header + [f"kernel @{kernel.name}({params}) {attrs} {{"] + body + ["}"]
    return "\n".join(lines) + "\n"
