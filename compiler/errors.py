"""Source locations and the one user-facing compilation error."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Loc:
    """Where an op came from in the user's source (1-based line, 0-based column)."""

    file: str = "<unknown>"
    line: int = 0
    col: int = 0
    source_line: str = ""

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


UNKNOWN_LOC = Loc()


class CompilationWarning(UserWarning):
    """Something the user asked for that the compiler did not do (the kernel stays right)."""


def warn_at(loc: Loc, message: str, suggestion: str = "") -> None:
    """A CompilationWarning shown at the user's line."""
    import warnings

    text = message + (f" ({suggestion})" if suggestion else "")
    warnings.warn_explicit(text, CompilationWarning, loc.file, loc.line)


class CompilationError(Exception):
    """An error in the user's kernel, shown at the user's line.

    The message reads: `file:line:col: error: <what>`, then the source line with a caret
    under the column, then `expected ..., found ...` and a suggestion when they are known.
    """

    def __init__(self, message: str, loc: Optional[Loc] = None, *, expected: str = "",
                 found: str = "", suggestion: str = "", notes: tuple[str, ...] = ()):
        self.message = message
        self.loc = loc or UNKNOWN_LOC
        self.expected = expected
        self.found = found
        self.suggestion = suggestion
        # Extra context after the suggestion: rendered layouts, the chain of inlined calls.
        self.notes = tuple(notes)
        super().__init__(self.render())

    def render(self) -> str:
        lines = [f"{self.loc}: error: {self.message}"]
        if self.loc.source_line:
            text = self.loc.source_line.rstrip("\n")
            stripped = text.lstrip()
            indent = len(text) - len(stripped)
            lines.append("    " + stripped)
            lines.append("    " + " " * max(self.loc.col - indent, 0) + "^")
        if self.expected or self.found:
            lines.append(f"  expected: {self.expected}")
            lines.append(f"  found:    {self.found}")
        if self.suggestion:
            lines.append(f"  suggestion: {self.suggestion}")
        for note in self.notes:
            lines.extend("  " + line for line in note.splitlines())
        return "\n".join(lines)
