"""Output paths: refused before the work where nothing can be made, and files written whole or not at all,
keeping the mode of what they replace and writing through a link; the policy files (cost tables, STS)
saved that way and read back with a format error for any bytes that are not one."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import click
import pytest

from sparkgate.policies.calibration import STS
from sparkgate.policies.cost_model import load_cost_table, parse_cost_table, save_cost_table
from sparkgate.policies.errors import InputError
from sparkgate.policies.outputs import output_path, written_whole


def test_an_output_path_is_refused_where_nothing_can_be_made_and_nothing_is_created(tmp_path):
    (tmp_path / "file").write_text("a regular file")
    for path, directory, reason in [
        (tmp_path / "file" / "a" / "out.json", False, "is not a directory"),
        (tmp_path / "file", True, "is not a directory"),
        (tmp_path, False, "is a directory"),
    ]:
        with pytest.raises(click.BadParameter, match=reason) as raised:
            output_path(path, "--out", directory=directory)
        assert "'--out'" in raised.value.format_message()
    assert output_path(tmp_path / "new" / "deeper" / "out.json", "--out") == tmp_path / "new" / "deeper" / "out.json"
    assert output_path(tmp_path / "file", "--out") == tmp_path / "file"  # replaced whole when written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_a_file_is_replaced_whole_and_a_failed_write_leaves_what_was_there(tmp_path):
    target = tmp_path / "sub" / "table.json"
    with written_whole(target) as partial:
        assert partial.parent == target.parent and partial.suffix == ".json" and partial != target
        partial.write_text("new")
    assert target.read_text() == "new"
    with pytest.raises(RuntimeError), written_whole(target) as partial:
        partial.write_text("half of a new ver")
        raise RuntimeError("the disk filled up")
    assert target.read_text() == "new" and [p.name for p in target.parent.iterdir()] == ["table.json"]


def test_a_replaced_file_keeps_its_mode_and_a_link_keeps_pointing_at_it(tmp_path):
    target = tmp_path / "table.json"
    target.write_text("old")
    os.chmod(target, 0o640)
    link = tmp_path / "current.json"
    link.symlink_to(target)
    with written_whole(link) as partial:
        partial.write_text("new")
    assert link.is_symlink() and target.read_text() == "new" and (target.stat().st_mode & 0o777) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["current.json", "table.json"]


def _full_disk_after(limit: int):
    """A ``Path.write_text`` that writes ``limit`` characters and then fails as a full disk does."""
    real = Path.write_text

    def write_text(self, data, *args, **kwargs):
        real(self, data[:limit], *args, **kwargs)
        raise OSError(errno.ENOSPC, "No space left on device", str(self))

    return write_text


@pytest.mark.parametrize("saver", ["cost table", "sts"])
def test_the_policy_files_savers_leave_the_old_file_when_a_write_fails(tmp_path, monkeypatch, saver):
    # Their callers outside the CLIs (the profiled cost-table cache, shipping an STS) do not wrap them.
    path = tmp_path / "file.json"
    if saver == "cost table":
        table = parse_cost_table(
            {"sample_batch_tokens": [8, 64], "sample_steps_per_sec": [900.0, 400.0], "max_batch_tokens": 64}
        )
        save, load = (lambda: save_cost_table(table, path)), (lambda: load_cost_table(path))
    else:
        sts = STS([1.0, 2.0])
        save, load = (lambda: sts.save(path)), (lambda: STS.load(path))
    save()
    before = path.read_text()
    monkeypatch.setattr(Path, "write_text", _full_disk_after(10))
    with pytest.raises(OSError, match="No space left"):
        save()
    monkeypatch.undo()
    assert path.read_text() == before and [p.name for p in tmp_path.iterdir()] == ["file.json"]
    load()


@pytest.mark.parametrize("loader", [load_cost_table, STS.load])
def test_a_policy_file_that_is_not_utf8_is_a_format_error_naming_the_byte(tmp_path, loader):
    # The profiled-table cache re-profiles over a file that is not a table; a UnicodeDecodeError crashed it.
    path = tmp_path / "file.json"
    path.write_bytes(b'\xff\xfe{"bias_seconds": 1}')
    with pytest.raises(InputError, match=r"file.json: not (valid )?JSON \(.*can't decode byte 0xff in position 0"):
        loader(path)
