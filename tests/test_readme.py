"""README.md's examples run as written (one namespace, in order), so the tour stays true."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_examples_run():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README.md has no python examples"
    namespace = {}
    for block in blocks:
        exec(compile(block, str(README), "exec"), namespace)
    assert namespace["L"](lane=3) == (1, 1)
    assert namespace["plan"].kind == "shared_round_trip"


def test_readme_set_up_commands_are_the_ci_commands():
    text = README.read_text()
    assert "pip install . && weft demo" in text
    assert 'pip install ".[test]" && python -m pytest' in text
    ci = (README.parent / ".ci" / "run").read_text()
    assert 'pip install --quiet ".[test]"' in ci and "python -m pytest" in ci


def test_readme_lowlevel_kernel_runs_on_the_emulator(tmp_path, monkeypatch):
    # The kernel example needs its source in a file (the frontend reads it), so it runs as
    # a script rather than through exec.
    blocks = re.findall(r"```py\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) == 2  # the first kernel, and one tile through TMA and wgmma
    monkeypatch.setenv("WEFT_CACHE_DIR", str(tmp_path / "cache"))
    import runpy

    for index, block in enumerate(blocks):
        script = tmp_path / f"readme_kernel_{index}.py"
        script.write_text(block)
        runpy.run_path(str(script), run_name="__main__")
