"""The NVPTX target through llvmlite.binding: the only module of weft that imports it.

LLVM is set up once per process: the NVPTX target and printer are registered, and
`--nvptx-short-ptr` makes shared (addrspace 3), const and local pointers 32 bits wide,
as Triton does, so shared-memory address math stays in 32-bit registers.

Math that Triton takes from libdevice (log, sin, erf, fp64 exp, pow, ...: see
lower_math.py) is lowered to calls of libdevice's `__nv_*` functions. A module that calls
one gets libdevice linked in before the O3 pipeline: its functions are made internal, so
the pipeline inlines those called and drops the rest, and no external symbol reaches the
PTX; a module that calls none is not touched. Like Triton, the module flag
`nvvm-reflect-ftz` = 1 makes libdevice's `__nvvm_reflect("__CUDA_FTZ")` branches take the
flush-to-zero paths (the NVVMReflect pass that the NVPTX target adds at the start of the
pipeline folds them), so the instructions chosen match Triton's bit for bit.
"""

from __future__ import annotations

import functools
import re

import llvmlite.binding as llvm

from ..cuda_tools import find_libdevice
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


LIBDEVICE_PREFIX = "__nv_"
_CALLS_LIBDEVICE = re.compile(r'^declare [^@\n]*@"?' + LIBDEVICE_PREFIX, re.MULTILINE)
_UNFUSABLE = re.compile(r"= (fmul|fadd|fsub) (?!contract)")
# Override (behaviour 4) so the flag wins over any other value when modules are linked.
_REFLECT_FLAGS = '''!llvm.module.flags = !{!0}
!0 = !{i32 4, !"nvvm-reflect-ftz", i32 1}
'''


@functools.lru_cache(maxsize=None)
def _libdevice_bitcode() -> bytes:
    path = find_libdevice()
    if path is None:
        raise CompilationError("this kernel calls libdevice math (log, sin, erf, fp64 exp, pow, ...), "
                               "and libdevice.10.bc was not found",
                               suggestion="install the `nvidia-cuda-nvcc` wheel (a dependency of weft)")
    with open(path, "rb") as file:
        return file.read()


def calls_libdevice(llir: str) -> bool:
    return _CALLS_LIBDEVICE.search(llir) is not None


def _pass_builder():
    return llvm.create_pass_builder(_target_machine(), llvm.create_pipeline_tuning_options())


@functools.lru_cache(maxsize=None)
def _libdevice_subset(names: frozenset) -> bytes:
    """Bitcode of the libdevice functions `names` and what they call, nothing else.
    Parsing and linking all of libdevice costs about as much as compiling a small kernel;
    this subset is cut once per process for each set of functions kernels call."""
    library = llvm.parse_bitcode(_libdevice_bitcode())
    for function in library.functions:
        if not function.is_declaration and function.name not in names:
            function.linkage = "internal"
    dead_code = llvm.create_new_module_pass_manager()
    dead_code.add_global_dead_code_eliminate_pass()
    dead_code.run(library, _pass_builder())
    # Triton's target machine allows FP contraction everywhere (AllowFPOpFusion = Fast),
    # so libdevice's plain multiplies and adds may fuse into FMAs and print as mul.f32,
    # not mul.rn.f32. weft's own arithmetic carries `contract` flags; giving libdevice's
    # the same flag reproduces Triton's instructions.
    text = _UNFUSABLE.sub(r"= \1 contract ", str(library))
    return llvm.parse_assembly(text).as_bitcode()


def link_libdevice(module: "llvm.ModuleRef") -> None:
    """Link the libdevice functions `module` calls, made internal (the O3 pipeline inlines
    them), with the reflect flags Triton sets."""
    called = frozenset(f.name for f in module.functions if f.is_declaration and f.name.startswith(LIBDEVICE_PREFIX))
    library = llvm.parse_bitcode(_libdevice_subset(called))
    library.triple, library.data_layout = module.triple, module.data_layout
    defined = {function.name for function in library.functions if not function.is_declaration}
    module.link_in(library)
    for function in module.functions:  # internal only once linked: declarations bind to externals
        if function.name in defined:
            function.linkage = "internal"
    flags = llvm.parse_assembly(_REFLECT_FLAGS)
    flags.triple, flags.data_layout = module.triple, module.data_layout
    module.link_in(flags)


def optimize(llir: str) -> "llvm.ModuleRef":
    """Parse and verify LLVM IR text (linking libdevice where it is called), then run
    LLVM's O3 pipeline (new pass manager)."""
    try:
        module = llvm.parse_assembly(llir)
        module.verify()
    except RuntimeError as error:
        raise CompilationError(f"internal error: LLVM rejected the IR the backend generated: {error}") from error
    if calls_libdevice(llir):
        link_libdevice(module)
    tuning = llvm.create_pipeline_tuning_options(speed_level=3)
    builder = llvm.create_pass_builder(_target_machine(), tuning)
    builder.getModulePassManager().run(module, builder)
    return module


# tensormap.replace and the tensormap proxy fences came with PTX ISA 8.3; only kernels that
# write tensor maps declare it, so every other kernel's PTX stays as it was.
TENSORMAP_PTX_VERSION = ".version 8.3"


def emit_ptx(llir: str) -> str:
    """LLVM IR text -> PTX text for sm_90a (.version 8.0, or 8.3 with tensormap.replace),
    after the O3 pipeline."""
    module = optimize(llir)
    ptx = _target_machine().emit_assembly(module)
    if "tensormap.replace" in ptx:
        ptx = re.sub(r"^\.version \d+\.\d+$", TENSORMAP_PTX_VERSION, ptx, count=1, flags=re.M)
    return ptx


def optimized_llir(llir: str) -> str:
    """The LLVM IR after the O3 pipeline, for dumps."""
    return str(optimize(llir))
