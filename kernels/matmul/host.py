"""The host side of matmul: checks, descriptors, grid, autotuning, the numpy reference."""

from __future__ import annotations

import operator
from dataclasses import replace

import numpy as np

from ... import lowlevel as ll
from ...runtime.host_arrays import (check_arrays, contiguous, data_address, element_strides, is_torch,
                                    new_array)
from .._launch import (PreparedCall, capturing_cuda_graph, descriptor_binding, gpu_signature, keep_prepared_call,
                       may_keep_tensors, persistent_cluster_grid, pointer_binding, prepared_call, tensor_facts,
                       torch_ops, torch_route)
from .cluster import cluster_matmul
from .config import Config, configs_for, staged_columns
from .gemv import gemv, gemv_tile_error
from .kernels import pipelined_matmul, warp_specialized_matmul
from .split_k import split_k_matmul
from .split_k_tma import FINISH_BLOCK, FINISH_WARPS, finish_split, reduce_add_split_k_matmul
from .staged_halves import staged_halves_matmul
from .stream_k import stream_k_matmul
from .stream_k_plan import slot_count, stream_k_fits_int32, stream_k_tiles
from .two_piece import B_BOX_N, LEFT_N, RIGHT_N, two_piece_matmul

_INPUT_BITS = {"fp16": 16, "bf16": 16, "fp8e4m3": 8, "fp8e5m2": 8}
_OUTPUT_BITS = {"fp16": 16, "bf16": 16, "fp32": 32}
EMULATED_PROGRAMS = 2  # persistent CTAs on the emulator: enough to walk several tiles each
_TUNED: dict = {}
_SCRATCH: dict = {}  # (device, stream, m, n, tiles) -> a split-K launch's zeroed scratch


def _signature(dtype) -> str:
    from ...runtime.arguments import ArgumentTypeError, dtype_signature

    try:
        return dtype_signature(dtype)
    except ArgumentTypeError:
        return str(dtype)


def _check_inputs(a, b) -> str:
    """The input dtype name; ValueError/TypeError on inputs no layout change can fix."""
    check_arrays("matmul", a=a, b=b)
    if len(a.shape) != 2 or len(b.shape) != 2:
        raise ValueError(f"matmul takes 2-D a [M, K] and b [K, N], got shapes {tuple(a.shape)} "
                         f"and {tuple(b.shape)}")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"matmul: a is {tuple(a.shape)} and b is {tuple(b.shape)}; a's K "
                         f"({a.shape[1]}) must equal b's K ({b.shape[0]})")
    kind_a, kind_b = _signature(a.dtype), _signature(b.dtype)
    if kind_a not in _INPUT_BITS or kind_a != kind_b:
        raise TypeError(f"matmul takes a and b of one dtype among {sorted(_INPUT_BITS)}, got "
                        f"{kind_a} and {kind_b}")
    return kind_a


def _operands(a, b, kind: str) -> tuple:
    """(a, b, whether b is K-major) as the TMA loads read them: a with K contiguous, b
    row-major (N contiguous) or K-major (the transpose of a contiguous [N, K]), each
    copied to contiguous when its strides are neither."""
    if element_strides(a)[1] != 1:
        a = contiguous(a)
    strides = element_strides(b)
    if strides[1] == 1 and b.shape[1] > 1:
        k_major = False
    elif strides[0] == 1:
        k_major = True
    else:
        b, k_major = contiguous(b), False
    if _INPUT_BITS[kind] == 8 and not k_major:
        raise ValueError("matmul: fp8 b must be K-major (wgmma cannot transpose 8-bit tiles): "
                         "pass b as bt.t() for a contiguous bt of shape [N, K]")
    return a, b, k_major


def _out_dtype(a, out_dtype, kind: str):
    if out_dtype is None:
        if _INPUT_BITS[kind] == 16:
            return a.dtype, kind
        if not is_torch(a):
            raise TypeError("matmul of fp8 numpy arrays needs out_dtype (fp16 or fp32)")
        import torch

        return torch.bfloat16, "bf16"
    name = _signature(out_dtype)
    if name not in _OUTPUT_BITS:
        raise TypeError(f"matmul out_dtype must be one of {sorted(_OUTPUT_BITS)}, got {name}")
    return out_dtype, name


