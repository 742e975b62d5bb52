"""Tensor maps a highlevel kernel writes itself: `tl.make_tensor_descriptor` over a base
loaded on the device (Triton tutorial 08's grouped GEMM: one descriptor per group, made
when the program reaches that group's tiles), on the emulator against numpy float64; the
lowlevel ops under it (tma.replace_tensor_map, fence_tensor_map), and the emulator's
report of a TMA read through a map that no fence published. Operands found through a table
of host addresses are reached on the emulator with `emulator.reachable(...)`."""

import numpy as np
import pytest

from weft import highlevel as tl
from weft import lowlevel as ll
from weft.compiler.backend import ptxas
from weft.lowlevel import mbarrier, tma
from weft.runtime import emulator
from weft.runtime.emulator import EmulationError
from weft.runtime.made_tensor_descriptor import TEMPLATE_FIELD, WORKSPACE_FIELD


@tl.jit
def grouped_matmul(a_ptr, b_ptr, c_ptr, group_offsets, group_sizes, group_count,
                   NUM_PROGRAMS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_K: tl.constexpr):
    """C_g = A_g @ B_g for each group g, A_g [M, K], B_g [K, N] and C_g [M, N] packed into
    a_ptr, b_ptr and c_ptr at the element offsets group_offsets[3g..3g+2], rows of K, N
    and N elements; programs take the groups' tiles in turn."""
    tile = tl.program_id(0)
    first_tile = 0
    for g in range(group_count):
        m = tl.load(group_sizes + 3 * g)
        n = tl.load(group_sizes + 3 * g + 1)
        k = tl.load(group_sizes + 3 * g + 2)
        tiles_n = tl.cdiv(n, BLOCK_N)
        tiles = tl.cdiv(m, BLOCK_M) * tiles_n
        if tile >= first_tile and tile < first_tile + tiles:
            a_desc = tl.make_tensor_descriptor(a_ptr + tl.load(group_offsets + 3 * g), [m, k], [k, 1],
                                               [BLOCK_M, BLOCK_K])
            b_desc = tl.make_tensor_descriptor(b_ptr + tl.load(group_offsets + 3 * g + 1), [k, n], [n, 1],
                                               [BLOCK_K, BLOCK_N])
            c_desc = tl.make_tensor_descriptor(c_ptr + tl.load(group_offsets + 3 * g + 2), [m, n], [n, 1],
                                               [BLOCK_M, BLOCK_N])
            while tile >= first_tile and tile < first_tile + tiles:
                row = (tile - first_tile) // tiles_n * BLOCK_M
                col = (tile - first_tile) % tiles_n * BLOCK_N
                acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                for kk in range(0, tl.cdiv(k, BLOCK_K)):
                    acc += tl.dot(a_desc.load([row, kk * BLOCK_K]), b_desc.load([kk * BLOCK_K, col]))
                c_desc.store([row, col], acc.to(tl.float16))
                tile += NUM_PROGRAMS
        first_tile += tiles


