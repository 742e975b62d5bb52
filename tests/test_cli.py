"""The `weft` command: the demo checks itself; show-layout prints tables and refuses bad
arguments with an argparse message (exit status 2), never a traceback."""

import re
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from weft.cli import main


def run(capsys, *argv):
    status = main(list(argv))
    return status, capsys.readouterr().out


def test_demo_checks_the_conversion_plan():
    result = subprocess.run(
        [sys.executable, "-m", "weft.cli", "demo"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "check: ok" in result.stdout
    assert "conversion plan, 16-bit elements:" in result.stdout
    assert "T0:R0" in result.stdout


@pytest.mark.parametrize(
    "argv, first_cell",
    [
        (["wgmma", "--shape", "64", "64", "--instr-n", "64"], "T0:R0"),
        (["blocked", "--shape", "32", "64", "--size-per-thread", "1", "8", "--threads", "4", "8"], "T0:R0"),
        (["mma_v2", "--shape", "32", "32", "--warps", "2", "2"], "T0:R0"),
        (["nvmma_shared", "--shape", "64", "64", "--swizzle", "128"], "0/b0"),
        (["swizzled_shared", "--shape", "16", "64", "--vec", "8", "--max-phase", "8"], "0/b0"),
        (["blocked", "--shape", "128"], "T0:R0"),
    ],
)
def test_show_layout_prints_a_table(capsys, argv, first_cell):
    status, out = run(capsys, "show-layout", *argv)
    assert status == 0
    assert re.search(r"\|\s+" + re.escape(first_cell) + r"\s", out), out[:400]


def test_show_layout_writes_an_svg(capsys, tmp_path):
    path = tmp_path / "acc.svg"
    status, out = run(capsys, "show-layout", "wgmma", "--shape", "64", "32", "--svg", str(path))
    assert status == 0 and f"wrote {path}" in out
    assert ET.parse(path).getroot().tag.endswith("svg")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["blocked", "--shape", "48", "64"], "argument --shape: 48 is not a power of two"),
        (["blocked", "--shape", "64", "64", "--warps", "4"], "argument --warps: expected 2 values"),
        (["blocked", "--shape", "64", "64", "--threads", "4", "4"], "argument --threads"),
        (["blocked", "--shape", "64", "64", "--order", "1", "1"], "argument --order"),
        (["wgmma", "--shape", "64", "64", "--warps", "2", "1"], "multiple of 4"),
        (["wgmma", "--shape", "64", "64", "--instr-n", "512"], "instr_n = 512"),
        (["nvmma_shared", "--shape", "64", "8", "--swizzle", "128"], "swizzle_bytes=128"),
        (["nvmma_shared", "--shape", "64", "64", "--swizzle", "96"], "argument --swizzle"),
        (["hexagonal", "--shape", "8"], "argument KIND"),
        (["blocked"], "--shape"),
        (["blocked", "--shape", "8", "8", "--svg", "/nonexistent/dir/x.svg"], "argument --svg"),
    ],
)
def test_bad_arguments_exit_2_naming_the_problem(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        main(["show-layout", *argv])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_a_subcommand_is_required(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([])
    assert exit_info.value.code == 2


def test_options_a_kind_ignores_are_refused(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["show-layout", "wgmma", "--shape", "64", "64", "--threads", "4", "8"])
    assert exit_info.value.code == 2
    assert "argument --threads: not used by wgmma" in capsys.readouterr().err


USER_KERNEL = '''
from weft import lowlevel as ll

@ll.jit
def scale(x_ptr, out_ptr, n, factor, BLOCK: ll.constexpr):
    layout: ll.constexpr = ll.BlockedLayout([4], [32], [4], [0])
    offsets = ll.program_id(0) * BLOCK + ll.arange(0, BLOCK, layout=layout)
    mask = offsets < n
    ll.store(out_ptr + offsets, ll.load(x_ptr + offsets, mask=mask) * factor, mask=mask)
'''
SCALE_ARGS = ["--signature", "x_ptr=*fp32", "out_ptr=*fp32", "n=i32", "factor=fp32", "--constexpr", "BLOCK=512"]


@pytest.fixture
def user_kernel(tmp_path):
    path = tmp_path / "user_kernel.py"
    path.write_text(USER_KERNEL)
    return path


def test_compile_dumps_the_layout_ir_of_a_user_file(capsys, user_kernel):
    status, out = run(capsys, "compile", f"{user_kernel}:scale", *SCALE_ARGS, "--dump", "layout")
    assert status == 0
    assert "kernel @scale(%x_ptr: *fp32, %out_ptr: *fp32, %n: i32, %factor: fp32) num_warps=4" in out
    assert "%mask = compare [predicate=lt] %offsets" in out


def test_compile_dumps_ptx_for_sm90a_with_vectors_when_aligned(capsys, user_kernel):
    status, out = run(capsys, "compile", f"{user_kernel}:scale", *SCALE_ARGS,
                      "--aligned", "x_ptr", "out_ptr", "n", "--dump", "ptx")
    assert status == 0
    assert ".target sm_90a" in out and ".v4.b32" in out


def test_compile_of_a_kernel_inside_weft(capsys):
    import weft.kernels.vector_add as module

    status, out = run(capsys, "compile", f"{module.__file__}:add_kernel", "--signature", "x_ptr=*fp32",
                      "y_ptr=*fp32", "out_ptr=*fp32", "n=i32", "--constexpr", "BLOCK=1024", "VEC=4",
                      "WARPS=4", "--dump", "llir")
    assert status == 0 and "define" in out and "add_kernel" in out


def test_compile_errors_are_messages_not_tracebacks(capsys, user_kernel):
    with pytest.raises(SystemExit) as exit_info:
        main(["compile", f"{user_kernel}:missing", *SCALE_ARGS])
    assert exit_info.value.code == 2
    assert "defines no kernel 'missing'; kernels there: scale" in capsys.readouterr().err
    status = main(["compile", f"{user_kernel}:scale", "--signature", "x_ptr=*fp32"])
    assert status == 1
    assert "missing ['out_ptr', 'n', 'factor']" in capsys.readouterr().err


def test_demo_runs_softmax_and_checks_it():
    result = subprocess.run([sys.executable, "-m", "weft.cli", "demo"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "softmax of a" in result.stdout
    assert result.stdout.count("check: ok") == 2


def test_a_closed_pipe_is_not_an_error():
    # `weft demo | head -2`: the reader leaves early; weft must exit 0 without a traceback.
    result = subprocess.run(f"{sys.executable} -m weft.cli demo | head -2", shell=True,
                            capture_output=True, text=True, timeout=300,
                            executable="/bin/bash")
    assert "Traceback" not in result.stderr, result.stderr
