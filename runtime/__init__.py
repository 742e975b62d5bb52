"""weft.runtime: see DESIGN.md."""
