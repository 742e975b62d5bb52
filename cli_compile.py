"""`weft compile FILE.py:KERNEL`: compile one kernel for sm_90a and print a stage.

    weft compile kernels/softmax.py:softmax_kernel \\
        --signature out_ptr=*fp32 in_ptr=*fp32 in_row_stride=i32 ... \\
        --constexpr BLOCK=4096 VEC=4 WARPS=8 --num-warps 8 --dump ptx

Stages: source, layout (explicit IR after the lowlevel passes), llir, ptx, sass (needs
cuobjdump), report (ptxas's registers/spills/shared memory). No GPU is needed.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

STAGES = ("source", "layout", "llir", "ptx", "sass", "report")


def load_kernel(parser, target: str):
    """The JIT function KERNEL defined in FILE.py (given as FILE.py:KERNEL)."""
    path, _, name = target.rpartition(":")
    if not path or not name:
        parser.error(f"argument TARGET: expected FILE.py:KERNEL, got {target!r}")
    if not Path(path).is_file():
        parser.error(f"argument TARGET: no such file {path!r}")
    module = _import_file(Path(path).resolve())
    kernel = getattr(module, name, None)
    if kernel is None or not hasattr(kernel, "compile"):
        found = sorted(k for k, v in vars(module).items() if hasattr(v, "compile") and hasattr(v, "fn"))
        parser.error(f"argument TARGET: {path} defines no kernel {name!r}; kernels there: {', '.join(found) or 'none'}")
    return kernel


def _import_file(path: Path):
    """Import a kernel file: by module name when it lies inside weft (relative imports
    work then), else as a standalone module."""
    import weft

    package_root = Path(weft.__file__).resolve().parent
    if package_root in path.parents:
        parts = path.relative_to(package_root).with_suffix("").parts
        return importlib.import_module(".".join(("weft",) + parts))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # inspect.getsource needs the module registered
    spec.loader.exec_module(module)
    return module


def parse_pairs(parser, option: str, items, literal: bool) -> dict:
    """NAME=VALUE pairs; VALUE as a Python literal when `literal` (ints, floats, tuples)."""
    pairs = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            parser.error(f"argument {option}: expected NAME=VALUE, got {item!r}")
        if literal:
            try:
                value = ast.literal_eval(value)
            except (ValueError, SyntaxError):
                parser.error(f"argument {option}: {key}={value!r} is not a Python literal")
        pairs[key] = value
    return pairs


def find_cuobjdump():
    found = shutil.which("cuobjdump")
    if found:
        return found
    try:
        import nvidia.cu13  # the nvidia-cuda-cuobjdump wheel puts it here
        candidate = Path(list(nvidia.cu13.__path__)[0]) / "bin" / "cuobjdump"
        return str(candidate) if candidate.exists() else None
    except ImportError:
        return None


def sass_of(parser, cubin: bytes) -> str:
    tool = find_cuobjdump()
    if tool is None:
        parser.error("--dump sass needs cuobjdump (CUDA toolkit, or pip install nvidia-cuda-cuobjdump "
                     "nvidia-cuda-nvdisasm); the ptx stage needs nothing")
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        env = dict(os.environ, PATH=os.environ.get("PATH", "") + os.pathsep + str(Path(tool).parent))
        result = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True, env=env)
    finally:
        os.unlink(f.name)
    if result.returncode:
        parser.error(f"cuobjdump failed: {result.stderr.strip()}")
    return result.stdout


def compile_command(parser, args) -> int:
    kernel = load_kernel(parser, args.target)
    signature = parse_pairs(parser, "--signature", args.signature, literal=False)
    constexprs = parse_pairs(parser, "--constexpr", args.constexpr, literal=True)
    specialization = {name: "divisible_by_16" for name in (args.aligned or ())}
    compiled = kernel.compile(signature=signature, constexprs=constexprs, num_warps=args.num_warps,
                              specialization=specialization)
    if args.dump == "sass" or args.dump == "report":
        if not compiled.asm.get("cubin"):
            parser.error(f"--dump {args.dump} needs ptxas (pip install nvidia-cuda-nvcc, or set WEFT_PTXAS)")
    if args.dump == "sass":
        print(sass_of(parser, compiled.asm["cubin"]))
    elif args.dump == "report":
        keys = ("registers", "spill_stores", "spill_loads", "stack_frame", "shared")
        print(" ".join(f"{k}={compiled.metadata.get(k)}" for k in keys))
    else:
        print(compiled.asm[args.dump])
    return 0


def add_compile_parser(commands) -> None:
    parser = commands.add_parser(
        "compile", help="compile a kernel for sm_90a and print one stage",
        description=__doc__.split("\n\n")[0],
    )
    parser.set_defaults(run=compile_command, parser=parser)
    parser.add_argument("target", metavar="TARGET", help="FILE.py:KERNEL")
    parser.add_argument("--signature", nargs="+", metavar="NAME=TYPE", required=True,
                        help='runtime parameters and their types, e.g. x_ptr=*fp32 n=i32')
    parser.add_argument("--constexpr", nargs="+", metavar="NAME=VALUE", help="constexpr values, e.g. BLOCK=1024")
    parser.add_argument("--num-warps", type=int, default=4, help="warps per CTA (default 4)")
    parser.add_argument("--aligned", nargs="+", metavar="NAME",
                        help="parameters known divisible by 16 (pointers: 16-byte aligned), as a launch would specialise")
    parser.add_argument("--dump", choices=STAGES, default="ptx", help="stage to print (default ptx)")
