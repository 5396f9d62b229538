"""``--device`` and ``--graphs``: graph tiers off CUDA and unknown devices are usage errors, not tracebacks."""

import pytest
import torch
from click.testing import CliRunner

from sparkgate.cli import main


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU refusal")
def test_graph_tiers_are_refused_off_cuda_with_a_usage_error(tmp_path):
    for args in (
        ["bench", "e2e", "--graphs"],
        ["profile", "--out", str(tmp_path / "t.json"), "--graphs"],
        ["bench", "verify", "--graphs"],
    ):
        res = CliRunner().invoke(main, args)
        assert res.exit_code == 2 and "CUDA-graph tiers need a CUDA device" in res.output, (args, res.output)
    res = CliRunner().invoke(main, ["bench", "e2e", "--device", "tpu9"])
    assert res.exit_code == 2 and "--device" in res.output
    assert not (tmp_path / "t.json").exists()


def test_a_cuda_device_this_machine_lacks_is_a_usage_error(tmp_path):
    missing = f"cuda:{torch.cuda.device_count()}"  # one past the last: absent on any machine
    for args in (["bench", "verify", "--device", missing], ["profile", "--out", str(tmp_path / "t.json"),
                                                            "--device", missing]):  # fmt: skip
        res = CliRunner().invoke(main, args)
        assert res.exit_code == 2 and "Traceback" not in res.output, (args, res.output)
        assert f"Invalid value for '--device': {missing}: this machine has {torch.cuda.device_count()}" in res.output
    assert not (tmp_path / "t.json").exists()
