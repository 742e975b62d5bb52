"""The PTX of every kernel a set of tests compiles, as digests, to check that a refactor
leaves the generated code byte-identical (issue 39's proof for Part 2).

    python tests/ptx_digests.py OUT.json [pytest args]   # default: the kernels' tests
    python tests/ptx_digests.py --diff OLD.json NEW.json

It runs pytest in-process with the disk cache off, records sha256(ptx) for each
(kernel, signature, constexprs, specialization, options) the tests compile, and writes them
as JSON; `--diff` lists the kernels whose PTX changed, appeared or disappeared. Run it from
the root of each tree, with that tree first on PYTHONPATH.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

# The tests that compile every kernel of kernels/ (and the highlevel examples) to PTX;
# emulated tests build no PTX, so they are filtered out.
DEFAULT_TESTS = ["tests/kernels/test_attention_assembly.py", "tests/kernels/test_matmul.py",
                 "tests/kernels/test_memory_kernels.py", "tests/highlevel/test_examples.py",
                 "-k", "assembl or ptx or conversion_counts"]


def record(out_path: str, pytest_args: list[str]) -> int:
    import pytest

    from weft.runtime import jit

    digests: dict[str, str] = {}
    original = jit.JITFunction._compile_uncached

    def recording(self, signature, constexprs, specialization, options):
        compiled = original(self, signature, constexprs, specialization, options)
        ptx = getattr(compiled, "asm", {}).get("ptx")
        if ptx is not None:
            key = repr((self.fn.__module__, self.fn.__qualname__, sorted(signature.items()),
                        sorted((k, repr(v)) for k, v in constexprs.items()),
                        sorted(specialization.items()), sorted(options.items(), key=repr)))
            digests[key] = hashlib.sha256(ptx.encode()).hexdigest()
        return compiled

    jit.JITFunction._compile_uncached = recording
    os.environ["WEFT_NO_CACHE"] = "1"
    # In this process, not in xdist workers (pyproject's addopts asks for them), or the
    # recording patch sees no compile.
    status = pytest.main(["-q", "-p", "no:cacheprovider", "-n", "0", *(pytest_args or DEFAULT_TESTS)])
    with open(out_path, "w") as f:
        json.dump(digests, f, indent=0, sort_keys=True)
    print(f"{len(digests)} kernels' PTX digests written to {out_path}")
    return int(status)


def diff(old_path: str, new_path: str) -> int:
    old, new = json.load(open(old_path)), json.load(open(new_path))
    changed = [k for k in old.keys() & new.keys() if old[k] != new[k]]
    for title, keys in (("changed", changed), ("only in old", old.keys() - new.keys()),
                        ("only in new", new.keys() - old.keys())):
        for key in sorted(keys):
            print(f"{title}: {key[:300]}")
    print(f"{len(old.keys() & new.keys()) - len(changed)} identical, {len(changed)} changed, "
          f"{len(old.keys() - new.keys())} only in old, {len(new.keys() - old.keys())} only in new")
    return 1 if changed or old.keys() != new.keys() else 0


if __name__ == "__main__":
    if sys.argv[1] == "--diff":
        sys.exit(diff(sys.argv[2], sys.argv[3]))
    sys.exit(record(sys.argv[1], sys.argv[2:]))
