"""The `weft` command: `weft demo`, `weft compile` and `weft show-layout`.

`weft demo` is the smoke check of an installation: it runs the softmax kernel (on the GPU
when there is one and torch is installed, else on the CPU emulator), checks it against
numpy and prints its timing; then it plans a layout conversion (wgmma accumulator to a
coalesced blocked layout) and checks the plan in numpy.

`weft compile FILE.py:KERNEL --signature ... --dump ptx` prints a compiled stage (its own
help, `weft compile --help`, has an example that runs as written).

`weft show-layout KIND --shape 64 64 ...` prints the table of a standard layout (and writes
its SVG with `--svg FILE`). Bad arguments exit with status 2 and a message naming the
argument, as argparse does; a kernel that does not compile, a file that does not import or
a missing tool (ptxas, cuobjdump) exit with status 1 and one line, never a traceback.

`weft --version` prints the version.
"""

from __future__ import annotations

import argparse
import os
import math
import sys
from typing import Optional, Sequence

import numpy as np

from . import __version__
from .cli_compile import CommandError, add_compile_parser
from .compiler.hardware import LANES
from .layouts import (
    LayoutError,
    LinearLayout,
    collect,
    distribute,
    execute_plan,
    plan_conversion,
    standard,
)

# The options each kind reads; giving one that a kind ignores is an error, not a no-op.
KIND_OPTIONS = {
    "blocked": ("warps", "size_per_thread", "threads", "order"),
    "wgmma": ("warps", "instr_n"),
    "mma_v2": ("warps",),
    "nvmma_shared": ("swizzle", "transposed"),
    "swizzled_shared": ("vec", "per_phase", "max_phase", "order"),
}
KINDS = tuple(KIND_OPTIONS)
SWIZZLED_DEFAULTS = {"vec": 8, "per_phase": 1, "max_phase": 8}


