"""WEFT_DUMP prints the named stages and passes on every path a kernel takes to run: a
compile, a disk-cache hit (the stages the entry keeps) and the emulator (up to `layout`)."""

import os
import subprocess
import sys
import textwrap

KERNEL = '''
import numpy as np
from weft import lowlevel as ll

@ll.jit
def copy(x_ptr, y_ptr, n):
    layout: ll.constexpr = ll.BlockedLayout([4], [32], [4], [0])
    offsets = ll.arange(0, 512, layout=layout)
    ll.store(y_ptr + offsets, ll.load(x_ptr + offsets, mask=offsets < n), mask=offsets < n)

'''
COMPILE = KERNEL + 'copy.compile(signature={"x_ptr": "*fp32", "y_ptr": "*fp32", "n": "i32"}, num_warps=4)\n'
EMULATE = KERNEL + '''
x = np.arange(512, dtype=np.float32)
y = np.zeros_like(x)
copy[(1,)](x, y, 512)
assert (y == x).all()
'''


def _run(tmp_path, program: str, dump: str) -> str:
    script = tmp_path / "dump_kernel.py"
    script.write_text(textwrap.dedent(program))
    env = {**os.environ, "WEFT_DUMP": dump, "WEFT_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("WEFT_NO_CACHE", None)
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stderr


def test_weft_dump_prints_the_requested_stages_and_passes(tmp_path):
    dumped = _run(tmp_path, COMPILE, "layout,insert_barriers,ptx")
    assert "// ----- weft dump: insert_barriers -----" in dumped
    assert "// ----- weft dump: layout -----" in dumped
    assert "// ----- weft dump: ptx -----" in dumped and ".target sm_90a" in dumped
    assert "weft dump: llir" not in dumped  # only what was asked for


def test_a_disk_cache_hit_prints_the_stages_it_keeps(tmp_path):
    first = _run(tmp_path, COMPILE, "layout,ptx")
    second = _run(tmp_path, COMPILE, "layout,insert_barriers,ptx")  # a new process: a disk hit
    for stage in ("layout", "ptx"):
        assert f"// ----- weft dump: {stage} ----- (from the disk cache)" in second
        text = first.split(f"// ----- weft dump: {stage} -----\n")[1].split("// -----")[0]
        assert text.strip() and text in second
    assert "// ----- weft dump: insert_barriers -----\n(kernel 'copy' came from the disk cache" in second


def test_the_emulator_path_prints_up_to_layout(tmp_path):
    dumped = _run(tmp_path, EMULATE, "source,insert_barriers,layout,ptx")
    assert "// ----- weft dump: source -----\n@ll.jit\ndef copy(x_ptr, y_ptr, n):" in dumped
    assert "// ----- weft dump: insert_barriers -----" in dumped
    assert "store" in dumped.split("// ----- weft dump: layout -----")[1]
    assert "// ----- weft dump: ptx -----\n(not built: kernel `copy` ran on the CPU emulator" in dumped
