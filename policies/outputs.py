"""Where commands write: an output path checked before any work, and files that appear whole or not at all.

Every layer's commands use these two (docs/design.md §1): ``output_path`` refuses, naming the option, a path
no file or folder could be made at, before minutes of work are spent; ``written_whole`` writes beside the
target and renames, so a reader, or a run killed halfway, never sees half a file under the real name.
"""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import click


def output_path(path: str | Path, param_hint: str, *, directory: bool = False) -> Path:
    """``path`` as a ``Path`` once an output can be made there, else a usage error naming the option: a
    file's folder (a directory itself) must be writable or creatable, i.e. its nearest existing ancestor is a
    writable directory. Missing folders are fine (the writers create them); nothing is created here."""
    target = Path(path)
    if target.exists():
        if target.is_dir() != directory:
            raise click.BadParameter(f"{path} is {'not ' if directory else ''}a directory", param_hint=[param_hint])
        folder = target if directory else target.parent
    else:
        folder = next(p for p in target.absolute().parents if p.exists())
        if not folder.is_dir():
            raise click.BadParameter(f"{path}: {folder} is not a directory", param_hint=[param_hint])
    if not os.access(folder, os.W_OK | os.X_OK):
        raise click.BadParameter(f"{path}: {folder} is not writable", param_hint=[param_hint])
    return target


@contextmanager
def written_whole(path: str | Path) -> Iterator[Path]:
    """A fresh path beside ``path`` for the block to write (same folder and suffix: writers that go by the
    suffix write the same format). When the block ends it replaces ``path`` in one rename, keeping the mode
    of the file it replaces (and a symbolic link's target is what is replaced, not the link); when it raises
    it is removed. So ``path`` holds the whole new file or what it held before, never a half-written one.
    Only a process killed inside the block leaves its ``.NAME.XXXXXXXX.partial.EXT`` beside the target."""
    final = Path(os.path.realpath(path))
    final.parent.mkdir(parents=True, exist_ok=True)
    partial = final.with_name(f".{final.stem}.{secrets.token_hex(4)}.partial{final.suffix}")
    try:
        yield partial
        if final.exists():
            os.chmod(partial, stat.S_IMODE(final.stat().st_mode))
        os.replace(partial, final)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
