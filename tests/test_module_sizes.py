"""Files stay small (STYLE.md, habit 13): no module of the package passes 800 lines."""

from pathlib import Path

LIMIT = 800
ROOT = Path(__file__).resolve().parents[1]  # the repository root is the package
SKIPPED = {"tests", "build", "dist"}


def package_modules():
    """Every non-test .py file of the package, skipping hidden and build folders."""
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT).parts
        if any(p.startswith(".") or p in SKIPPED or p.endswith(".egg-info") for p in parts[:-1]):
            continue
        yield path


def line_count(path: Path) -> int:
    with path.open("rb") as f:
        return sum(1 for _ in f)


def test_no_module_is_over_the_limit():
    modules = list(package_modules())
    assert modules, f"found no modules under {ROOT}"
    too_long = sorted(
        ((line_count(p), p.relative_to(ROOT)) for p in modules if line_count(p) > LIMIT),
        reverse=True,
    )
    report = "\n".join(f"  {count:6d}  {path}" for count, path in too_long)
    assert not too_long, f"modules over {LIMIT} lines (split them by concept):\n{report}"
