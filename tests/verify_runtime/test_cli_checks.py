"""The runtime commands' checks: output paths refused before the work, files written whole or not at all,
draft lengths against the drafter, comma-separated numbers."""

from __future__ import annotations

import click
import pytest

from sparkgate.verify_runtime.cli_checks import check_gamma, output_path, written_whole
from sparkgate.verify_runtime.drafters import NGramDrafter


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


def test_the_n_gram_drafter_drafts_any_length():
    check_gamma(64, NGramDrafter(260))
