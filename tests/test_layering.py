"""Layering (DESIGN.md): who may import whom, read from every module's imports.

    layouts/  <-  compiler/  <-  runtime/  <-  lowlevel/, highlevel/  <-  kernels/

The layout vocabulary (the descriptions kernels name, BlockedLayout and the rest, and the
rules of shape-changing ops) lives in layouts/, so the compiler types its layouts with
layouts/'s classes instead of receiving a language's classes through a registry.

Imports are read with `ast`, those inside functions included, relative ones resolved to
weft.* names, so a lazy import does not hide an upward one. Hardware limits are stated
once, in weft.compiler.hardware; ptxas runs behind the backend; the CPU emulator runs
without llvmlite (the backend's only third-party dependency).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the repository root is the package
PACKAGE = "weft"
SKIPPED = {"tests", "build", "dist"}
HARDWARE = "weft.compiler.hardware"

LANGUAGES = ("weft.lowlevel", "weft.highlevel")
RULES = (  # (importer, forbidden imports, the rule in words); an empty importer tuple: any
    (("weft.layouts",), "everything outside layouts/", "layouts/ imports nothing of weft"),
    (("weft.compiler",), LANGUAGES + ("weft.kernels", "weft.runtime"),
     "compiler/ imports no language, kernel or runtime module"),
    (("weft.runtime",), LANGUAGES + ("weft.kernels",), "runtime/ imports no language and no kernels/"),
    (LANGUAGES, ("weft.kernels",), "lowlevel/ and highlevel/ import no kernels/"),
)

# Names hardware limits go by, and values only a hardware limit has: stated anywhere but
# weft.compiler.hardware (or layouts/, below it, whose warp shape it re-exports) they are a
# second copy that can drift.
LIMIT_ALIASES = {"WARP_SIZE", "WARP_LANES", "WARPGROUP", "LANES_PER_WARP", "MAX_WARPS_PER_CTA",
                 "DEFAULT_SHARED_LIMIT", "MAX_THREADS"}
LIMIT_VALUES = {65536, 48 * 1024, 227 * 1024, 228 * 1024}


def package_modules() -> dict[str, Path]:
    """Every non-test module of the package by dotted name (packages by their own name)."""
    modules = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT).parts
        if any(p.startswith(".") or p in SKIPPED or p.endswith(".egg-info") for p in parts[:-1]):
            continue
        names = (PACKAGE,) + parts[:-1] + (() if parts[-1] == "__init__.py" else (path.stem,))
        modules[".".join(names)] = path
    return modules


MODULES = package_modules()


def imports_of(name: str, path: Path) -> list[tuple[str, int]]:
    """(imported weft module, line) for every import in the module, at any depth.
    `from x import y` names module x.y when y is a module, else x."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join(parent + ([node.module] if node.module else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.append((full if full in MODULES else base, node.lineno))
    return [(module, line) for module, line in found if module == PACKAGE or module.startswith(PACKAGE + ".")]


def within(module: str, prefixes) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def violations() -> list[str]:
    found = []
    for name, path in MODULES.items():
        for imported, line in dict.fromkeys(imports_of(name, path)):
            for importers, forbidden, rule in RULES:
                breaks = (not within(imported, importers) if forbidden == "everything outside layouts/"
                          else within(imported, forbidden))
                if within(name, importers) and breaks:
                    found.append(f"module {name} imports module {imported} (rule: {rule}) "
                                 f"at {path.relative_to(ROOT)}:{line}")
    return found


def test_the_import_parser_sees_lazy_and_relative_imports():
    """The rules below are only as good as the parser: lowlevel/jit.py imports the pipeline
    relatively (`from ..compiler import pipeline`) and the emulator inside a function."""
    imported = {module for module, _ in imports_of("weft.lowlevel.jit", MODULES["weft.lowlevel.jit"])}
    assert {"weft.compiler.pipeline", "weft.compiler.frontend", "weft.runtime.emulator",
            "weft.runtime.jit"} <= imported
    assert len(MODULES) > 100


def test_every_module_imports_only_from_its_own_layer_or_below():
    found = violations()
    assert not found, "layering violations:\n" + "\n".join(found)


def _classes_defined(path: Path) -> list[tuple[str, list[str], int]]:
    """(name, base names, line) of every class the module defines, at any depth."""
    return [(node.name, [ast.unparse(b) for b in node.bases], node.lineno)
            for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.ClassDef)]


def test_layout_descriptions_and_rules_live_in_layouts():
    """A layout description (a class named ...Layout, or built on one) is defined in
    layouts/ only; lowlevel/layouts.py, Gluon's path for them, only re-exports."""
    found = []
    for module, path in MODULES.items():
        if within(module, ("weft.layouts",)):
            continue
        for name, bases, line in _classes_defined(path):
            if name.endswith("Layout") and name != "ConvertLayout" or any(b.endswith("Layout") for b in bases):
                found.append(f"module {module} defines layout class {name} (rule: layout descriptions "
                             f"live in layouts/) at {path.relative_to(ROOT)}:{line}")
    assert not found, "\n".join(found)
    reexport = ast.parse(MODULES["weft.lowlevel.layouts"].read_text()).body
    assert all(isinstance(node, (ast.ImportFrom, ast.Expr)) or
               isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == ["__all__"]
               for node in reexport), "lowlevel/layouts.py may only import from layouts/ and list __all__"
    assert {module for module, _ in imports_of("weft.lowlevel.layouts", MODULES["weft.lowlevel.layouts"])} \
        == {"weft.layouts"}
    assert "weft.compiler.layout_rules" not in MODULES  # the rules are layouts.rules


