"""The NVPTX target through llvmlite.binding: the only module of weft that imports it.

LLVM is set up once per process: the NVPTX target and printer are registered, and
`--nvptx-short-ptr` makes shared (addrspace 3), const and local pointers 32 bits wide,
as Triton does, so shared-memory address math stays in 32-bit registers.
"""

from __future__ import annotations

import functools

import llvmlite.binding as llvm

from ..errors import CompilationError

TRIPLE = "nvptx64-nvidia-cuda"
CPU = "sm_90a"
FEATURES = "+ptx80"


@functools.lru_cache(maxsize=None)
def _target_machine():
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    llvm.set_option("", "--nvptx-short-ptr")
    target = llvm.Target.from_triple(TRIPLE)
    return target.create_target_machine(cpu=CPU, features=FEATURES, opt=3)


def data_layout() -> str:
    """The datalayout string the NVPTX target machine expects (32-bit shared pointers)."""
    return str(_target_machine().target_data)


def llvm_version() -> str:
    return ".".join(map(str, llvm.llvm_version_info))


def optimize(llir: str) -> "llvm.ModuleRef":
    """Parse and verify LLVM IR text, then run LLVM's O3 pipeline (new pass manager)."""
    try:
        module = llvm.parse_assembly(llir)
        module.verify()
    except RuntimeError as error:
        raise CompilationError(f"internal error: LLVM rejected the IR the backend generated: {error}") from error
    tuning = llvm.create_pipeline_tuning_options(speed_level=3)
    builder = llvm.create_pass_builder(_target_machine(), tuning)
    builder.getModulePassManager().run(module, builder)
    return module


def emit_ptx(llir: str) -> str:
    """LLVM IR text -> PTX text for sm_90a (.version 8.0), after the O3 pipeline."""
    module = optimize(llir)
    return _target_machine().emit_assembly(module)


def optimized_llir(llir: str) -> str:
    """The LLVM IR after the O3 pipeline, for dumps."""
    return str(optimize(llir))
