"""The one exception type of weft.layouts."""


class LayoutError(ValueError):
    """A layout request that cannot be met: the message names the dims and sizes involved."""
