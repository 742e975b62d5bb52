"""Helpers the highlevel language tests share: compile to PTX through ptxas, and find the
line of a kernel's source an error should point at."""

import inspect

import pytest

from weft.compiler.backend import ptxas
from weft.compiler.errors import CompilationError
from weft.compiler.frontend import build_kernel

HAS_PTXAS = ptxas.find_ptxas() is not None


def ptx_through_ptxas(kernel, signature: dict, constexprs: dict, **options) -> str:
    """The kernel's PTX; where ptxas is installed, also assembled by it without spills."""
    compiled = kernel.compile(signature=signature, constexprs=constexprs, **options)
    if HAS_PTXAS:
        assert "cubin" in compiled.asm
        assert compiled.metadata["spill_stores"] == 0 and compiled.metadata["spill_loads"] == 0
    return compiled.asm["ptx"]


def error_of(fn, signature: dict, constexprs: dict = None) -> CompilationError:
    with pytest.raises(CompilationError) as info:
        build_kernel(fn, signature, constexprs or {}, 4, language="highlevel")
    return info.value


def line_of(fn, text: str) -> int:
    lines, first = inspect.getsourcelines(fn.fn)
    return first + next(i for i, line in enumerate(lines) if text in line)
