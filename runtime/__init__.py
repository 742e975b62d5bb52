"""weft.runtime: see DESIGN.md."""

from .tensor_descriptor import TensorDescriptor, TensorDescriptorError  # noqa: F401