def _power_of_two(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1 or value & (value - 1):
        raise argparse.ArgumentTypeError(f"{value} is not a power of two")
    return value


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not positive")
    return value


def _check_count(parser, option: str, values, rank: int) -> None:
    if values is not None and len(values) != rank:
        parser.error(f"argument {option}: expected {rank} values (one per dim of --shape), got {len(values)}")


def _default_threads(shape: Sequence[int], order: Sequence[int]) -> list[int]:
    """32 lanes spread over the dims in `order`, minor dim first, as far as each dim reaches."""
    threads, left = [1] * len(shape), LANES
    for d in order:
        take = min(left, shape[d])
        threads[d], left = take, left // take
    threads[order[-1]] *= left
    return threads


def _build_layout(parser, args) -> LinearLayout:
    shape = list(args.shape)
    rank = len(shape)
    kind = args.kind
    for option in sorted({o for options in KIND_OPTIONS.values() for o in options} - set(KIND_OPTIONS[kind])):
        if getattr(args, option) not in (None, False):
            parser.error(f"argument --{option.replace('_', '-')}: not used by {kind}")
    for option in ("warps", "size_per_thread", "threads", "order"):
        _check_count(parser, "--" + option.replace("_", "-"), getattr(args, option), rank)
    if args.order is not None and sorted(args.order) != list(range(rank)):
        parser.error(f"argument --order: {args.order} must list each of the dims 0..{rank - 1} once")
    order = args.order or list(range(rank - 1, -1, -1))
    if kind == "blocked":
        warps = args.warps or [4] + [1] * (rank - 1)
        threads = args.threads or _default_threads(shape, order)
        if math.prod(threads) != LANES:
            parser.error(f"argument --threads: {threads} covers {math.prod(threads)} lanes; a warp has {LANES}")
        per_thread = args.size_per_thread or [1] * rank
        return standard.blocked(shape, per_thread, threads, warps, order)
    if kind == "wgmma":
        warps = args.warps or [4] + [1] * (rank - 1)
        instr_n = args.instr_n or min(shape[-1], 256)
        return standard.wgmma_accumulator(shape, warps, instr_n)
    if kind == "mma_v2":
        warps = args.warps or [4] + [1] * (rank - 1)
        return standard.mma_v2(shape, warps)
    if kind == "nvmma_shared":
        swizzle = args.swizzle
        if swizzle is None:
            swizzle = standard.default_nvmma_swizzle(shape, args.bits, args.transposed)
        return standard.nvmma_shared(shape, swizzle, args.bits, args.transposed)
    vec, per_phase, max_phase = (
        getattr(args, name) or default for name, default in SWIZZLED_DEFAULTS.items()
    )
    return standard.swizzled_shared(shape, vec, per_phase, max_phase, order)


def show_layout(parser, args) -> int:
    layout = _build_layout(parser, args)
    options = dict(element_bits=args.bits, max_rows=args.max_rows, max_cols=args.max_cols)
    print(layout.render(owners=args.owners, show=args.show, **options))
    if args.svg:
        try:
            with open(args.svg, "w") as f:
                f.write(layout.to_svg(**options))
        except OSError as error:
            parser.error(f"argument --svg: cannot write {args.svg!r}: {error.strerror}")
        print(f"wrote {args.svg}")
    return 0


def describe_plan(plan) -> list[str]:
    """What a conversion plan costs, one fact per line."""
    if plan.kind == "shared_round_trip":
        return [
            f"  scratch buffer: {plan.scratch_bytes} bytes, {plan.iterations} iteration(s)",
            f"  store: {plan.store_vector}-element vectors, {plan.store_conflicts} extra wavefronts (bank conflicts)",
            f"  load:  {plan.load_vector}-element vectors, {plan.load_conflicts} extra wavefronts (bank conflicts)",
        ]
    if plan.kind == "warp_shuffle":
        return [f"  {len(plan.rounds)} shuffle round(s), {plan.num_shuffles} shfl.sync per thread"]
    if plan.kind == "register_permutation":
        return [f"  registers renamed: dst register j <- src register {list(plan.source_register)}[j]"]
    return ["  nothing to do: both layouts agree"]


def demo_softmax() -> int:
    """Run softmax where it can run, check it, print its time."""
    import time

    from .kernels import softmax
    from .runtime import driver

    rng = np.random.default_rng(0)
    torch = None
    if driver.has_gpu():
        try:
            import torch
        except ImportError:
            print("a GPU is present but torch is not installed: running on the CPU emulator")
    if torch is not None and torch.cuda.is_available():
        rows, cols = 4096, 4096
        x = torch.from_numpy(rng.standard_normal((rows, cols)).astype(np.float32)).cuda()
        y = softmax.softmax(x)  # compile (or load from the disk cache) and warm up
        torch.cuda.synchronize()
        # Kernel time from a replayed CUDA graph: this kernel is shorter than any Python
        # launcher's host time per call, so timing calls one by one measures the host.
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
            for _ in range(20):
                softmax.softmax(x)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        ms = start.elapsed_time(end) / 20
        where = f"GPU ({torch.cuda.get_device_name()})"
        result, reference = y.cpu().numpy(), softmax.reference(x.cpu().numpy())
        speed = f"kernel {ms * 1e3:.1f} us, {2 * x.numel() * 4 / (ms * 1e-3) / 1e9:.0f} GB/s"
    else:
        rows, cols = 16, 1000
        x = rng.standard_normal((rows, cols)).astype(np.float32)
        began = time.perf_counter()
        result = softmax.softmax(x)
        seconds = time.perf_counter() - began
        where, reference = "CPU emulator (no GPU)", softmax.reference(x)
        speed = f"{seconds * 1e3:.0f} ms including compilation"
    error = float(np.abs(result - reference).max())
    print(f"softmax of a {rows}x{cols} fp32 array on the {where}: {speed}")
    if not error < 1e-5:
        print(f"check: FAILED (max abs error {error:.2e} against numpy)")
        return 1
    print(f"check: ok (max abs error {error:.1e} against numpy, float64)")
    return 0


def demo(parser, args) -> int:
    print("weft demo\n")
    status = demo_softmax()
    bits = 16
    source_text = "wgmma_accumulator([64, 64], [4, 1], 64)"
    target_text = "blocked([64, 64], [1, 8], [4, 8], [4, 1], [1, 0])"
    source = standard.wgmma_accumulator([64, 64], [4, 1], 64)
    target = standard.blocked([64, 64], [1, 8], [4, 8], [4, 1], [1, 0])
    window = dict(max_rows=8, max_cols=16)
    print()
    print(source.render(title=f"source: {source_text}, 4 warps", **window), end="\n\n")
    print(target.render(title=f"target: {target_text}", **window), end="\n\n")
    plan = plan_conversion(source, target, bits)
    print(f"conversion plan, {bits}-bit elements: {plan.kind}")
    print("\n".join(describe_plan(plan)))
    tensor = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float16)
    registers = execute_plan(plan, distribute(tensor, source), source, target)
    if not np.array_equal(collect(registers, target), tensor):
        print("check: FAILED (the plan put elements in the wrong registers)")
        return 1
    print("check: ok (the plan, run in numpy on random data, reproduces the tensor)")
    return status


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="weft", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"weft {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo_parser = commands.add_parser("demo", help="run and check softmax (GPU or emulator) and a conversion plan")
    demo_parser.set_defaults(run=demo, parser=demo_parser)
    add_compile_parser(commands)

    show = commands.add_parser(
        "show-layout", help="print a standard layout as a table (and an SVG)",
        description="Print which thread/register owns each element (or each element's "
        "shared-memory offset and bank) of a standard layout.",
    )
    show.set_defaults(run=show_layout, parser=show)
    show.add_argument("kind", choices=KINDS, metavar="KIND", help="one of: " + ", ".join(KINDS))
    show.add_argument("--shape", type=_power_of_two, nargs="+", required=True, help="tensor shape, e.g. 64 64")
    show.add_argument("--warps", type=_power_of_two, nargs="+", help="warps per CTA per dim (default 4 along dim0)")
    show.add_argument("--instr-n", type=_power_of_two, help="wgmma instruction N (default: min(N, 256))")
    show.add_argument("--size-per-thread", type=_power_of_two, nargs="+", help="blocked: elements per thread per dim")
    show.add_argument("--threads", type=_power_of_two, nargs="+", help="blocked: lanes per dim (product 32)")
    show.add_argument("--order", type=int, nargs="+", help="dims minor first (default: last dim first)")
    show.add_argument("--swizzle", type=int, choices=(0, 32, 64, 128), help="nvmma_shared swizzle bytes (default: widest fitting)")
    show.add_argument("--transposed", action="store_true", help="nvmma_shared: dim0 is contiguous")
    show.add_argument("--vec", type=_power_of_two, help="swizzled_shared vec (default 8)")
    show.add_argument("--per-phase", type=_power_of_two, help="swizzled_shared per_phase (default 1)")
    show.add_argument("--max-phase", type=_power_of_two, help="swizzled_shared max_phase (default 8)")
    show.add_argument("--bits", type=int, choices=(8, 16, 32, 64), default=16, help="element bits (banks, nvmma rows; default 16)")
    show.add_argument("--show", choices=("offset", "bank", "both"), default="both", help="shared layouts: what each cell shows (default both)")
    show.add_argument("--owners", choices=("first", "all"), default="first", help="broadcast cells: first owner +k, or all owners")
    show.add_argument("--max-rows", type=_positive, default=64, help="rows shown (default 64)")
    show.add_argument("--max-cols", type=_positive, default=64, help="columns shown (default 64)")
    show.add_argument("--svg", metavar="FILE", help="also write an SVG picture to FILE")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args.parser, args)
    except LayoutError as error:
        args.parser.error(str(error))  # exits with status 2
    except BrokenPipeError:  # `weft demo | head`: the reader left, not an error
        sys.stdout = open(os.devnull, "w")  # nothing left to flush at exit
        return 0
    except Exception as error:  # a kernel's own error or a missing tool: its message, not a traceback
        from .compiler.errors import CompilationError
        from .runtime.arguments import LaunchError
        from .compiler.cuda_tools import PtxasError

        if not isinstance(error, (CompilationError, LaunchError, PtxasError, CommandError)):
            raise
        print(f"weft {args.command}: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
