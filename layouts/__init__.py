"""weft.layouts: the GF(2) linear-layout algebra (numpy and the standard library only)."""

from .errors import LayoutError
from .linear_layout import LinearLayout, identity_1d, identity_layout, zeros_1d
