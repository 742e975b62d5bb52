"""Benchmark and probe scripts, run on the GPU machine from the repository root as
`python3 -m benchmarks.<name>` (they import each other as `benchmarks.<name>`). Not part of
the installed package: pyproject.toml leaves this folder out of the wheel."""