def test_the_compiler_types_layouts_with_layouts_classes():
    """Types carry layouts/'s descriptions, typed; no language hands the compiler (or the
    runtime) its layout classes."""
    import inspect
    import typing

    from weft.compiler import builder, types
    from weft.layouts import DistributedLayout, SharedLayout
    from weft.runtime import tensor_descriptor

    expected = {types.TensorType: DistributedLayout, types.SharedType: SharedLayout,
                types.TensorDescriptorType: SharedLayout}
    for type_, description in expected.items():
        assert typing.get_type_hints(type_)["encoding"] == typing.Optional[description], type_
    assert "layouts" not in inspect.signature(builder.register_language).parameters
    assert not hasattr(builder, "language_layouts") and not hasattr(tensor_descriptor, "register_tma_layout")


def _folded(value: ast.expr):
    """The number a constant expression (`48 * 1024`, `1 << 16`) stands for, else None."""
    try:
        folded = eval(compile(ast.Expression(value), "<limit>", "eval"), {"__builtins__": {}})
    except Exception:
        return None
    return folded if isinstance(folded, int) and not isinstance(folded, bool) else None


def _hardware_names() -> set[str]:
    assert HARDWARE in MODULES, f"no module {HARDWARE} states the hardware limits"
    tree = ast.parse(MODULES[HARDWARE].read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.ImportFrom):
            names |= {alias.asname or alias.name for alias in node.names}
    return names - {"__all__", "annotations"}


def test_hardware_limits_are_stated_once_in_the_compiler():
    names = _hardware_names() | LIMIT_ALIASES
    assert {"REGISTER_FILE", "MAX_REGISTERS", "SHARED_LIMIT", "LANES"} <= names
    found = []
    for module, path in MODULES.items():
        if module == HARDWARE or within(module, ("weft.layouts",)):
            continue
        for node in ast.parse(path.read_text()).body:
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, ast.AnnAssign) and node.value is not None else []
            for target in targets:
                if not isinstance(target, ast.Name):
                    continue
                if target.id in names or _folded(node.value) in LIMIT_VALUES:
                    found.append(f"module {module} defines hardware limit {target.id} "
                                 f"(rule: hardware limits live in {HARDWARE}; import them from there) "
                                 f"at {path.relative_to(ROOT)}:{node.lineno}")
    assert not found, "hardware limits stated outside the compiler:\n" + "\n".join(found)


def test_ptxas_runs_behind_the_backend():
    """The compiler assembles (compiler/backend/ptxas.py runs ptxas); everything above it
    gets a cubin from the compiler and asks compiler/cuda_tools only for versions and
    error messages, never for a ptxas to run."""
    found = []
    for module, path in MODULES.items():
        if within(module, ("weft.compiler",)):
            continue
        nodes = list(ast.walk(ast.parse(path.read_text())))
        names = {n.id for n in nodes if isinstance(n, ast.Name)} | {n.attr for n in nodes if isinstance(n, ast.Attribute)} \
            | {a.name for n in nodes if isinstance(n, ast.ImportFrom) for a in n.names}
        imported = {m for m, _ in imports_of(module, path)}
        if "find_ptxas" in names or "weft.compiler.backend.ptxas" in imported:
            found.append(f"module {module} imports module weft.compiler.backend.ptxas or runs find_ptxas "
                         f"(rule: ptxas is behind the backend) at {path.relative_to(ROOT)}")
    assert not found, "\n".join(found)
    assembler = MODULES["weft.compiler.backend.ptxas"].read_text()
    assert "subprocess.run(" in assembler and "-arch=" in assembler


EMULATE_WITHOUT_LLVMLITE = textwrap.dedent("""
    import sys

    class NoLlvmlite:
        def find_spec(self, name, path=None, target=None):
            if name == "llvmlite" or name.startswith("llvmlite."):
                raise ImportError(f"llvmlite is blocked in this test ({name})")
            return None

    sys.meta_path.insert(0, NoLlvmlite())
    try:
        import llvmlite  # noqa: F401
    except ImportError:
        pass
    else:
        raise SystemExit("the llvmlite blocker did not block")

    import numpy as np
    from weft import lowlevel as ll

    @ll.jit
    def scaled_row_sums(x_ptr, out_ptr, scale, ROWS: ll.constexpr, COLS: ll.constexpr):
        layout: ll.constexpr = ll.BlockedLayout([1, 4], [4, 8], [4, 1], [1, 0])
        rows = ll.arange(0, ROWS, layout=ll.SliceLayout(1, layout))
        cols = ll.arange(0, COLS, layout=ll.SliceLayout(0, layout))
        x = ll.load(x_ptr + ll.program_id(0) * ROWS * COLS + rows[:, None] * COLS + cols[None, :])
        ll.store(out_ptr + ll.program_id(0) * ROWS + rows, ll.sum(x * scale + 1.0, axis=1))

    x = np.random.default_rng(0).standard_normal((2, 16, 32)).astype(np.float32)
    out = np.zeros((2, 16), np.float32)
    scaled_row_sums[(2,)](x, out, 0.5, ROWS=16, COLS=32)
    np.testing.assert_allclose(out, (x * 0.5 + 1.0).sum(axis=2), rtol=1e-5, atol=1e-5)
    assert not [m for m in sys.modules if m.split(".")[0] == "llvmlite"]
    print("emulated without llvmlite")
""")


def test_the_emulator_runs_without_llvmlite(tmp_path):
    import weft

    importable = str(Path(weft.__file__).resolve().parents[1])  # the weft this test runs against
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [importable, os.environ.get("PYTHONPATH")]))}
    script = tmp_path / "emulate_without_llvmlite.py"  # kernels need a source file
    script.write_text(EMULATE_WITHOUT_LLVMLITE)
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env,
                            cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "emulated without llvmlite" in result.stdout


if __name__ == "__main__":  # print the violations, one a line
    print("\n".join(violations()) or "no layering violations")
