"""What the runtime's commands check before any work: values that depend on other values or on a loaded model,
and the files they are given to load (the paths they write are checked by ``policies.outputs``).

Every check raises ``click.BadParameter`` naming the option and the value, so the console script prints one
line (exit 2) before minutes of decoding or training are spent.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import TypeVar

import click

from sparkgate.collectors.schema import id_problem

from .block_drafter import BlockDrafter, DSparkNet
from .drafters import Drafter
from .model import Transformer

T = TypeVar("T")

# Request seeds are keyed into int64 tensors and a training seed is multiplied by about 1e6 into torch's
# 64-bit generator seed: 32 bits keep both in range, and a negative seed is refused rather than wrapped.
SEED = click.IntRange(0, 2**32 - 1)


class RecordId(click.ParamType):
    """An id the controller's validators accept (``collectors.schema.id_problem``): a replica whose id they
    refuse would have every record it sends quarantined."""

    name = "id"

    def convert(self, value, param, ctx):
        problem = id_problem(value)
        if problem is not None:
            self.fail(f"{value!r}: {problem}", param, ctx)
        return value


def check_gamma(gamma: int, drafter: Drafter | DSparkNet, param_hint: str = "--gamma") -> None:
    """Refuse a draft length beyond what a block drafter was built for (``DrafterArgs.max_gamma``: its block
    positions end there); the n-gram drafter drafts any length."""
    net = drafter.net if isinstance(drafter, BlockDrafter) else drafter
    if isinstance(net, DSparkNet) and gamma > net.args.max_gamma:
        raise click.BadParameter(
            f"{gamma} is beyond the drafter's max_gamma: it drafts blocks of 1 to {net.args.max_gamma} tokens",
            param_hint=[param_hint],
        )


def check_reads(net: DSparkNet, target: Transformer, param_hint: str) -> None:
    """Refuse a block drafter that reads hidden states of another width than ``target``'s (it was distilled
    from another target)."""
    if net.args.target_dim != target.args.dim:
        raise click.BadParameter(
            f"the drafter reads target hidden states of width {net.args.target_dim}, the target's are "
            f"{target.args.dim} wide: it was trained against another target",
            param_hint=[param_hint],
        )


def check_positions(need: int, limit: int, what: str, param_hint: str) -> None:
    """Refuse a shape of ``need`` positions (``what`` names the values that add up to it) in a model or cache
    of ``limit``. An engine request needs ``engine.positions_needed``, the rule ``Engine.submit`` applies."""
    if need > limit:
        raise click.BadParameter(f"{what}: {need} positions, but the target holds {limit}", param_hint=[param_hint])


def workload_prompt_len() -> int:
    """The length of every prompt of the mixed workload (replicas and the end-to-end benchmarks serve it)."""
    from .workload import mixed_workload

    return len(mixed_workload(1)[0].tokens)


def load_given(load: Callable[[str], T], path: str, what: str, param_hint: str) -> T:
    """``load(path)``, or a usage error naming the option when the file is no ``what`` (not a checkpoint, a
    truncated one, or one of another kind of model)."""
    try:
        return load(path)
    except (pickle.UnpicklingError, RuntimeError, ValueError, TypeError, KeyError, EOFError) as exc:
        # torch's messages run to paragraphs: their first sentence says what failed.
        reason = str(exc).strip().split("\n")[0].split(". ")[0].strip() or type(exc).__name__
        raise click.BadParameter(f"{path} is not a {what} checkpoint ({reason})", param_hint=[param_hint]) from None


def given_target(path: str | None, param_hint: str = "--target") -> Transformer:
    """The target checkpoint at ``path`` in eval mode, or the shipped target when none is given."""
    from .model import load_checkpoint
    from .shipped import load_shipped_target

    if path is None:
        return load_shipped_target()
    return load_given(lambda p: load_checkpoint(p)[0].eval(), path, "target", param_hint)