@tl.jit
def table_grouped_matmul(a_ptrs, b_ptrs, c_ptrs, group_sizes, group_count, NUM_PROGRAMS: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """As grouped_matmul, each group's operands found through tables of addresses
    (Triton tutorial 08's TMA variant: int64 entries cast to pointers)."""
    tile = tl.program_id(0)
    first_tile = 0
    for g in range(group_count):
        m = tl.load(group_sizes + 3 * g)
        n = tl.load(group_sizes + 3 * g + 1)
        k = tl.load(group_sizes + 3 * g + 2)
        tiles_n = tl.cdiv(n, BLOCK_N)
        tiles = tl.cdiv(m, BLOCK_M) * tiles_n
        if tile >= first_tile and tile < first_tile + tiles:
            a = tl.load(a_ptrs + g).to(tl.pointer_type(tl.float16))
            b = tl.load(b_ptrs + g).to(tl.pointer_type(tl.float16))
            c = tl.load(c_ptrs + g).to(tl.pointer_type(tl.float16))
            a_desc = tl.make_tensor_descriptor(a, [m, k], [k, 1], [BLOCK_M, BLOCK_K])
            b_desc = tl.make_tensor_descriptor(b, [k, n], [n, 1], [BLOCK_K, BLOCK_N])
            c_desc = tl.make_tensor_descriptor(c, [m, n], [n, 1], [BLOCK_M, BLOCK_N])
            while tile >= first_tile and tile < first_tile + tiles:
                row = (tile - first_tile) // tiles_n * BLOCK_M
                col = (tile - first_tile) % tiles_n * BLOCK_N
                acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                for kk in range(0, tl.cdiv(k, BLOCK_K)):
                    acc += tl.dot(a_desc.load([row, kk * BLOCK_K]), b_desc.load([kk * BLOCK_K, col]))
                c_desc.store([row, col], acc.to(tl.float16))
                tile += NUM_PROGRAMS
        first_tile += tiles


# (M, N, K) per group: tails in every dim, K of one block and of several; rows of N and K
# elements stay multiples of 8 (16 bytes), as a tensor map's strides must.
GROUPS = [(80, 72, 40), (64, 64, 64), (33, 136, 104)]
BLOCKS = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32)


def pack(groups, rng, xp=np):
    """The groups' operands packed one after another (each starting 16-byte aligned), the
    offsets table and the sizes table."""
    arrays = {"a": [], "b": [], "c": []}
    offsets = []
    for m, n, k in groups:
        for name, shape in (("a", (m, k)), ("b", (k, n)), ("c", (m, n))):
            offsets.append(sum(x.size for x in arrays[name]))
            arrays[name].append(rng.standard_normal(shape).astype(np.float16) if name != "c"
                                else np.full(shape, np.nan, np.float16))
    flat = {name: np.concatenate([x.reshape(-1) for x in xs]) for name, xs in arrays.items()}
    return arrays, flat, np.array(offsets, np.int64), np.array([v for g in groups for v in g], np.int32)


def unpack(flat_c, groups):
    out, start = [], 0
    for m, n, _ in groups:
        out.append(flat_c[start:start + m * n].reshape(m, n))
        start += m * n
    return out


@pytest.mark.parametrize("programs", [3, 7])
def test_grouped_matmul_with_device_made_descriptors_matches_numpy(programs):
    rng = np.random.default_rng(programs)
    arrays, flat, offsets, sizes = pack(GROUPS, rng)
    grouped_matmul[(programs,)](flat["a"], flat["b"], flat["c"], offsets, sizes, len(GROUPS),
                                NUM_PROGRAMS=programs, **BLOCKS)
    for got, a, b in zip(unpack(flat["c"], GROUPS), arrays["a"], arrays["b"]):
        want = a.astype(np.float64) @ b.astype(np.float64)
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=2e-2, atol=2e-2)


def test_pointers_from_a_table_of_host_addresses_reach_the_arrays_made_reachable():
    rng = np.random.default_rng(5)
    arrays, _, _, sizes = pack(GROUPS, rng)
    tables = [np.array([x.ctypes.data for x in arrays[name]], np.int64) for name in "abc"]
    with emulator.reachable(*arrays["a"], *arrays["b"], *arrays["c"]):
        table_grouped_matmul[(4,)](*tables, sizes, len(GROUPS), NUM_PROGRAMS=4, **BLOCKS)
    for got, a, b in zip(arrays["c"], arrays["a"], arrays["b"]):
        want = a.astype(np.float64) @ b.astype(np.float64)
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=2e-2, atol=2e-2)
    with pytest.raises(EmulationError, match=r"inside no array of this launch.*emulator.reachable"):
        table_grouped_matmul[(4,)](*tables, sizes, len(GROUPS), NUM_PROGRAMS=4, **BLOCKS)


