"""`Tensor`: a runtime value inside a highlevel kernel (Triton's `tl.tensor`).

It is lowlevel's Tensor with the layout-bearing methods replaced: indexing with None,
reductions, permutes and every two-operand operator, which broadcasts its operands
here (shapes only) before lowlevel's arithmetic builds the op.
"""

from __future__ import annotations

from ..compiler.builder import builtin
from ..lowlevel.tensor import Tensor as LowlevelTensor
from . import semantic as sem

# Operators of two operands (with their symbols, for messages); lowlevel's versions run
# after the operands are broadcast.
OPERATOR_SYMBOLS = {
    "add": "+", "sub": "-", "mul": "*", "truediv": "/", "floordiv": "//", "mod": "%", "and": "&",
    "or": "|", "xor": "^", "lshift": "<<", "rshift": ">>", "pow": "**",
    "eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">=",
}


class Tensor(LowlevelTensor):
    """A scalar, or a tile of `shape` elements of `dtype` whose layout is inferred later."""

    __slots__ = ()

    @property
    def layout(self):
        """Always None: layouts are chosen by the compiler after the kernel is traced."""
        return None

    def __repr__(self) -> str:
        return f"Tensor({sem.describe(self)})"

    __hash__ = object.__hash__

    # x[None, :] / x[:, None] come from the lowlevel Tensor, inserting dims without layouts.
    _expand_dims = staticmethod(sem.expand_dims)

    @builtin
    def sum(self, axis=None, keep_dims: bool = False, dtype=None):
        return sem.reduce(self, axis, "sum", keep_dims, dtype)

    @builtin
    def max(self, axis=None, keep_dims: bool = False):
        return sem.reduce(self, axis, "max", keep_dims)

    @builtin
    def min(self, axis=None, keep_dims: bool = False):
        return sem.reduce(self, axis, "min", keep_dims)

    @builtin
    def argmax(self, axis, keep_dims: bool = False):
        return sem.reduce(self, axis, "argmax", keep_dims)

    @builtin
    def argmin(self, axis, keep_dims: bool = False):
        return sem.reduce(self, axis, "argmin", keep_dims)

    @builtin
    def expand_dims(self, axis):
        return sem.expand_dims(self, axis)

    @builtin
    def broadcast_to(self, *shape):
        return sem.broadcast_to(self, _dims(shape))

    @builtin
    def permute(self, *order):
        return sem.permute(self, _dims(order))

    @builtin
    def trans(self, *order):
        return sem.permute(self, _dims(order) or tuple(reversed(range(self.rank))))

    @property
    def T(self):
        return self.trans()

    @builtin
    def reshape(self, *shape, can_reorder: bool = False):
        return sem.reshape(self, _dims(shape), can_reorder)

    @builtin
    def view(self, *shape):
        return sem.reshape(self, _dims(shape), True)

    @builtin
    def ravel(self, can_reorder: bool = False):
        return sem.reshape(self, (self.type.num_elements,), can_reorder)

    @builtin
    def cumsum(self, axis=0, reverse: bool = False, dtype=None):
        from .scan import cumsum

        return cumsum(self, axis, reverse, dtype)

    @builtin
    def cumprod(self, axis=0, reverse: bool = False):
        from .scan import cumprod

        return cumprod(self, axis, reverse)

    @builtin
    def split(self):
        return sem.split(self)

    @builtin
    def join(self, other):
        return sem.join(self, other)


def _dims(items: tuple) -> tuple:
    """f(1, 2) and f((1, 2)) both mean the dims (1, 2)."""
    return tuple(items[0]) if len(items) == 1 and isinstance(items[0], (tuple, list)) else tuple(items)


def _broadcasting(method, symbol: str):
    """Lowlevel's operator `method`, applied once the two operands share a shape."""
    def op(self, other):
        self, other = sem.broadcast_all(self, other, what=f"'{symbol}'")
        return method.__wrapped__(self, other)

    op.__name__ = op.__qualname__ = method.__name__
    op.__doc__ = method.__doc__
    return builtin(op)


for _name, _symbol in OPERATOR_SYMBOLS.items():
    for _dunder in (f"__{_name}__", f"__r{_name}__"):
        if hasattr(LowlevelTensor, _dunder):
            setattr(Tensor, _dunder, _broadcasting(getattr(LowlevelTensor, _dunder), _symbol))
del _name, _symbol, _dunder
