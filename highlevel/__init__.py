"""weft.highlevel: see DESIGN.md."""
