"""``python -m sparkgate``: the ``sparkgate`` command without relying on the console script being on PATH."""

from .cli import main

main(prog_name="sparkgate")
