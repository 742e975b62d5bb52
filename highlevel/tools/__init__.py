"""Host-side helpers, where Triton keeps them (`triton.tools`)."""

from . import tensor_descriptor

__all__ = ["tensor_descriptor"]
