"""Aggregates: user classes that bundle kernel state (Gluon's `@aggregate`).

    @ll.aggregate
    class Pipeline:
        acc: ll.tensor
        bars: ll.shared_memory_descriptor
        stages: ll.constexpr

        @ll.constexpr_function
        def __init__(self, acc, bars, stages):
            ...

An aggregate's annotated fields hold runtime values (tensors, scalars, shared buffers,
descriptors), compile-time values, tuples or other aggregates. In a kernel an instance
is a plain Python object that the frontend looks through: a runtime loop carries each of
its runtime fields, a runtime `if` yields them, and warp_specialize captures them. Kernels
never change an instance in place (a method returns a new one), so one instance may be
shared by several names.

Carried parts are named by a *key*, the path from a variable to a leaf as the user would
write it (`state.acc`, `pair[1]`), which is what errors show.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Iterator

from .builder import DynamicValue, constexpr_function

_FIELDS = "__weft_aggregate_fields__"


def aggregate(cls: type) -> type:
    """Make `cls` an aggregate of its annotated fields. Without an `__init__` of its own it
    takes the fields in order (positionally or by name)."""
    annotations = cls.__dict__.get("__annotations__", {})
    if not annotations:
        raise TypeError(f"@aggregate class {cls.__name__} declares no fields "
                        f"(annotate them in the class body: `acc: ll.tensor`)")
    setattr(cls, _FIELDS, tuple(annotations))
    if "__init__" not in cls.__dict__:
        cls.__init__ = constexpr_function(_field_init(cls.__name__, tuple(annotations)))
    return cls


def _field_init(name: str, fields: tuple) -> Callable:
    def __init__(self, *args, **kwargs):
        if len(args) > len(fields):
            raise TypeError(f"{name}() takes {len(fields)} fields ({', '.join(fields)}), got {len(args)}")
        values = dict(zip(fields, args))
        for key, value in kwargs.items():
            if key not in fields or key in values:
                raise TypeError(f"{name}() got an unexpected or repeated field '{key}'")
            values[key] = value
        for field in fields:
            if field in values:
                setattr(self, field, values[field])
    return __init__


def is_aggregate_class(obj: Any) -> bool:
    return isinstance(obj, type) and _FIELDS in obj.__dict__


def is_aggregate(value: Any) -> bool:
    return is_aggregate_class(type(value))


def fields_of(value: Any) -> tuple[str, ...]:
    return getattr(type(value), _FIELDS)


def field_annotation(cls: type, field: str) -> Any:
    return cls.__dict__["__annotations__"][field]


def replaced(instance: Any, changes: dict) -> Any:
    """A copy of aggregate `instance` with some fields changed (its __init__ is not run)."""
    copy = object.__new__(type(instance))
    copy.__dict__.update(instance.__dict__)
    copy.__dict__.update(changes)
    return copy


def is_tree(value: Any) -> bool:
    """Whether a value is looked through: an aggregate, or a tuple/list holding a runtime
    value or an aggregate (tuples of compile-time values stay single compile-time values)."""
    if is_aggregate(value):
        return True
    return isinstance(value, (tuple, list)) and any(is_tree(v) or isinstance(v, DynamicValue)
                                                    for v in value)


def children(value: Any) -> Iterator[tuple[str, Any]]:
    """(key suffix, child) of a tree value."""
    if is_aggregate(value):
        for field in fields_of(value):
            yield f".{field}", value.__dict__[field]
    else:
        for index, item in enumerate(value):
            yield f"[{index}]", item


def map_leaves(fn: Callable[[Any], Any], value: Any) -> Any:
    """`value` with every leaf of its tree replaced by fn(leaf)."""
    if is_aggregate(value):
        return replaced(value, {f: map_leaves(fn, value.__dict__[f]) for f in fields_of(value)})
    if isinstance(value, (tuple, list)):
        return type(value)(map_leaves(fn, item) for item in value)
    return fn(value)


def leaves(value: Any) -> Iterator[Any]:
    """Every leaf of `value`'s tree (the value itself when it is no tree)."""
    if is_aggregate(value) or isinstance(value, (tuple, list)):
        for _, child in children(value):
            yield from leaves(child)
    else:
        yield value


def differing_leaves(key: str, old: Any, new: Any, changed: Callable[[Any, Any], bool]
                     ) -> list[tuple[str, Any, Any]]:
    """(key, old leaf, new leaf) for each leaf that differs between two values of one
    variable. Raises TypeError when their shapes differ (another aggregate class, another
    tuple length), which no runtime control flow can merge."""
    if old is new:
        return []
    if not (is_tree(old) or is_tree(new)):
        return [(key, old, new)] if changed(old, new) else []
    if is_aggregate(old) or is_aggregate(new):
        if type(old) is not type(new):
            raise TypeError(f"'{key}' holds {_kind(old)} before and {_kind(new)} after; a value "
                            f"carried through runtime control flow keeps its aggregate class")
    elif not (isinstance(old, (tuple, list)) and isinstance(new, (tuple, list)) and len(old) == len(new)):
        raise TypeError(f"'{key}' holds {_kind(old)} before and {_kind(new)} after; a tuple carried "
                        f"through runtime control flow keeps its length")
    result = []
    for (suffix, a), (_, b) in zip(children(old), children(new)):
        result.extend(differing_leaves(key + suffix, a, b, changed))
    return result


def _kind(value: Any) -> str:
    if is_aggregate(value):
        return f"a {type(value).__name__}"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)}"
    return repr(value)


_STEP = re.compile(r"\.(\w+)|\[(\d+)\]")


def split_key(key: str) -> tuple[str, list]:
    """('state', ['acc', 0]) for 'state.acc[0]'."""
    root = re.match(r"\w+", key).group(0)
    path = [int(index) if index else field for field, index in _STEP.findall(key[len(root):])]
    return root, path


def leaf_at(scope: dict, key: str) -> Any:
    root, path = split_key(key)
    value = scope[root]
    for step in path:
        value = value[step] if isinstance(step, int) else value.__dict__[step]
    return value


def with_leaves(scope: dict, values: dict[str, Any]) -> dict[str, Any]:
    """{root name: its value in `scope` with the leaves at the given keys replaced}, for
    every root some key names."""
    grouped: dict[str, list] = {}
    for key, value in values.items():
        root, path = split_key(key)
        grouped.setdefault(root, []).append((path, value))
    return {root: _replace_paths(scope.get(root), items) for root, items in grouped.items()}


def _replace_paths(value: Any, items: list) -> Any:
    if any(not path for path, _ in items):
        return next(v for path, v in items if not path)
    steps: dict[Any, list] = {}
    for path, leaf in items:
        steps.setdefault(path[0], []).append((path[1:], leaf))
    if is_aggregate(value):
        return replaced(value, {field: _replace_paths(value.__dict__[field], rest)
                                for field, rest in steps.items()})
    return type(value)(_replace_paths(item, steps[i]) if i in steps else item
                       for i, item in enumerate(value))
