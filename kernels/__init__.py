"""weft.kernels: see DESIGN.md."""
