"""The code in README.md and the guides in docs/ runs as written, so the tour stays true.

```python blocks of one file run in one namespace, in order; ```py blocks are kernels,
run one by one as scripts (the frontend reads a kernel's source from its file)."""

import re
import runpy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
GUIDES = [ROOT / "docs" / "lowlevel.md", ROOT / "docs" / "highlevel.md"]


def _blocks(path: Path, fence: str) -> list:
    return re.findall(rf"```{fence}\n(.*?)```", path.read_text(), flags=re.S)


def _run_kernel_blocks(path: Path, tmp_path, monkeypatch) -> int:
    blocks = _blocks(path, "py")
    monkeypatch.setenv("WEFT_CACHE_DIR", str(tmp_path / "cache"))
    for index, block in enumerate(blocks):
        script = tmp_path / f"{path.stem}_kernel_{index}.py"
        script.write_text(block)
        runpy.run_path(str(script), run_name="__main__")
    return len(blocks)


def test_readme_set_up_commands_are_the_ci_commands():
    text = README.read_text()
    assert "pip install . && weft demo" in text
    assert 'pip install ".[test]" && python -m pytest' in text
    ci = (ROOT / ".ci" / "run").read_text()
    assert 'pip install --quiet ".[test]"' in ci and "python -m pytest" in ci


def test_readme_is_a_landing_page():
    text = README.read_text()
    assert len(text.splitlines()) <= 200, "README.md is the landing page; move detail into docs/"
    for link in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (ROOT / link).is_file(), f"README.md links to {link}, which does not exist"
    for guide in GUIDES:
        assert f"docs/{guide.name}" in text


def test_readme_first_kernels_run_on_the_emulator(tmp_path, monkeypatch):
    # A first kernel in each layer: lowlevel (layouts chosen) and highlevel (inferred).
    assert _run_kernel_blocks(README, tmp_path, monkeypatch) == 2


def test_lowlevel_guide_python_examples_run():
    guide = GUIDES[0]
    namespace = {}
    blocks = _blocks(guide, "python")
    assert blocks, f"{guide.name} has no python examples"
    for block in blocks:
        exec(compile(block, str(guide), "exec"), namespace)
    assert namespace["L"](lane=3) == (1, 1)
    assert namespace["plan"].kind == "shared_round_trip"


@pytest.mark.parametrize("guide, kernels", [(GUIDES[0], 4), (GUIDES[1], 3)], ids=lambda g: getattr(g, "name", g))
def test_guide_kernels_run_on_the_emulator(guide, kernels, tmp_path, monkeypatch):
    # The lowlevel guide: the first kernel, an autotuned one, an aggregate carried through
    # a loop, and one tile through TMA and wgmma; the
    # highlevel guide: a kernel and the stages its compile keeps, a tl.dot matmul, and an
    # autotuned kernel.
    assert _run_kernel_blocks(guide, tmp_path, monkeypatch) == kernels


def test_docs_links_resolve():
    for page in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        for link in re.findall(r"\]\(([^)#:]+\.md)", page.read_text()):
            target = (page.parent / link).resolve()
            assert target.is_file(), f"{page.name} links to {link}, which does not exist"
