"""WEFT_DUMP prints the named stages and passes while a kernel compiles."""

import subprocess
import sys
import textwrap


def test_weft_dump_prints_the_requested_stages_and_passes(tmp_path):
    script = tmp_path / "dump_kernel.py"
    script.write_text(textwrap.dedent('''
        from weft import lowlevel as ll

        @ll.jit
        def copy(x_ptr, y_ptr, n):
            layout: ll.constexpr = ll.BlockedLayout([4], [32], [4], [0])
            offsets = ll.arange(0, 512, layout=layout)
            ll.store(y_ptr + offsets, ll.load(x_ptr + offsets, mask=offsets < n), mask=offsets < n)

        copy.compile(signature={"x_ptr": "*fp32", "y_ptr": "*fp32", "n": "i32"}, num_warps=4)
    '''))
    env = {"WEFT_DUMP": "layout,insert_barriers,ptx", "WEFT_CACHE_DIR": str(tmp_path / "cache"),
           "PATH": "/usr/bin:/bin"}
    import os

    env = {**os.environ, **env}
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    dumped = result.stderr
    assert "// ----- weft dump: insert_barriers -----" in dumped
    assert "// ----- weft dump: layout -----" in dumped
    assert "// ----- weft dump: ptx -----" in dumped and ".target sm_90a" in dumped
    assert "weft dump: llir" not in dumped  # only what was asked for
