"""Cost-table errors, apart from ``cost_model`` so that code which only stores tables imports no torch."""

from __future__ import annotations


class CostTableError(ValueError):
    """A malformed cost table; the message names the field and the value."""


class FingerprintMismatch(CostTableError):
    """The table was measured on other hardware or for another model."""
