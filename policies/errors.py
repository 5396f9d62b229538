"""The one base class of bad input a command can name (a policy file, a cost table, a store path).

The console script prints such an error's message alone and exits 1, without a traceback: the message
names what was wrong (the file, the key, the value). Anything else that escapes a command is a bug and
keeps its traceback.
"""

from __future__ import annotations


class InputError(ValueError):
    """Bad input, named in the message."""
