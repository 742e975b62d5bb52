"""The emulator's one error: what went wrong, at which source line, in which program."""

from __future__ import annotations

from typing import Optional

from ...compiler.errors import UNKNOWN_LOC, Loc


def source_lines(loc: Loc) -> list[str]:
    if not loc.source_line:
        return []
    text = loc.source_line.rstrip("\n")
    stripped = text.lstrip()
    indent = len(text) - len(stripped)
    return ["    " + stripped, "    " + " " * max(loc.col - indent, 0) + "^"]


class EmulationError(Exception):
    """A kernel did something the GPU would get wrong or fault on, found by the emulator.

    Reads like a `CompilationError`: `file:line:col: emulation error: <what>`, the source
    line with a caret, then (for races) the other access's line, then the program id.
    """

    def __init__(self, message: str, loc: Optional[Loc] = None, *, other_loc: Optional[Loc] = None,
                 other_what: str = "conflicting access", program: Optional[tuple] = None):
        self.message = message
        self.loc = loc or UNKNOWN_LOC
        self.other_loc = other_loc
        self.other_what = other_what
        self.program = program
        super().__init__(self.render())

    def with_program(self, program: tuple) -> "EmulationError":
        if self.program is not None:
            return self
        return EmulationError(self.message, self.loc, other_loc=self.other_loc,
                              other_what=self.other_what, program=program)

    def render(self) -> str:
        lines = [f"{self.loc}: emulation error: {self.message}"]
        lines += source_lines(self.loc)
        if self.other_loc is not None:
            lines.append(f"  {self.other_what} at {self.other_loc}")
            lines += source_lines(self.other_loc)
        if self.program is not None:
            lines.append(f"  in program {tuple(int(p) for p in self.program)}")
        return "\n".join(lines)
