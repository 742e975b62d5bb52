"""What a compiled kernel depends on beyond its arguments, as fingerprints the disk cache
compares (runtime/cache.py).

The frontend records every module-level name it resolves while it builds a kernel
(`compiler.frontend_expr.record_resolved_globals`): globals of the kernel and of every
@jit function it inlines, and attributes of modules (`steps.attend`, `cfg.LAYOUT`). Each
becomes a (module, name, fingerprint) triple stored with the cache entry; a later process
resolves the same names in its own modules and takes the entry only if every fingerprint
matches. Names of weft's own compiler modules are left out: `cache.compiler_fingerprint`
covers their code.

A fingerprint is a digest of a value's meaning, stable across processes:
- functions: their bytecode (names, constants, nested code; not line numbers, so comments
  and blank lines do not count), defaults, annotations and closure values; a function run
  at compile time (`@ll.constexpr_function`) also counts the globals its code names, since
  the frontend never sees inside it. A @jit function's globals are recorded when the
  frontend inlines it.
- classes defined outside weft: their methods and attributes; weft's own by name.
- numbers, strings, tuples, dicts, dataclasses (layouts): their values, recursively;
  anything else: type and repr (a repr with an address costs a miss, never a wrong hit).
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import inspect
import marshal
import sys
import textwrap
import types
from typing import Any, Iterable, Mapping, Optional

# Modules whose source `cache.compiler_fingerprint` hashes: names resolved in them need no
# fingerprint of their own.
_PACKAGE = __name__.rsplit(".", 2)[0]
_COVERED = tuple(f"{_PACKAGE}.{folder}" for folder in ("compiler", "layouts", "lowlevel", "highlevel"))

_CODE_DIGESTS: dict[int, tuple[types.CodeType, str]] = {}


def is_covered(module: Optional[str]) -> bool:
    """True for modules of weft's compiler, whose code the toolchain fingerprint covers."""
    return bool(module) and (module in _COVERED or module.startswith(tuple(m + "." for m in _COVERED)))


def fingerprint(value: Any) -> str:
    """A short digest of what `value` means to the compiler (see the module docstring)."""
    return hashlib.blake2b(_Fingerprint().text(value).encode(), digest_size=16).hexdigest()


def describe(resolved: Mapping[tuple[str, str], tuple[Any, Any]]) -> tuple[tuple[str, str, str], ...]:
    """(module, name, fingerprint) of each name the frontend resolved, in resolution order,
    leaving out weft's compiler modules."""
    return tuple((module, name, fingerprint(value)) for (module, name), (value, _) in resolved.items()
                 if not is_covered(module))


def all_match(recorded: Iterable[Iterable[str]], namespaces: Mapping[str, Mapping]) -> bool:
    """True when every recorded (module, name, fingerprint) resolves, in this process, to a
    value of the same fingerprint. `namespaces` maps module names to the namespaces the
    kernel sees (its own globals first); other modules are looked up in sys.modules, and
    functions and modules met on the way add theirs."""
    known = dict(namespaces)
    for module, name, expected in recorded:
        namespace = known.get(module)
        if namespace is None:
            loaded = sys.modules.get(module)
            if loaded is None:
                return False
            namespace = known[module] = vars(loaded)
        value = namespace.get(name, _MISSING)
        if value is _MISSING or fingerprint(value) != expected:
            return False
        learn_namespaces(value, known)
    return True


def learn_namespaces(value: Any, known: dict) -> None:
    """Add the module namespace a function (or @jit function, or module) resolves names in."""
    function = getattr(value, "fn", value)
    if isinstance(function, types.FunctionType):
        namespace = function.__globals__
        known.setdefault(namespace.get("__name__", function.__module__), namespace)
    elif isinstance(value, types.ModuleType):
        known.setdefault(value.__name__, vars(value))


_MISSING = object()


def code_digest(code: types.CodeType) -> str:
    """The digest of a code object without its line numbers and file name: the same for
    two versions of a function that differ only in comments or whitespace."""
    hit = _CODE_DIGESTS.get(id(code))
    if hit is not None and hit[0] is code:
        return hit[1]
    digest = hashlib.blake2b(marshal.dumps(_without_lines(code)), digest_size=16)
    if sys.flags.optimize:
        # -O strips asserts from bytecode, but the frontend compiles them from the source.
        digest.update(_source_digest(code).encode())
    result = digest.hexdigest()
    _CODE_DIGESTS[id(code)] = (code, result)
    return result


def _without_lines(code: types.CodeType) -> types.CodeType:
    consts = tuple(_without_lines(c) if isinstance(c, types.CodeType)
                   else tuple(sorted(c, key=repr)) if isinstance(c, frozenset)  # hash-seed order
                   else c for c in code.co_consts)
    return code.replace(co_firstlineno=1, co_linetable=b"", co_filename="", co_consts=consts)


