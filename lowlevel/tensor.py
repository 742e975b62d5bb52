"""`Tensor`: what a runtime value looks like inside a lowlevel kernel.

A Tensor is a scalar (program ids, kernel arguments, reductions of 1-D tensors) or a
distributed tensor with a layout. Python operators on it build IR through
`weft.lowlevel.semantic`; methods mirror the module-level ops (`x.sum(1)`, `x.to(...)`).
"""

from __future__ import annotations

from ..compiler.builder import DynamicValue, builtin
from ..compiler.types import TensorType
from . import semantic as sem


class Tensor(DynamicValue):
    """A runtime value: `dtype`, `shape` (() for scalars) and `layout` (its description)."""

    __slots__ = ()

    @property
    def dtype(self):
        return sem.element_of(self.type)

    @property
    def shape(self) -> tuple[int, ...]:
        return sem.shape_of(self)

    @property
    def layout(self):
        """The layout description (BlockedLayout, SliceLayout, ...); None for scalars."""
        return self.type.encoding if isinstance(self.type, TensorType) else None

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    def __repr__(self) -> str:
        return f"Tensor({sem.describe(self)})"

    __hash__ = object.__hash__

    def __iter__(self):
        raise sem.builder().error("a tensor cannot be iterated over in Python",
                                  suggestion="index with ll.arange and masks, or loop with range()")

    # ----------------------------------------------------------- arithmetic
    @builtin
    def __add__(self, other):
        return sem.binary("add", self, other, "+")

    @builtin
    def __radd__(self, other):
        return sem.binary("add", other, self, "+")

    @builtin
    def __sub__(self, other):
        return sem.binary("sub", self, other, "-")

    @builtin
    def __rsub__(self, other):
        return sem.binary("sub", other, self, "-")

    @builtin
    def __mul__(self, other):
        return sem.binary("mul", self, other, "*")

    @builtin
    def __rmul__(self, other):
        return sem.binary("mul", other, self, "*")

    @builtin
    def __truediv__(self, other):
        return sem.binary("div", self, other, "/")

    @builtin
    def __rtruediv__(self, other):
        return sem.binary("div", other, self, "/")

    @builtin
    def __floordiv__(self, other):
        return sem.binary("floordiv", self, other, "//")

    @builtin
    def __rfloordiv__(self, other):
        return sem.binary("floordiv", other, self, "//")

    @builtin
    def __mod__(self, other):
        return sem.binary("mod", self, other, "%")

    @builtin
    def __rmod__(self, other):
        return sem.binary("mod", other, self, "%")

    @builtin
    def __and__(self, other):
        return sem.binary("and", self, other, "&")

    @builtin
    def __rand__(self, other):
        return sem.binary("and", other, self, "&")

    @builtin
    def __or__(self, other):
        return sem.binary("or", self, other, "|")

    @builtin
    def __ror__(self, other):
        return sem.binary("or", other, self, "|")

    @builtin
    def __xor__(self, other):
        return sem.binary("xor", self, other, "^")

    @builtin
    def __rxor__(self, other):
        return sem.binary("xor", other, self, "^")

    @builtin
    def __lshift__(self, other):
        return sem.binary("shl", self, other, "<<")

    @builtin
    def __rlshift__(self, other):
        return sem.binary("shl", other, self, "<<")

    @builtin
    def __rshift__(self, other):
        return sem.binary("shr", self, other, ">>")

    @builtin
    def __rrshift__(self, other):
        return sem.binary("shr", other, self, ">>")

    @builtin
    def __pow__(self, other):
        return sem.binary("pow", self, other, "**")

    @builtin
    def __rpow__(self, other):
        return sem.binary("pow", other, self, "**")

    @builtin
    def __neg__(self):
        return sem.unary("neg", self, "-")

    @builtin
    def __pos__(self):
        return self

    @builtin
    def __invert__(self):
        return sem.unary("not", self, "~")

    @builtin
    def __abs__(self):
        return sem.unary("abs", self, "abs")

    # Python's min()/max() with a runtime argument (the frontend calls these).
    @builtin
    def python_min(self, other):
        return sem.binary("min", self, other, "min")

    @builtin
    def python_max(self, other):
        return sem.binary("max", self, other, "max")

    # ----------------------------------------------------------- comparisons
    @builtin
    def __eq__(self, other):
        return sem.compare("eq", self, other, "==")

    @builtin
    def __ne__(self, other):
        return sem.compare("ne", self, other, "!=")

    @builtin
    def __lt__(self, other):
        return sem.compare("lt", self, other, "<")

    @builtin
    def __le__(self, other):
        return sem.compare("le", self, other, "<=")

    @builtin
    def __gt__(self, other):
        return sem.compare("gt", self, other, ">")

    @builtin
    def __ge__(self, other):
        return sem.compare("ge", self, other, ">=")

    # ----------------------------------------------------------- shape and type
    @builtin
    def __getitem__(self, index):
        """x[None, :] and x[:, None]: insert size-1 dims (the only indexing supported)."""
        index = index if isinstance(index, tuple) else (index,)
        kept = [i for i in index if i is not None]
        full = slice(None, None, None)
        if any(not isinstance(i, slice) or i != full for i in kept) or len(kept) != self.rank:
            raise sem.builder().error(
                f"unsupported index {_show_index(index)} on a rank-{self.rank} tensor",
                expected=f"one ':' per dim ({self.rank}) and None where a size-1 dim is inserted",
                suggestion="select elements with pointer arithmetic and masks, not indexing")
        result = self
        for position, item in enumerate(index):
            if item is None:
                result = self._expand_dims(result, position)
        return result

    # How a size-1 dim is inserted; highlevel's Tensor swaps in its layout-free version.
    _expand_dims = staticmethod(sem.expand_dims)

    @builtin
    def to(self, dtype, bitcast: bool = False):
        """This value converted to `dtype` (numeric conversion, or bit reinterpretation)."""
        return sem.cast(self, dtype, bitcast)

    @builtin
    def sum(self, axis=None, keep_dims: bool = False, dtype=None):
        from .shape_ops import reduce

        return reduce(self, axis, "sum", keep_dims, dtype)

    @builtin
    def max(self, axis=None, keep_dims: bool = False):
        from .shape_ops import reduce

        return reduce(self, axis, "max", keep_dims)

    @builtin
    def min(self, axis=None, keep_dims: bool = False):
        from .shape_ops import reduce

        return reduce(self, axis, "min", keep_dims)

    @builtin
    def argmax(self, axis, keep_dims: bool = False):
        from .shape_ops import reduce

        return reduce(self, axis, "argmax", keep_dims)

    @builtin
    def argmin(self, axis, keep_dims: bool = False):
        from .shape_ops import reduce

        return reduce(self, axis, "argmin", keep_dims)

    @builtin
    def reshape(self, *shape):
        from .shape_ops import reshape

        return reshape(self, shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape)

    @builtin
    def permute(self, *order):
        from .shape_ops import permute

        return permute(self, order[0] if len(order) == 1 and isinstance(order[0], (tuple, list)) else order)

    @builtin
    def expand_dims(self, axis):
        return sem.expand_dims(self, axis)


def _show_index(index: tuple) -> str:
    def one(i):
        if i is None:
            return "None"
        if isinstance(i, slice):
            parts = ["" if p is None else str(p) for p in (i.start, i.stop, i.step)]
            return ":".join(parts[:2]) + (f":{parts[2]}" if i.step is not None else "")
        return repr(i)

    return "[" + ", ".join(one(i) for i in index) + "]"
