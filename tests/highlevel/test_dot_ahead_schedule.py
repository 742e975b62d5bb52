"""What ptxas makes of issue_dot_ahead's loop (launch option dot_ahead): the softmax's
exponentials sit between S's wait and P V's wait in the SASS, so they run while P V does.

Without an anchor before P V's wait ptxas hoists that wait to right after S's wait,
although the PTX has it after the softmax: nothing overlaps (WarpgroupMmaWait.anchor).
And the loop refills K and V by cp.async, as the serial loop does: its block pointers'
offsets reach it through the peeled block's If, whose results axis_analysis now joins."""

import re
import subprocess

import pytest

from weft.compiler.backend.ptx_asm import WAIT_ANCHORS
from weft.compiler.cuda_tools import find_cuobjdump
from weft.highlevel import attention_example

from ._compile import HAS_PTXAS
from .test_attention_example import SIGNATURE, SPECIALIZATION, constexprs

NUM_WARPS, STAGES = 8, 3


def compiled(head_dim, block, dot_ahead):
    return attention_example.attention_kernel.compile(signature=SIGNATURE, constexprs=constexprs(head_dim, block, False),
                                                      num_warps=NUM_WARPS, num_stages=STAGES,
                                                      specialization=SPECIALIZATION, dot_ahead=dot_ahead,
                                                      block_pointer_tma=False)  # the cp.async rings


def loop_text(ptx: str) -> str:
    """The PTX from the loop's S wait (the only wait_group 1) to the end of its block."""
    start = ptx.index("wgmma.wait_group.sync.aligned 1;")
    return ptx[start:ptx.index("bra.uni", start)]


@pytest.mark.parametrize("dot_ahead", [True, "sleep", "fence", "none"])
def test_pv_wait_in_the_loop_follows_the_anchor_asked_for(dot_ahead):
    ptx = compiled(64, (128, 64), dot_ahead).asm["ptx"]
    loop = loop_text(ptx)
    anchor = WAIT_ANCHORS.get({True: "volatile"}.get(dot_ahead, dot_ahead))
    before_wait = loop[:loop.index("wgmma.wait_group.sync.aligned 0;")]
    if anchor is None:
        assert not any(a.strip() in before_wait for a in WAIT_ANCHORS.values())
    else:
        assert before_wait.rstrip().endswith(anchor.strip())
        assert loop.count(anchor.strip()) == 1


def test_the_loop_refills_by_cp_async():
    """The serial loop's copies, not 2-byte loads and stores (the peeled block's If used
    to hide that the block pointers' offsets stay multiples of the block)."""
    ptx = compiled(64, (128, 64), True).asm["ptx"]
    assert "ld.global.b16" not in ptx
    assert ptx.count("cp.async.cg.shared.global") == compiled(64, (128, 64), False).asm["ptx"].count(
        "cp.async.cg.shared.global") + 4  # the peeled block's refill


def sass_of(cubin: bytes, tmp_path) -> list[str]:
    path = tmp_path / "kernel.cubin"
    path.write_bytes(cubin)
    text = subprocess.run([find_cuobjdump(), "-sass", str(path)], capture_output=True, text=True, check=True).stdout
    return re.findall(r"/\*[0-9a-f]{4}\*/\s+([^;]*);", text)


@pytest.mark.skipif(not HAS_PTXAS or find_cuobjdump() is None, reason="needs ptxas and cuobjdump/nvdisasm")
@pytest.mark.parametrize("head_dim", [64, 128])
def test_sass_runs_the_softmax_exponentials_between_the_two_waits(head_dim, tmp_path):
    block = (128, 64)
    instructions = sass_of(compiled(head_dim, block, True).asm["cubin"], tmp_path)
    s_wait = [i for i, text in enumerate(instructions) if text.startswith("WARPGROUP.DEPBAR.LE gsb0, 0x1")]
    assert len(s_wait) == 1
    pv_wait = next(i for i in range(s_wait[0], len(instructions))
                   if instructions[i].startswith("WARPGROUP.DEPBAR.LE gsb0, 0x0"))
    between = instructions[s_wait[0]:pv_wait]
    exps_per_thread = block[0] * block[1] // (32 * NUM_WARPS)
    assert sum(text.startswith("MUFU.EX2") for text in between) >= exps_per_thread
    assert not any(text.startswith("LDG.E.U16") for text in instructions)
