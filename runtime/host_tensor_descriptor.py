"""Triton's host tensor descriptor (`triton.tools.tensor_descriptor.TensorDescriptor`):
base tensor, shape, strides and block_shape, and no layout: the kernel decides where a
box lands in shared memory.

Unlike `runtime.tensor_descriptor.TensorDescriptor` (Gluon's, encoded when built), this
one is a plain mutable record, as Triton's is: an autotuner's pre-hook may set
`desc.block_shape` to the config's tile before the launch. The launch encodes it then,
with the swizzle highlevel kernels stage boxes in (the widest one the box's rows allow,
NVMMASharedLayout.get_default_for; highlevel/tensor_descriptor.py), and keeps the
encoding while the fields stay the same.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from .tensor_descriptor import TensorDescriptor as EncodedDescriptor
from ..compiler.hardware import TMA_MAX_BOX
from .tensor_descriptor import TensorDescriptorError, _check_global, _shape_and_strides, _tensor_facts

PADDINGS = ("zero",)


@dataclasses.dataclass(eq=False)
class TensorDescriptor:
    """A TMA descriptor of `base` (shape and strides in elements) moved in `block_shape`
    boxes; out-of-bounds box elements load as zeros (`padding="zero"`)."""

    base: Any
    shape: list
    strides: list
    block_shape: list
    padding: str = "zero"
    _encoded: Optional[tuple] = dataclasses.field(default=None, repr=False)

    def __post_init__(self):
        if self.padding not in PADDINGS:
            raise TensorDescriptorError(
                f"TensorDescriptor: padding={self.padding!r} is not supported; weft's TMA loads "
                "fill out-of-bounds elements with zeros (padding='zero')")
        # What TMA needs of the tensor is checked here, where it was built; the box only as
        # far as Triton does (a tuner's hook may still replace a placeholder box such as
        # [1, 1]): the rest of TMA's rules for it are checked when a launch encodes it.
        address, _, itemsize, _ = _tensor_facts(self.base)
        _check_global(address, tuple(self.shape), tuple(self.strides), tuple(self.block_shape), itemsize)
        for dim, size in enumerate(self.block_shape):
            if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= TMA_MAX_BOX \
                    or size & (size - 1):
                raise TensorDescriptorError(
                    f"TensorDescriptor: block_shape[{dim}] = {size!r} must be a power of two from 1 to "
                    f"{TMA_MAX_BOX} (the TMA box limit); block_shape {list(self.block_shape)}")

    @staticmethod
    def from_tensor(tensor: Any, block_shape: list, padding: str = "zero") -> "TensorDescriptor":
        """A descriptor over all of `tensor` (torch, __cuda_array_interface__ or numpy)."""
        shape, strides = _shape_and_strides(tensor)
        return TensorDescriptor(tensor, list(shape), list(strides), list(block_shape), padding)

    @property
    def dtype(self):
        return self.encoded().dtype

    def encoded(self) -> EncodedDescriptor:
        """The descriptor as the launch passes it (encoded again only when a field changed)."""
        key = (id(self.base), tuple(self.shape), tuple(self.strides), tuple(self.block_shape))
        if self._encoded is None or self._encoded[0] != key:
            self._encoded = (key, EncodedDescriptor(self.base, *key[1:]))
        return self._encoded[1]
