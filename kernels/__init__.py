"""weft.kernels: see docs/design.md."""
