"""weft.compiler: see docs/design.md."""
