"""ptxas discovery, assembly of hand-written sm_90a PTX, and the -v report parser."""

import stat

import pytest

from weft.compiler import cuda_tools
from weft.compiler.backend import ptxas
from weft.compiler.backend.ptxas import PtxasError

needs_ptxas = pytest.mark.skipif(ptxas.find_ptxas() is None, reason="no ptxas on this machine")


@needs_ptxas
def test_assemble_vadd_reports_registers_and_no_spills(vadd_ptx):
    cubin, report = ptxas.assemble(vadd_ptx)
    assert cubin[:4] == b"\x7fELF"
    assert report["kernels"].keys() == {"vadd"}
    assert 0 < report["registers"] <= 32
    assert (report["spill_stores"], report["spill_loads"], report["stack_frame"]) == (0, 0, 0)
    assert report["shared_bytes"] == 0
    assert "Compiling entry function 'vadd' for 'sm_90a'" in report["text"]


@needs_ptxas
def test_assemble_reports_static_shared_memory_and_barriers(reverse_ptx):
    _, report = ptxas.assemble(reverse_ptx, max_registers=32, opt_level=2)
    assert report["shared_bytes"] == 1024
    assert report["barriers"] == 1


@needs_ptxas
def test_bad_ptx_raises_with_the_ptxas_log(vadd_ptx):
    with pytest.raises(PtxasError) as info:
        ptxas.assemble(vadd_ptx.replace("add.f32  ", "addd.f32 "))
    assert "Not a name of any known instruction: 'addd'" in info.value.log
    assert "kernel.ptx, line 36" in str(info.value)  # temp path replaced by a stable name


def test_parse_report_with_spills_and_two_entries():
    text = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'big' for 'sm_90a'
ptxas info    : Function properties for big
    96 bytes stack frame, 120 bytes spill stores, 88 bytes spill loads
ptxas info    : Used 255 registers, used 2 barriers, 197632 bytes smem, 400 bytes cmem[0]
ptxas info    : Compiling entry function 'small' for 'sm_90a'
ptxas info    : Function properties for small
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 8 registers, used 0 barriers
"""
    report = ptxas.parse_report(text)
    big = {"registers": 255, "spill_stores": 120, "spill_loads": 88, "stack_frame": 96,
           "shared_bytes": 197632, "barriers": 2}
    assert {k: report[k] for k in big} == big
    assert report["kernels"]["big"] == big
    assert report["kernels"]["small"]["registers"] == 8
    assert report["text"] == text
    assert report["performance_warnings"] == []


def test_parse_report_keeps_performance_advisories():
    text = """ptxas info    : Compiling entry function 'mm' for 'sm_90a'
ptxas info    : (C7515) Potential Performance Loss: wgmma.mma_async instructions are serialized due to non wgmma instructions defining accumulator registers of a wgmma between start and end of the pipeline stage in the function 'mm'
ptxas info    : Used 154 registers, used 1 barriers
"""
    report = ptxas.parse_report(text)
    assert report["registers"] == 154
    assert report["performance_warnings"] == [
        "wgmma.mma_async instructions are serialized due to non wgmma instructions defining accumulator "
        "registers of a wgmma between start and end of the pipeline stage in the function 'mm'"]


def test_weft_ptxas_pointing_nowhere_is_an_error(monkeypatch, tmp_path):
    monkeypatch.setenv("WEFT_PTXAS", str(tmp_path / "no-such-ptxas"))
    with pytest.raises(PtxasError, match="WEFT_PTXAS=.*is not an executable file"):
        cuda_tools.find_ptxas()


def test_weft_ptxas_wins_over_path(monkeypatch, tmp_path):
    fake = tmp_path / "ptxas"
    fake.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 99.9, V99.9.1'\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("WEFT_PTXAS", str(fake))
    assert cuda_tools.find_ptxas() == str(fake)
    assert cuda_tools.ptxas_version() == "V99.9.1"


def test_search_falls_back_to_wheels(monkeypatch, tmp_path):
    wheel = tmp_path / "site-packages"
    binary = wheel / "nvidia" / "cuda_nvcc" / "bin" / "ptxas"
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    monkeypatch.delenv("WEFT_PTXAS", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(cuda_tools, "_site_dirs", lambda: [str(wheel)])
    assert cuda_tools.find_ptxas() == str(binary)


def test_missing_ptxas_raises_a_helpful_error(monkeypatch, tmp_path, vadd_ptx):
    monkeypatch.delenv("WEFT_PTXAS", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(cuda_tools, "_site_dirs", lambda: [str(tmp_path)])
    assert cuda_tools.find_ptxas() is None
    with pytest.raises(PtxasError, match="ptxas not found; install the `nvidia-cuda-nvcc`"):
        ptxas.assemble(vadd_ptx)


def test_cuobjdump_is_found_where_the_sass_extra_puts_it(monkeypatch, tmp_path):
    """The nvidia-cuda-cuobjdump wheel installs nvidia/cu13/bin/cuobjdump (beside nvdisasm)."""
    site = tmp_path / "site-packages"
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(cuda_tools, "_site_dirs", lambda: [str(site)])
    assert cuda_tools.find_cuobjdump() is None
    binary = site / "nvidia" / "cu13" / "bin" / "cuobjdump"
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    assert cuda_tools.find_cuobjdump() == str(binary)