def _source_digest(code: types.CodeType) -> str:
    try:
        lines, _ = inspect.getsourcelines(code)
        return ast.dump(ast.parse(textwrap.dedent("".join(lines))))
    except (OSError, TypeError, SyntaxError):
        return ""


class _Fingerprint:
    """One fingerprint's walk; `active` guards against cycles (a function naming itself)."""

    def __init__(self):
        self.active: set[int] = set()

    def text(self, value: Any) -> str:
        if value is None or isinstance(value, (bool, int, float, str, bytes, complex)):
            return f"{type(value).__name__}:{value!r}"
        if type(value).__name__ == "constexpr" and hasattr(value, "value"):
            return self.text(value.value)
        if id(value) in self.active:
            return f"cycle:{type(value).__qualname__}"
        self.active.add(id(value))
        try:
            return self.compound(value)
        finally:
            self.active.discard(id(value))

    def compound(self, value: Any) -> str:
        if isinstance(value, (tuple, list)):
            return f"{type(value).__name__}(" + ",".join(map(self.text, value)) + ")"
        if isinstance(value, (set, frozenset)):
            return "set(" + ",".join(sorted(map(self.text, value))) + ")"
        if isinstance(value, dict):
            items = sorted(f"{self.text(k)}={self.text(v)}" for k, v in value.items())
            return "dict(" + ",".join(items) + ")"
        if isinstance(value, types.ModuleType):
            return f"module:{value.__name__}"
        jitted = getattr(value, "fn", None)
        if isinstance(jitted, types.FunctionType) and hasattr(value, "compile_fn"):
            # The frontend inlines it and records the globals it resolves.
            return f"jit:{self.function(jitted, with_globals=False)}"
        if isinstance(value, types.FunctionType):
            return self.function(value, with_globals=not is_covered(value.__module__))
        if isinstance(value, types.MethodType):
            return f"method:{self.text(value.__self__)}.{self.text(value.__func__)}"
        if isinstance(value, type):
            return self.class_text(value)
        if isinstance(value, types.BuiltinFunctionType):  # math.sqrt, (1, 2).index, ...
            owner = getattr(value, "__self__", None)
            if owner is None or isinstance(owner, types.ModuleType):
                return f"builtin:{getattr(value, '__module__', None)}.{value.__qualname__}"
            return f"builtin:{self.text(owner)}.{value.__name__}"
        if dataclasses.is_dataclass(value):
            fields = ",".join(f"{f.name}={self.text(getattr(value, f.name))}"
                              for f in dataclasses.fields(value))
            return f"{_qualified(type(value))}({fields})"
        return f"{_qualified(type(value))}:{value!r}"

    def function(self, fn: types.FunctionType, with_globals: bool) -> str:
        parts = [_qualified(fn), code_digest(fn.__code__), self.text(fn.__defaults__),
                 self.text(fn.__kwdefaults__), self.text({k: v if isinstance(v, str) else repr(v)
                                                          for k, v in fn.__annotations__.items()})]
        for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
            try:
                parts.append(f"{name}={self.text(cell.cell_contents)}")
            except ValueError:  # an empty cell
                parts.append(f"{name}=<empty>")
        if with_globals:
            parts.append(self.globals_named(fn))
        return "fn(" + ";".join(parts) + ")"

    def globals_named(self, fn: types.FunctionType) -> str:
        """The globals a compile-time function's code names (and attributes of modules it
        names, as `mod.X`): the frontend does not see inside it, so they are keyed here."""
        names = set()
        stack = [fn.__code__]
        while stack:
            code = stack.pop()
            names.update(code.co_names)
            stack.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
        namespace = fn.__globals__
        parts = []
        for name in sorted(names):
            value = namespace.get(name, _MISSING)
            if value is _MISSING:
                continue
            parts.append(f"{name}={self.text(value)}")
            if isinstance(value, types.ModuleType) and not is_covered(value.__name__):
                parts.extend(f"{name}.{attr}={self.text(getattr(value, attr))}"
                             for attr in sorted(names) if hasattr(value, attr))
        return "globals(" + ",".join(parts) + ")"

    def class_text(self, cls: type) -> str:
        if is_covered(cls.__module__) or cls.__module__ == "builtins":
            return f"type:{_qualified(cls)}"
        parts = []
        for name, member in sorted(vars(cls).items()):
            member = getattr(member, "__func__", member)  # classmethod, staticmethod
            if isinstance(member, property):
                member = (member.fget, member.fset)
            elif name.startswith("__") and name.endswith("__") and not isinstance(member, types.FunctionType):
                continue  # __dict__, __weakref__, dataclass bookkeeping (reprs hold addresses)
            parts.append(f"{name}={self.text(member)}")
        bases = ",".join(self.text(b) for b in cls.__bases__ if b is not object)
        return f"type:{_qualified(cls)}[{bases}]{{" + ";".join(parts) + "}"


def _qualified(obj: Any) -> str:
    return f"{getattr(obj, '__module__', None)}.{getattr(obj, '__qualname__', type(obj).__qualname__)}"
