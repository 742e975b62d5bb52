"""Golden-text checks for pass tests: exact expected strings kept inline in the test file.

    check_golden = golden_checker(__file__, globals())
    check_golden(print_kernel(kernel), "EXPECTED_NAME")

Under WEFT_ACCEPT=1 a differing constant is rewritten in the test file from the actual
text (then review the diff), as tests/compiler/test_frontend.py does.
"""

import ast
import os
from pathlib import Path


def golden_checker(test_file: str, namespace: dict):
    path = Path(test_file)

    def check_golden(actual: str, name: str) -> None:
        expected = namespace.get(name)
        if actual == expected:
            return
        if os.environ.get("WEFT_ACCEPT") == "1":
            _rewrite_constant(path, name, actual)
            namespace[name] = actual
            return
        assert actual == expected, f"golden text {name} differs (WEFT_ACCEPT=1 rewrites it)"

    return check_golden


def _rewrite_constant(path: Path, name: str, text: str) -> None:
    source = path.read_text()
    lines = source.splitlines(keepends=True)
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            start, end = node.lineno - 1, node.end_lineno
            break
    else:
        start = end = len(lines)
    assert '"""' not in text and "\\" not in text
    lines[start:end] = [f'{name} = """\\\n{text}"""\n']
    path.write_text("".join(lines))
