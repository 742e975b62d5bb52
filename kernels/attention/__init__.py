"""weft.kernels.attention: see DESIGN.md."""