def test_a_misaligned_device_base_is_reported_at_the_descriptor():
    groups = [(16, 64, 32)]
    _, flat, offsets, sizes = pack(groups, np.random.default_rng(1))
    a = np.concatenate([np.zeros(1, np.float16), flat["a"]])  # group 0's A one element (2 bytes) in
    offsets[0] = 1
    with pytest.raises(EmulationError, match="16-byte aligned") as error:
        grouped_matmul[(1,)](a, flat["b"], flat["c"], offsets, sizes, 1, NUM_PROGRAMS=1, **BLOCKS)
    assert "make_tensor_descriptor" in str(error.value).splitlines()[1]


SIGNATURE = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp16", "group_offsets": "*i64",
             "group_sizes": "*i32", "group_count": "i32"}


def test_each_call_site_takes_a_template_and_all_share_one_workspace():
    compiled = grouped_matmul.compile(signature=SIGNATURE, constexprs=dict(NUM_PROGRAMS=4, **BLOCKS),
                                      num_warps=4, run_ptxas=False)
    hidden = [(p.type, p.hidden[1:]) for p in compiled.params if p.hidden]
    assert hidden == [("tensordesc<fp16[64,32],swizzle=64>", (TEMPLATE_FIELD, 0)),
                      ("tensordesc<fp16[32,64],swizzle=128>", (TEMPLATE_FIELD, 1)),
                      ("tensordesc<fp16[64,64],swizzle=128>", (TEMPLATE_FIELD, 2)),
                      ("*u8", (WORKSPACE_FIELD, 0))]
    ptx = compiled.asm["ptx"]
    assert ptx.count("tensormap.replace.tile.global_address.global.b1024.b64") == 3
    assert ptx.count("fence.proxy.tensormap::generic.acquire.gpu") == 3
    assert ".version 8.3" in ptx  # tensormap.replace needs PTX ISA 8.3


@pytest.mark.skipif(ptxas.find_ptxas() is None, reason="ptxas not found")
def test_the_grouped_matmul_assembles_without_spills():
    compiled = grouped_matmul.compile(signature=SIGNATURE, num_warps=4, num_stages=3,
                                      constexprs=dict(NUM_PROGRAMS=132, BLOCK_M=128, BLOCK_N=128, BLOCK_K=64))
    assert compiled.metadata["spill_stores"] == 0 and compiled.metadata["spill_loads"] == 0


ROWS = ll.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])


@ll.jit
def copy_first_box(template, workspace, x_ptr, starts, rows, cols, pitch, out_ptr, FENCE: ll.constexpr):
    """Each program copies the box at (0, 0) of the [rows, cols] matrix (row pitch `pitch`)
    starting at x_ptr + starts[program], through a map it writes in its workspace slot."""
    pid = ll.program_id(0)
    desc = tma.replace_tensor_map(workspace + pid * 128, template, x_ptr + ll.load(starts + pid),
                                  [rows, cols], [pitch, 1])
    if FENCE:
        tma.fence_tensor_map(desc)
    BM: ll.constexpr = template.block_shape[0]
    BN: ll.constexpr = template.block_shape[1]
    tile = ll.allocate_shared_memory(template.dtype, template.block_shape, template.layout)
    bar = mbarrier.allocate_mbarrier()
    mbarrier.init(bar, count=1)
    mbarrier.expect(bar, template.nbytes)
    tma.async_copy_global_to_shared(desc, [0, 0], bar, tile)
    mbarrier.wait(bar, 0)
    r = ll.arange(0, BM, ll.SliceLayout(1, ROWS))
    c = ll.arange(0, BN, ll.SliceLayout(0, ROWS))
    ll.store(out_ptr + pid * BM * BN + r[:, None] * BN + c[None, :], tile.load(ROWS))
    mbarrier.invalidate(bar)


