"""`weft compile TARGET`: compile one kernel for sm_90a and print a stage.

TARGET is FILE.py:KERNEL (a kernel in your file) or MODULE:KERNEL (an importable module,
such as one of weft's own kernels):

    weft compile weft.kernels.vector_add:add_kernel \\
        --signature x_ptr=*fp32 y_ptr=*fp32 out_ptr=*fp32 n=i32 \\
        --constexpr BLOCK=1024 VEC=4 WARPS=4 --num-warps 4 \\
        --aligned x_ptr y_ptr out_ptr n --dump ptx

Stages: source, layout (explicit IR after the lowlevel passes), llir, ptx, sass (needs
cuobjdump: the `sass` extra), report (ptxas's registers/spills/shared memory). No GPU is
needed. Bad arguments exit with status 2 naming the argument; a kernel that does not
compile, a file that does not import or a missing tool exit with status 1 and one line.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import inspect
import os
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

from .compiler.hardware import MAX_WARPS

STAGES = ("source", "layout", "llir", "ptx", "sass", "report")


class CommandError(Exception):
    """A failure `weft compile` reports in one line (exit status 1), not a bad argument."""


def _num_warps(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1 or value > MAX_WARPS or value & (value - 1):
        raise argparse.ArgumentTypeError(f"{value} is not a power of two from 1 to {MAX_WARPS}")
    return value


def load_kernel(parser, target: str):
    """The JIT function KERNEL defined in FILE.py or MODULE (given as FILE.py:KERNEL or
    MODULE:KERNEL)."""
    path, _, name = target.rpartition(":")
    if not path or not name:
        parser.error(f"argument TARGET: expected FILE.py:KERNEL or MODULE:KERNEL, got {target!r}")
    if Path(path).is_file():
        module = _import_user_code(path, lambda: _import_file(Path(path).resolve()))
    elif path.endswith(".py") or "/" in path or os.sep in path or \
            not all(part.isidentifier() for part in path.split(".")):
        parser.error(f"argument TARGET: no such file {path!r}")
    else:
        module = _import_user_code(path, lambda: _import_module(parser, path))
    kernel = getattr(module, name, None)
    if kernel is None or not hasattr(kernel, "compile"):
        found = sorted(k for k, v in vars(module).items() if hasattr(v, "compile") and hasattr(v, "fn"))
        parser.error(f"argument TARGET: {path} defines no kernel {name!r}; kernels there: {', '.join(found) or 'none'}")
    return kernel


def _import_module(parser, name: str):
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name and (name == error.name or name.startswith(error.name + ".")):
            parser.error(f"argument TARGET: no such file or module {name!r}")
        raise


def _import_user_code(path: str, do_import):
    """Run the import; an error in the user's code becomes one line naming its file:line."""
    try:
        return do_import()
    except SyntaxError as error:
        raise CommandError(f"cannot import {path}: SyntaxError: {error.msg} ({error.filename}:{error.lineno})") from None
    except Exception as error:
        frames = [f for f in traceback.extract_tb(error.__traceback__) if not f.filename.startswith("<frozen")]
        where = f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""
        hint = ""
        if isinstance(error, ImportError) and "relative import" in str(error):
            hint = "; the file is part of a package: name it as MODULE:KERNEL (e.g. weft.kernels.vector_add:add_kernel)"
        raise CommandError(f"cannot import {path}: {type(error).__name__}: {error}{where}{hint}") from None


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


def sass_of(cubin: bytes) -> str:
    from .compiler.cuda_tools import find_cuobjdump

    tool = find_cuobjdump()
    if tool is None:
        raise CommandError("--dump sass needs cuobjdump, which was not found: pip install 'weft[sass]' "
                           "(the nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm wheels) or put a CUDA "
                           "toolkit's bin/ on PATH; --dump ptx needs neither")
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        # cuobjdump runs nvdisasm, which lies beside it (toolkit bin/ or the wheels' folder).
        env = dict(os.environ, PATH=os.environ.get("PATH", "") + os.pathsep + str(Path(tool).parent))
        result = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True, env=env)
    except OSError as error:
        raise CommandError(f"running {tool} failed: {error}") from None
    finally:
        os.unlink(f.name)
    if result.returncode:
        raise CommandError(f"cuobjdump failed: {result.stderr.strip()}")
    return result.stdout


def check_aligned(parser, kernel, aligned, signature: dict) -> None:
    """--aligned names runtime parameters (those given in --signature)."""
    parameters = list(inspect.signature(kernel.fn).parameters)
    runtime = [p for p in parameters if p in signature]
    for name in aligned or ():
        if name in runtime:
            continue
        what = "not in --signature" if name in parameters else f"not a parameter of {kernel.fn.__name__}"
        parser.error(f"argument --aligned: {name!r} is {what}; --aligned takes runtime parameters "
                     f"given in --signature: {', '.join(runtime) or 'none'} "
                     f"(the kernel's parameters: {', '.join(parameters)})")


def compile_command(parser, args) -> int:
    kernel = load_kernel(parser, args.target)
    signature = parse_pairs(parser, "--signature", args.signature, literal=False)
    constexprs = parse_pairs(parser, "--constexpr", args.constexpr, literal=True)
    check_aligned(parser, kernel, args.aligned, signature)
    specialization = {name: "divisible_by_16" for name in (args.aligned or ())}
    compiled = kernel.compile(signature=signature, constexprs=constexprs, num_warps=args.num_warps,
                              specialization=specialization)
    if args.dump in ("sass", "report") and not compiled.asm.get("cubin"):
        from .compiler.cuda_tools import MISSING_PTXAS

        raise CommandError(f"--dump {args.dump} needs a cubin, and {MISSING_PTXAS}")
    if args.dump == "sass":
        print(sass_of(compiled.asm["cubin"]))
    elif args.dump == "report":
        keys = ("registers", "spill_stores", "spill_loads", "stack_frame", "shared")
        print(" ".join(f"{k}={compiled.metadata.get(k)}" for k in keys))
    else:
        print(compiled.asm[args.dump])
    return 0


def add_compile_parser(commands) -> None:
    parser = commands.add_parser(
        "compile", help="compile a kernel for sm_90a and print one stage",
        description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.set_defaults(run=compile_command, parser=parser)
    parser.add_argument("target", metavar="TARGET", help="FILE.py:KERNEL or MODULE:KERNEL")
    parser.add_argument("--signature", nargs="+", metavar="NAME=TYPE", required=True,
                        help='runtime parameters and their types, e.g. x_ptr=*fp32 n=i32')
    parser.add_argument("--constexpr", nargs="+", metavar="NAME=VALUE", help="constexpr values, e.g. BLOCK=1024")
    parser.add_argument("--num-warps", type=_num_warps, default=4, help="warps per CTA, a power of two up to 32 (default 4)")
    parser.add_argument("--aligned", nargs="+", metavar="NAME",
                        help="parameters known divisible by 16 (pointers: 16-byte aligned), as a launch would specialise")
    parser.add_argument("--dump", choices=STAGES, default="ptx", help="stage to print (default ptx)")
