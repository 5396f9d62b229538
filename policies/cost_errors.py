"""Cost-table errors, apart from ``cost_model`` so that code which only stores tables imports no torch."""

from __future__ import annotations

from sparkgate.policies.errors import InputError


class CostTableError(InputError):
    """A malformed cost table; the message names the field and the value."""


class FingerprintMismatch(CostTableError):
    """The table was measured on other hardware or for another model."""
