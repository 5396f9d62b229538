"""The runtime commands' checks: draft lengths against the drafter."""

from __future__ import annotations

from sparkgate.verify_runtime.cli_checks import check_gamma
from sparkgate.verify_runtime.drafters import NGramDrafter


def test_the_n_gram_drafter_drafts_any_length():
    check_gamma(64, NGramDrafter(260))
