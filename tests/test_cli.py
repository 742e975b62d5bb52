"""The `weft` command: the demo checks itself; show-layout prints tables; compile prints a
stage; bad arguments get an argparse message (exit status 2) and a kernel, import or tool
failure one line (exit status 1), never a traceback; the documented examples run."""

import os
import re
import shlex
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

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


# ------------------------------------------------------------------ edges a new user hit
ROOT = Path(__file__).resolve().parents[1]


def documented_compile_commands(text: str) -> list[list[str]]:
    """Each `weft compile ...` command in `text`, its backslash-continued lines joined."""
    joined = re.sub(r"\\\s*\n\s*", " ", text)
    return [shlex.split(line.strip().split("#")[0])
            for line in joined.splitlines() if line.strip().startswith("weft compile ")]


@pytest.mark.parametrize("where", ["cli_compile docstring", "README.md"])
def test_the_documented_compile_example_runs_from_a_clone(capsys, monkeypatch, tmp_path, where):
    from weft import cli_compile

    text = cli_compile.__doc__ if where == "cli_compile docstring" else (ROOT / "README.md").read_text()
    commands = documented_compile_commands(text)
    assert commands, f"no `weft compile` example in the {where}"
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("WEFT_CACHE_DIR", str(tmp_path))
    for argv in commands:
        status, out = run(capsys, *argv[1:])
        assert status == 0, argv
        assert ".target sm_90a" in out


def test_version_prints_the_package_version(capsys):
    import tomllib

    import weft

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == f"weft {weft.__version__}\n"
    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"] == weft.__version__


@pytest.mark.parametrize("warps", ["3", "0", "64", "four"])
def test_num_warps_must_be_a_power_of_two_up_to_32(capsys, user_kernel, warps):
    with pytest.raises(SystemExit) as exit_info:
        main(["compile", f"{user_kernel}:scale", *SCALE_ARGS, "--num-warps", warps])
    assert exit_info.value.code == 2
    assert "argument --num-warps" in capsys.readouterr().err


@pytest.mark.parametrize("name, reason", [("nope", "'nope' is not a parameter of scale"),
                                          ("BLOCK", "'BLOCK' is not in --signature")])
def test_aligned_names_must_be_runtime_parameters(capsys, user_kernel, name, reason):
    with pytest.raises(SystemExit) as exit_info:
        main(["compile", f"{user_kernel}:scale", *SCALE_ARGS, "--aligned", "x_ptr", name])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --aligned: {reason}" in err
    assert "x_ptr, out_ptr, n, factor" in err


@pytest.mark.parametrize("ptxas", ["missing", "not-executable"])
def test_a_bad_weft_ptxas_is_one_line_not_a_traceback(tmp_path, user_kernel, ptxas):
    path = tmp_path / "ptxas"
    if ptxas == "not-executable":
        path.write_text("not a program")
    env = dict(os.environ, WEFT_PTXAS=str(path), WEFT_CACHE_DIR=str(tmp_path / "cache"))
    result = subprocess.run([sys.executable, "-m", "weft.cli", "compile", f"{user_kernel}:scale", *SCALE_ARGS,
                             "--dump", "report"], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        f"weft compile: WEFT_PTXAS={str(path)!r} is not an executable file; "
        "fix the path or unset WEFT_PTXAS to search PATH and wheels"]


@pytest.mark.parametrize("source, message", [
    ("def broken(:\n", "SyntaxError"),
    ("import no_such_module_anywhere\n", "ModuleNotFoundError: No module named 'no_such_module_anywhere'"),
    ("x = 1\nraise RuntimeError('boom')\n", "RuntimeError: boom"),
])
def test_a_file_that_does_not_import_is_one_line(capsys, tmp_path, source, message):
    path = tmp_path / "broken_kernels.py"
    path.write_text(source)
    status = main(["compile", f"{path}:k", *SCALE_ARGS])
    assert status == 1
    err = capsys.readouterr().err
    assert f"weft compile: cannot import {path}: {message}" in err and str(path) + ":" in err


def test_dump_report_without_ptxas_says_where_ptxas_comes_from(capsys, monkeypatch, tmp_path, user_kernel):
    from weft.compiler.backend import ptxas

    monkeypatch.setenv("WEFT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(ptxas, "find_ptxas", lambda: None)
    status = main(["compile", f"{user_kernel}:scale", *SCALE_ARGS, "--dump", "report"])
    assert status == 1
    assert "--dump report needs a cubin, and ptxas not found; install the `nvidia-cuda-nvcc` wheel" \
        in capsys.readouterr().err


def test_dump_sass_without_cuobjdump_names_the_extra(capsys, monkeypatch, tmp_path, user_kernel):
    from weft.compiler import cuda_tools

    if cuda_tools.find_ptxas() is None:
        pytest.skip("no ptxas, so no cubin to disassemble")
    monkeypatch.setenv("WEFT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cuda_tools, "find_cuobjdump", lambda: None)
    status = main(["compile", f"{user_kernel}:scale", *SCALE_ARGS, "--dump", "sass"])
    assert status == 1
    assert "--dump sass needs cuobjdump, which was not found: pip install 'weft[sass]'" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [
    ["compile", "no_such_module:k", *SCALE_ARGS],
    ["compile", "weft.kernels.no_such_module:k", *SCALE_ARGS],
    ["compile", "weft.kernels.vector_add:no_such_kernel", *SCALE_ARGS],
    ["compile", "/no/such/file.py:k", *SCALE_ARGS],
    ["compile", "USER:scale", "--signature", "x_ptr=*fp33", "out_ptr=*fp32", "n=i32", "factor=fp32",
     "--constexpr", "BLOCK=512"],
    ["compile", "USER:scale", *SCALE_ARGS[:-1], "BLOCK=500"],
    ["compile", "USER:scale", *SCALE_ARGS, "unknown=1"],
    ["compile", "USER:scale", *SCALE_ARGS[:-1], "BLOCK=[1"],
    ["compile", "USER:scale", *SCALE_ARGS, "--dump", "cubin"],
    ["show-layout", "wgmma", "--shape", "64"],
    ["show-layout", "blocked", "--shape", "64", "64", "--warps", "64", "1"],
    ["show-layout", "blocked", "--shape", "64", "--max-rows", "0"],
    ["demo", "extra"],
    ["--no-such-option"],
])
def test_bad_input_to_any_subcommand_is_a_message_not_a_traceback(capsys, monkeypatch, tmp_path, user_kernel, argv):
    monkeypatch.setenv("WEFT_CACHE_DIR", str(tmp_path / "cache"))
    argv = [a.replace("USER", str(user_kernel)) for a in argv]
    try:
        status = main(argv)  # an exception escaping here would be a traceback for the user
    except SystemExit as exit_info:
        status = exit_info.code
    assert status in (1, 2)
    err = capsys.readouterr().err
    assert any(line.startswith("weft") for line in err.splitlines()) and "Traceback" not in err
