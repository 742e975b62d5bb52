"""weft.compiler: see DESIGN.md."""