def _copy_first_box(fence):
    x = np.random.default_rng(2).standard_normal(4096).astype(np.float16)
    starts = np.array([0, 64, 1000], np.int32)
    out = np.zeros((3, 16, 64), np.float16)
    template = ll.TensorDescriptor.from_tensor(np.zeros((16, 64), np.float16), [16, 64])
    copy_first_box[(3,)](template, np.zeros(3 * 128, np.uint8), x, starts, 10, 40, 48, out, FENCE=fence)
    return x, starts, out


def test_each_program_reads_through_the_map_it_wrote():
    x, starts, out = _copy_first_box(fence=True)
    for start, box in zip(starts, out):
        want = np.zeros((16, 64), np.float16)
        want[:10, :40] = x[start:start + 10 * 48].reshape(10, 48)[:, :40]
        np.testing.assert_array_equal(box, want)


def test_a_tma_read_through_an_unfenced_map_is_a_race():
    with pytest.raises(EmulationError, match="race: .*no tensormap fence") as error:
        _copy_first_box(fence=False)
    assert "tensor map written" in str(error.value)


def test_the_launcher_keeps_one_workspace_per_device_and_stream_and_grows_it(monkeypatch):
    from weft.runtime import driver, tensor_descriptor
    from weft.runtime.launcher import Launcher

    allocations, freed, encoded = [], [], []
    monkeypatch.setattr(driver, "allocate", lambda nbytes: allocations.append(nbytes) or 0x10000 * len(allocations))
    monkeypatch.setattr(driver, "free", freed.append)
    monkeypatch.setattr(tensor_descriptor, "_encoded", lambda *args: encoded.append(args) or bytes([len(encoded)]) * 128)
    compiled = grouped_matmul.compile(signature=SIGNATURE, constexprs=dict(NUM_PROGRAMS=4, **BLOCKS),
                                      num_warps=4, run_ptxas=False)
    launcher = Launcher(compiled)
    values = [0x1000, 0x2000, 0x3000, 0x4000, 0x5000, 3]
    first = launcher._with_hidden(values, 0, (5,), stream=0)
    assert first[:6] == values and first[6:9] == [bytes([i]) * 128 for i in (1, 2, 3)] and first[9] == 0x10000
    assert allocations == [3 * 5 * 128]  # a slot per call site and program
    # (element, address, shape, strides, copy box, swizzle, itemsize): the box as the tensor, over the workspace
    assert [e[:4] for e in encoded] == [("fp16", 0x10000, (64, 32), (32, 1)), ("fp16", 0x10000, (32, 64), (64, 1)),
                                        ("fp16", 0x10000, (64, 64), (64, 1))]
    assert launcher._with_hidden(values, 0, (2, 2), stream=0) == first and len(encoded) == 3  # fits: kept
    grown = launcher._with_hidden(values, 0, (4, 4), stream=0)
    assert allocations == [3 * 5 * 128, 3 * 16 * 128] and freed == [0x10000] and grown[9] == 0x20000
    other_stream = launcher._with_hidden(values, 0, (1,), stream=7)  # may overlap: a workspace of its own
    assert allocations[-1] == 3 * 128 and other_stream[9] == 0x30000 and other_stream[6:9] != grown[6:9]


def test_a_constant_stride_off_16_bytes_is_refused_at_its_line():
    @tl.jit
    def odd_pitch(x_ptrs, n):
        x = tl.load(x_ptrs).to(tl.pointer_type(tl.float16))
        desc = tl.make_tensor_descriptor(x, [n, n], [12, 1], [16, 64])
        desc.store([0, 0], desc.load([0, 0]))

    with pytest.raises(Exception, match=r"strides\[:-1\] multiples of 16 bytes.*strides\[0\] is 12") as error:
        odd_pitch.compile(signature={"x_ptrs": "*i64", "n": "i32"}, num_warps=4, run_ptxas=False)
    assert error.value.loc.line == odd_pitch.fn.__code__.co_firstlineno + 3
