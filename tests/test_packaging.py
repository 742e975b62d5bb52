"""The package as installed: what importing it pulls in, and which copy the tests see."""

import os
import subprocess
import sys
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
        if parts and not any(p.startswith(".") or p in ("tests", "build", "dist") for p in parts):
            found.add(".".join(("weft", *parts)))
    missing = sorted(found - listed)
    assert not missing, f"add to [tool.setuptools] packages in pyproject.toml: {missing}"
    assert not sorted(listed - found), f"listed but not in the tree: {sorted(listed - found)}"
