"""`from weft.highlevel.tools.tensor_descriptor import TensorDescriptor`, as Triton users
write `from triton.tools.tensor_descriptor import TensorDescriptor`."""

from ...runtime.host_tensor_descriptor import TensorDescriptor

__all__ = ["TensorDescriptor"]
