"""weft.benchmarks: see DESIGN.md."""
