"""The package as installed: what importing it pulls in, and which copy the tests see."""

import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import weft

ROOT = Path(__file__).resolve().parents[1]


def test_importing_layouts_does_not_import_the_test_extras():
    code = (
        "import sys, weft.layouts; "
        "print(sorted(m for m in ('hypothesis', 'weft.layouts.strategies', 'pytest') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_the_console_script_module_is_packaged():
    from weft import cli

    assert callable(cli.main)


@pytest.mark.skipif(
    not os.environ.get("WEFT_TEST_INSTALLED"), reason="set by .ci/run, which installs weft non-editable"
)
def test_tests_run_against_the_installed_package():
    location = Path(weft.__file__).resolve().parent
    assert location != ROOT, f"weft was imported from the checkout {ROOT}, not the install"
    assert "site-packages" in location.parts


def test_every_package_folder_is_listed_in_pyproject():
    """pyproject lists packages by hand (the root is the package); a folder missing from the
    list works in an editable install but is absent from a regular one."""
    tomllib = pytest.importorskip("tomllib")
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {"weft"}
    for init in ROOT.rglob("__init__.py"):
        parts = init.parent.relative_to(ROOT).parts
        if parts and not any(p.startswith(".") or p in ("tests", "build", "dist", "benchmarks") for p in parts):
            found.add(".".join(("weft", *parts)))
    missing = sorted(found - listed)
    assert not missing, f"add to [tool.setuptools] packages in pyproject.toml: {missing}"
    assert not sorted(listed - found), f"listed but not in the tree: {sorted(listed - found)}"
    assert not any(name.startswith("weft.benchmarks") for name in listed), "benchmarks/ is not installed"


def test_a_built_wheel_holds_no_benchmarks_and_no_results(tmp_path):
    """benchmarks/ runs from the repository root on the GPU machine; the wheel carries the
    package alone (the dated results and journals live in docs/ and git history)."""
    build_meta = pytest.importorskip("setuptools.build_meta")
    del build_meta  # built in a subprocess, from a copy, so the checkout gets no build/ folder
    try:  # setuptools builds wheels itself from 70.1; before, the `wheel` package does
        import setuptools.command.bdist_wheel  # noqa: F401
    except ImportError:
        pytest.importorskip("wheel.bdist_wheel", reason="this setuptools needs the wheel package to build wheels")
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".*", "build", "dist", "*.egg-info", "__pycache__", ".venv"))
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    code = "import sys; from setuptools import build_meta; print(build_meta.build_wheel(sys.argv[1]))"
    result = subprocess.run([sys.executable, "-c", code, str(wheels)], cwd=source,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    (wheel,) = wheels.glob("weft-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "weft/__init__.py" in names and "weft/kernels/attention/__init__.py" in names
    strays = [n for n in names if n.startswith(("weft/benchmarks/", "weft/docs/", "weft/tests/"))]
    assert not strays, f"the wheel carries files that are not the package: {strays[:10]}"


@pytest.mark.skipif(
    not os.environ.get("WEFT_TEST_INSTALLED"), reason="set by .ci/run, which installs weft non-editable"
)
def test_the_installed_package_has_no_benchmarks():
    assert importlib.util.find_spec("weft.benchmarks") is None


def _project():
    tomllib = pytest.importorskip("tomllib")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _names(requirements) -> set:
    return {re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0].lower() for r in requirements}


def test_a_plain_install_brings_ptxas():
    """`pip install .` must give cubins and `--dump report` without a CUDA toolkit."""
    assert "nvidia-cuda-nvcc" in _names(_project()["dependencies"])


def test_the_sass_extra_brings_cuobjdump_and_the_readme_says_so():
    assert {"nvidia-cuda-cuobjdump", "nvidia-cuda-nvdisasm"} <= _names(_project()["optional-dependencies"]["sass"])
    assert 'pip install ".[sass]"' in (ROOT / "README.md").read_text()


def _wheel_file(distribution: str, tool: str):
    """The path of `tool` inside an installed wheel, from its RECORD, or skip."""
    try:
        files = importlib.metadata.files(distribution) or ()
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"{distribution} is not installed here")
    found = [f for f in files if f.name == tool and f.parent.name == "bin"]
    assert found, f"{distribution} ships no bin/{tool}"
    return Path(found[0].locate()).resolve()


@pytest.mark.parametrize("distribution, tool, finder", [
    ("nvidia-cuda-nvcc", "ptxas", "find_ptxas"),
    ("nvidia-cuda-cuobjdump", "cuobjdump", "find_cuobjdump"),
])
def test_the_tool_of_an_installed_wheel_is_found_without_a_toolkit(monkeypatch, tmp_path, distribution, tool, finder):
    """compiler/cuda_tools.py looks where the wheel really puts its tool (its RECORD says where)."""
    from weft.compiler import cuda_tools

    expected = _wheel_file(distribution, tool)
    monkeypatch.delenv("WEFT_PTXAS", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no toolkit on PATH
    found = getattr(cuda_tools, finder)()
    assert found is not None and Path(found).resolve() == expected
