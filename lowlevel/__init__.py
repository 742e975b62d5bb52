"""weft.lowlevel: see DESIGN.md."""