def _aligned(x, inner: int):
    """`x` (2-D, last dim contiguous) as TMA reads it, rows starting on 16 bytes and not
    overlapping: itself when they already do, else a copy of the same values in rows
    padded to 16 bytes (one copy, no zero fill: the view keeps x's shape, so TMA reads
    zeros past its last column, not the padding)."""
    item = x.element_size() if is_torch(x) else x.itemsize
    stride = element_strides(x)[0]
    if stride >= inner and (stride * item) % 16 == 0 and data_address(x) % 16 == 0:
        return x
    padded_cols = -(-inner * item // 16) * 16 // item
    out = new_array(x, (x.shape[0], padded_cols))[:, :inner]
    out[:] = x
    return out


def _descriptors(a, b, c, k_major: bool, config: Config, in_bits: int, out_bits: int):
    from ...runtime.tensor_descriptor import TensorDescriptor

    swizzled_in = ll.NVMMASharedLayout(128, in_bits)
    row = 1024 // in_bits  # elements in a 128-byte swizzle row
    # CTA pairs (cluster.py) load the tile they share as two halves, one each.
    a_desc = TensorDescriptor.from_tensor(a, [config.block_m // config.cluster_n, config.block_k], swizzled_in)
    if k_major:
        # Two-piece tiles take B^T in 64-row boxes, whole ones per piece (two_piece.py).
        rows = B_BOX_N if config.block_n == LEFT_N + RIGHT_N else config.block_n // config.cluster_m
        b_desc = TensorDescriptor.from_tensor(b.T, [rows, config.block_k], swizzled_in)
    else:
        b_desc = TensorDescriptor.from_tensor(b, [config.block_k, min(row, config.block_n)], swizzled_in)
    if c is None:  # C is written by another launch (TMA-reduced split-K)
        return a_desc, b_desc, None
    c_desc = TensorDescriptor.from_tensor(c, [config.block_m, min(1024 // out_bits, config.block_n)],
                                          ll.NVMMASharedLayout(128, out_bits))
    return a_desc, b_desc, c_desc


def _kernel_call(a, b, c, m: int, n: int, k: int, k_major: bool, config: Config, programs: int,
                 in_bits: int, out_bits: int) -> tuple:
    """(kernel, grid, args, kwargs, c's descriptor, then, scratch) of the launch of
    `config` on these operands. then: None, or the (kernel, grid, args, kwargs) of a
    second launch that writes C (a TMA-reduced split-K's `finish_split`; c's descriptor
    is then None). scratch: the zeroed arrays a split-K launch adds into (its fp32
    workspace and, for atomics, per-tile arrival counters, `_split_scratch`), () for the
    others."""
    if config.variant == "gemv":
        return _gemv_call(a, b, c, m, n, k, k_major, config)
    reduce_add = config.split_k > 1 and config.split_reduce == "tma"
    a_desc, b_desc, c_desc = _descriptors(a, b, None if reduce_add else c, k_major, config, in_bits, out_bits)
    common = dict(BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
                  STAGES=config.stages, GROUP_M=config.group_m, B_K_MAJOR=k_major,
                  NUM_WARPS=config.num_warps, num_warps=config.num_warps)
    if config.cluster_m * config.cluster_n > 1:
        return _cluster_call(a, c, a_desc, b_desc, c_desc, m, n, k, config, common)
    if reduce_add:
        return _reduce_add_call(a, b_desc, a_desc, c, m, n, k, config, programs, common)
    if config.stream_k:
        return _stream_k_call(a, a_desc, b_desc, c_desc, m, n, k, config, programs, common)
    if config.split_k > 1:
        scratch = _split_scratch(a, m, n, _tiles(m, n, config))
        return (split_k_matmul, (programs,), (a_desc, b_desc, c_desc, *scratch, m, n, k),
                dict(common, PRODUCER_REGS=config.producer_regs, SPLIT_K=config.split_k), c_desc, None, scratch)
    if config.variant == "warp_specialized":
        kernel = two_piece_matmul if config.block_n == LEFT_N + RIGHT_N else warp_specialized_matmul
        if config.staged_halves:
            kernel = staged_halves_matmul
        common["PRODUCER_REGS"] = config.producer_regs
    else:
        kernel = pipelined_matmul
    return kernel, (programs,), (a_desc, b_desc, c_desc, m, n, k), common, c_desc, None, ()


def _reduce_add_call(a, b_desc, a_desc, c, m: int, n: int, k: int, config: Config, programs: int,
                     common: dict) -> tuple:
    """`_kernel_call` of a split-K config whose parts add by TMA reduce-add: the split
    launch adds into a zeroed fp32 workspace with C's row stride, then `finish_split`
    converts its whole rows (C's padding columns too) into C and zeroes them."""
    ws_desc, then, scratch = _reduce_add_workspace(a, c, m, n, config)
    return (reduce_add_split_k_matmul, (programs,), (a_desc, b_desc, ws_desc, m, n, k),
            dict(common, PRODUCER_REGS=config.producer_regs, SPLIT_K=config.split_k,
                 STAGED_N=staged_columns(config.block_m, config.block_n)), None, then, scratch)


def _reduce_add_workspace(a, c, m: int, n: int, config: Config) -> tuple:
    """(the workspace's descriptor, the `finish_split` launch, (workspace,)) of a split
    launch whose parts add by TMA reduce-add."""
    from ...runtime.tensor_descriptor import TensorDescriptor

    stride = element_strides(c)[0]
    whole_c = _whole_rows(c, stride)
    workspace = _split_scratch(a, m, stride, None)[0]
    ws_desc = TensorDescriptor.from_tensor(workspace[:, :n], [config.block_m, min(32, config.block_n)],
                                           ll.NVMMASharedLayout(128, 32))
    total = m * stride  # rows of 16 bytes: a multiple of 4
    then = (finish_split, (-(-total // FINISH_BLOCK),), (workspace, whole_c, total // 4),
            dict(num_warps=FINISH_WARPS))
    return ws_desc, then, (workspace,)


def _stream_k_call(a, a_desc, b_desc, c_desc, m: int, n: int, k: int, config: Config, programs: int,
                   common: dict) -> tuple:
    """`_kernel_call` of a stream-K config: whole waves of tiles first, the rest shared
    (stream_k_plan.py); the kept scratch is the pieces' partial-tile slots (fp32
    [slots, BLOCK_M, BLOCK_N], overwritten before they are read) and the tiles' arrival
    counters (int32, left zero by every launch)."""
    tiles, k_steps = _tiles(m, n, config), -(-k // config.block_k)
    if not stream_k_fits_int32(tiles, k_steps, programs):
        raise ValueError(f"matmul: {config} on {m}x{n}x{k} has {tiles} x {k_steps} stream-K iterations on "
                         f"{programs} CTAs, past the kernel's int32 range arithmetic; use split_k instead")
    sk_tiles = stream_k_tiles(tiles, programs)
    slots = slot_count(sk_tiles, k_steps, programs)
    scratch = _split_scratch(a, slots * config.block_m, config.block_n, tiles, purpose="stream_k")
    dp_tiles = tiles - sk_tiles
    return (stream_k_matmul, (programs,), (a_desc, b_desc, c_desc, *scratch, m, n, k, dp_tiles),
            dict(common, PRODUCER_REGS=config.producer_regs), c_desc, None, scratch)


def _cluster_call(a, c, a_desc, b_desc, c_desc, m: int, n: int, k: int, config: Config, common: dict) -> tuple:
    """`_kernel_call` of a config of CTA pairs (cluster.py; two_piece.py for 192-wide
    tiles): launched in clusters of two,
    as many as the device holds at once (a cluster's CTAs share a GPC, so that can be
    fewer than half the SMs), but no more than there are units (tile pairs x K parts).
    Split, the pairs add into a workspace that `finish_split` converts into C, as
    `_reduce_add_call`'s units do."""
    pairs = -(-m // (config.block_m * config.cluster_m)) * -(-n // (config.block_n * config.cluster_n))
    constexprs = dict(common, PRODUCER_REGS=config.producer_regs, CLUSTER_M=config.cluster_m,
                      CLUSTER_N=config.cluster_n)
    num_warps = constexprs.pop("num_warps")
    then, scratch = None, ()
    kernel = two_piece_matmul if config.block_n == LEFT_N + RIGHT_N else cluster_matmul
    if config.split_k > 1:
        ws_desc, then, scratch = _reduce_add_workspace(a, c, m, n, config)
        constexprs.update(SPLIT_K=config.split_k, STAGED_N=staged_columns(config.block_m, config.block_n))
        c_desc, out_desc = None, ws_desc  # C is finish_split's
    else:
        out_desc = c_desc
        if config.staged_halves:
            constexprs["STAGED_N"] = config.block_n // 2
    args = (a_desc, b_desc, out_desc, m, n, k)
    programs = persistent_cluster_grid(kernel, a, 2 * pairs * config.split_k, args, constexprs, num_warps, 2)
    return (kernel, (programs,), args, dict(constexprs, num_warps=num_warps, cluster=(2, 1, 1)),
            c_desc, then, scratch)


def _gemv_call(a, b, c, m: int, n: int, k: int, k_major: bool, config: Config) -> tuple:
    """`_kernel_call` of a gemv config (gemv.py): grid (column strips, K parts, rows),
    pointers in place of descriptors; split, the parts add into the kept zeroed fp32
    workspace (C's row stride) and count in its arrival counters (strips x rows)."""
    vec = 16 // a.element_size() if is_torch(a) else 16 // a.itemsize
    problem = gemv_tile_error(config.block_n, config.block_k, config.num_warps, vec, k_major)
    if problem is not None:
        raise ValueError(f"matmul: {config} does not fit gemv's tile: {problem}")
    stride_b = element_strides(b)[1 if k_major else 0]
    stride_c = element_strides(c)[0]
    grid = (-(-n // config.block_n), config.split_k, m)
    kwargs = dict(BLOCK_N=config.block_n, BLOCK_K=config.block_k, VEC=vec, SPLIT_K=config.split_k,
                  B_K_MAJOR=k_major, NUM_WARPS=config.num_warps, num_warps=config.num_warps)
    # Unsplit, the workspace and counters are never read: a stands in (a is in the
    # prepared call's signature, so a repeated launch still points at live memory).
    scratch = _split_scratch(a, m, stride_c, grid[0] * m) if config.split_k > 1 else (a, a)
    args = (a, b, c, *scratch, n, k, element_strides(a)[0], stride_b, stride_c)
    return gemv, grid, args, kwargs, None, None, scratch if config.split_k > 1 else ()


def _whole_rows(c, stride: int):
    """C's [m, n] view widened to its allocation's whole rows [m, stride]."""
    if is_torch(c):
        return c.as_strided((c.shape[0], stride), (stride, 1))
    return np.lib.stride_tricks.as_strided(c, (c.shape[0], stride), (stride * c.itemsize, c.itemsize))


def _launcher(a, b, c, m: int, n: int, k: int, k_major: bool, config: Config, programs: int,
              in_bits: int, out_bits: int):
    """A function that launches the kernel of `config` on these operands: the launch
    packed once (kernel.prepare), so that a few microseconds of host time each let
    back-to-back launches queue faster than even decode-sized kernels run."""
    call = _kernel_call(a, b, c, m, n, k, k_major, config, programs, in_bits, out_bits)
    launch = _prepared_launches(call)
    if launch is None:  # WEFT_EMULATE: the launch runs on the CPU
        return lambda: _run(call)
    return launch


def _launches(call: tuple) -> list:
    """The (kernel, grid, args, kwargs) of a `_kernel_call`'s launches, in order."""
    return [call[:4]] + ([call[5]] if call[5] is not None else [])


def _run(call: tuple) -> None:
    for kernel, grid, args, kwargs in _launches(call):
        kernel[grid](*args, **kwargs)


def _prepared_launches(call: tuple):
    """One prepared launch of `call`, or a `_LaunchSequence` of its two; None where the
    launches run on the emulator (WEFT_EMULATE)."""
    launches = [kernel.prepare(grid, *args, **kwargs) for kernel, grid, args, kwargs in _launches(call)]
    if launches[0] is None:
        return None
    return launches[0] if len(launches) == 1 else _LaunchSequence(launches)


class _LaunchSequence:
    """Prepared launches run back to back on the first one's stream, as one launch for
    PreparedCall (`config.hStream`, call)."""

    __slots__ = ("launches", "config")

    def __init__(self, launches):
        self.launches, self.config = tuple(launches), launches[0].config

    def __call__(self):
        for launch in self.launches:
            launch()


def _split_scratch(a, m: int, n: int, tiles: int | None, purpose: str = "split_k") -> tuple:
    """The zeroed fp32 workspace [m, n] and int32 arrival counters [tiles] of a split-K
    launch (the workspace alone where tiles is None: TMA-reduced split-K). On the GPU,
    one pair per (device, current stream, shape), made once and kept: every launch
    leaves them zeroed (split_k.py; split_k_tma.py's finish_split) and launches on one stream run in
    turn, so repeated calls and prepared calls need no memsets, and no pair is freed
    while a graph may still use it. Where no tensor may be kept (`may_keep_tensors`: under
    CUDA-graph capture, or through the torch operators), and on the emulator, a new zeroed
    pair per call: a pair made in a graph's memory pool would be handed to other tensors
    once the graph no longer needs it (and torch.compile's CUDA graph trees refuse to see
    it kept alive). `purpose` keeps stream-K's slots, which it leaves dirty, apart from
    split-K workspaces of the same shape."""
    def fresh():
        workspace = new_array(a, (m, n), "float32", zero=True)
        return (workspace,) if tiles is None else (workspace, new_array(a, (tiles,), "int32", zero=True))

    if not (is_torch(a) and a.is_cuda) or not may_keep_tensors():
        return fresh()
    from ...runtime.launcher import _torch_stream_getter

    device = a.device.index or 0
    key = (device, _torch_stream_getter()(device), m, n, tiles, purpose)
    scratch = _SCRATCH.get(key)
    if scratch is None:
        scratch = _SCRATCH[key] = fresh()
    return scratch


def _tiles(m: int, n: int, config: Config) -> int:
    return -(-m // config.block_m) * -(-n // config.block_n)


def _sm_count(a) -> int:
    from ...runtime import driver

    return driver.device_properties(a.device.index or 0).sm_count


def _programs(a, m: int, n: int, k: int, config: Config) -> int:
    """Persistent CTAs: one per SM, or one per work unit (tile x K part; for stream-K,
    tile x K step) where fewer."""
    units = _tiles(m, n, config) * (-(-k // config.block_k) if config.stream_k else config.split_k)
    if is_torch(a) and a.is_cuda:
        return min(units, _sm_count(a))
    return min(units, EMULATED_PROGRAMS)


def _tuned_config(a, b, c, m, n, k, k_major, in_bits, out_bits, kinds) -> Config:
    """The fastest candidate for this problem shape, timed once with CUDA events over
    back-to-back launches queued behind a short GPU sleep (so the events time the GPU
    work, not the host's launch rate), then cached for the process. Under
    torch.use_deterministic_algorithms(True) no candidate splits K: split-K parts add
    into their tile with fp32 atomics or TMA adds, in arrival order, so the last bits of C can differ
    from call to call (stream-K's pieces add in a fixed order: they stay)."""
    import torch

    deterministic = torch.are_deterministic_algorithms_enabled()
    key = (m, n, k, k_major, kinds, a.device.index, deterministic)
    if key in _TUNED:
        return _TUNED[key]
    candidates = configs_for(in_bits, out_bits, m, n, k, _sm_count(a), b_k_major=k_major)
    if deterministic:
        candidates = unsplit(candidates)
    best, best_time = None, float("inf")
    for config in candidates:
        run = _launcher(a, b, c, m, n, k, k_major, config, _programs(a, m, n, k, config), in_bits, out_bits)
        run()  # warm up
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if hasattr(torch.cuda, "_sleep"):
            torch.cuda._sleep(1_000_000)  # about 0.5 ms: the 10 launches queue meanwhile
        start.record()
        for _ in range(10):
            run()
        end.record()
        end.synchronize()
        elapsed = start.elapsed_time(end)
        if elapsed < best_time:
            best, best_time = config, elapsed
    _TUNED[key] = best
    return best


def unsplit(candidates: list[Config]) -> list[Config]:
    """`candidates` with K unsplit (torch's deterministic mode), duplicates dropped.
    Stream-K candidates stay: their pieces add in a fixed order (stream_k.py)."""
    return list(dict.fromkeys(replace(config, split_k=1, split_reduce="atomic") for config in candidates))


def matmul(a, b, out_dtype=None, *, config: Config | None = None):
    """C = A @ B with fp32 accumulation, in `out_dtype` (default: a's dtype; bf16 for fp8).

    Torch tensors autograd or torch.compile must see go through kernels/torch_ops.py
    (the operator weft::matmul, or in eager autograd a torch.autograd.Function):
    differentiable in a and b. The rest run `host_matmul`."""
    route = torch_route(a, b)
    if route is not None:
        return torch_ops().matmul(a, b, out_dtype, config, route)
    return host_matmul(a, b, out_dtype, config=config)


def padded_columns(n: int, out_bits: int) -> int:
    """The row stride of an [M, n] C: n rounded up so that every row starts on 16 bytes,
    as C's TMA stores need. C is a view of the first n columns."""
    return -(-n * out_bits // 128) * 128 // out_bits


def output_layout(a, b, out_dtype) -> tuple:
    """(shape, strides, dtype) of the C that `host_matmul(a, b, out_dtype)` returns, after
    the checks it makes (its fake for torch.compile)."""
    kind = _check_inputs(a, b)
    out_dtype, out_kind = _out_dtype(a, out_dtype, kind)
    m, n = a.shape[0], b.shape[1]
    return (m, n), (padded_columns(n, _OUTPUT_BITS[out_kind]), 1), out_dtype


def host_matmul(a, b, out_dtype=None, *, config: Config | None = None):
    """`matmul` without the torch operator: numpy arrays and CPU tensors on the emulator,
    CUDA tensors on the GPU. A CUDA call with the signature of a recent one (see
    `_call_signature`) repeats that call's prepared launch on a new C (after refreshing its
    staged operands, if any)."""
    signature = _call_signature(a, b, out_dtype, config)
    if signature is not None:
        prepared = prepared_call(signature)
        if prepared is not None:
            out = prepared(a, b) if type(prepared) is _StagedCall else prepared()
            if out is not None:
                return out
    kind = _check_inputs(a, b)
    out_dtype, out_kind = _out_dtype(a, out_dtype, kind)
    in_bits, out_bits = _INPUT_BITS[kind], _OUTPUT_BITS[out_kind]
    m, k = a.shape
    n = b.shape[1]
    if config is not None:
        config.check_fits(in_bits, out_bits)
    padded_n = padded_columns(n, out_bits)
    if is_torch(a):
        import torch

        c = torch.empty((m, padded_n), dtype=out_dtype, device=a.device)
    else:
        c = np.empty((m, padded_n), dtype=out_dtype)
    c = c[:, :n]  # rows still start on 16 bytes, as TMA needs
    if m == 0 or n == 0:  # before any stride rule: empty arrays have arbitrary strides
        return c
    if k == 0:
        c[:] = 0
        return c
    given = (a, b)
    a, b, k_major = _operands(a, b, kind)
    a = _aligned(a, k)
    b = _aligned(b.T, k).T if k_major else _aligned(b, n)
    if config is None:
        if is_torch(a) and a.is_cuda:
            config = _tuned_config(a, b, c, m, n, k, k_major, in_bits, out_bits, (kind, out_kind))
        else:
            config = Config(block_k=1024 // in_bits, stages=3 if out_bits < 32 else 2)
    call = _kernel_call(a, b, c, m, n, k, k_major, config, _programs(a, m, n, k, config), in_bits, out_bits)
    _run(call)
    if signature is not None:
        # Operands the kernel does not read in place (copies: a K-major b that was not
        # copied comes back as a new view of the same memory) are staged.
        staged = tuple((role, operand) for role, operand in enumerate((a, b))
                       if tensor_facts(operand) != tensor_facts(given[role]))
        _prepare(signature, call, c, padded_n, staged)
    return c


def _call_signature(a, b, out_dtype, config):
    """What a launch for these arguments depends on, as a dict key: a's and b's
    addresses, shapes, strides, dtypes and device, out_dtype, config, torch's current
    stream and WEFT_EMULATE (`gpu_signature`); None where no prepared call applies."""
    if not (config is None or type(config) is Config):
        return None
    try:
        hash(out_dtype)
    except TypeError:
        return None
    signature = gpu_signature((a, b), (out_dtype, config))
    return None if signature is None else ("matmul", signature)


def _prepare(signature, call: tuple, c, padded_n: int, staged: tuple) -> None:
    launch = _prepared_launches(call)
    if launch is None:  # WEFT_EMULATE: the launch runs on the CPU
        return
    m, n = c.shape
    # Strides (padded_n, 1): C's rows start on 16 bytes, as in the first call's C.
    outputs = [((m, n), (padded_n, 1), c.dtype, c.device)]
    # A split-K launch keeps pointing at its stream's scratch, which it leaves zeroed.
    c_desc = call[4]
    # C is the last launch's: a descriptor of the tile kernels, else a pointer (the finishing
    # launch of a split, or gemv's own).
    last = launch.launches[-1] if type(launch) is _LaunchSequence else launch
    bind = descriptor_binding(launch, "c_desc", c_desc) if c_desc is not None else pointer_binding(last, "c_ptr")
    prepared = PreparedCall(launch, outputs, [[bind]], [], _ONLY)
    keep_prepared_call(signature, _StagedCall(prepared, staged) if staged else prepared)


class _StagedCall:
    """The prepared call of operands that TMA cannot read in place (rows not starting on
    16 bytes, or strides that are neither layout): the first call copied them into
    staging arrays, which the kept launch reads; each later call copies its (a, b) into
    the same arrays (one device copy each) and launches. Under CUDA-graph capture it
    declines (returns None: the call goes the long way, staging in the graph's own
    memory), since the prepared-call cache may drop a staging array a graph still reads."""

    __slots__ = ("prepared", "staged")

    def __init__(self, prepared: PreparedCall, staged: tuple):
        self.prepared, self.staged = prepared, staged  # (0 for a / 1 for b, staging array)

    def __call__(self, a, b):
        if capturing_cuda_graph():
            return None
        for role, staging in self.staged:
            staging.copy_(b if role else a)
        return self.prepared()


_ONLY = operator.itemgetter(0)  # a prepared call's result: C alone (a C callable, no Python frame)


def reference_matmul(a, b) -> np.ndarray:
    """A @ B in float64 (numpy), from any arrays the kernel takes."""
    def host(x):
        if is_torch(x):
            return x.detach().float().cpu().numpy().astype(np.float64)
        return np.asarray(x, dtype=np.float64)
    return host(a) @ host(b)
