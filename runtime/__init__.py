"""weft.runtime: see docs/design.md."""

from .tensor_descriptor import TensorDescriptor, TensorDescriptorError  # noqa: F401
