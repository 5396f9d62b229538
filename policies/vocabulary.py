"""The words every layer shares (docs/design.md §2, §3, §6), each defined once, as ``StrEnum``s.

A member is its wire string (``Mode.CAP_ACCEPT == "cap_accept"``), so records,
JSON, DuckDB columns and YAML keep the strings they always had; code compares
and dispatches on the members.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal, get_args


class Mode(StrEnum):
    """How one request is verified in one step (§3)."""

    STATIC = "static"
    SHADOW = "shadow"
    COMPACT = "compact"
    CAP_ACCEPT = "cap_accept"


# Modes that verify the whole block, so every depth's label is observed (uncensored).
FULL_BLOCK_MODES: tuple[Mode, ...] = (Mode.STATIC, Mode.SHADOW, Mode.CAP_ACCEPT)
# Modes whose rows carry the scheduler's window (shadow its suggestion): their labels at depths within it are
# observed whatever the mode verified, and were selected on the prediction alone (§2, windowed labels).
WINDOWED_MODES: tuple[Mode, ...] = (Mode.SHADOW, Mode.COMPACT, Mode.CAP_ACCEPT)


class Status(StrEnum):
    """What one depth of one request's step says about ``y_k`` (§2)."""

    ACCEPTED = "accepted"
    REJECTED = "rejected"
    NOT_AT_RISK = "not_at_risk"
    CENSORED = "censored"
    # A censored label settled afterwards from the tokens the request went on to commit (exact: greedy
    # traffic; docs/design.md §2); ``estimated`` labels carry only a probability and stay unknown.
    RECOVERED = "recovered"
    ESTIMATED = "estimated"


class MissReason(StrEnum):
    """Why a verify step ran eager instead of replaying a graph tier (§2)."""

    OVER_MAX_TIER = "over_max_tier"
    NOT_CAPTURED = "not_captured"
    FORCED_EAGER = "forced_eager"


class Phase(StrEnum):
    """Rollout phases (§6): the ladder, then the two phases beside it."""

    BASELINE = "baseline"
    SHADOW = "shadow"
    CANARY = "canary"
    COMPACT = "compact"
    ADAPTIVE = "adaptive"
    FALLBACK = "fallback"
    PAUSED = "paused"


LADDER: tuple[Phase, ...] = (Phase.BASELINE, Phase.SHADOW, Phase.CANARY, Phase.COMPACT, Phase.ADAPTIVE)
# Phases gates judge; baseline only measures the reference they compare with.
SERVING_PHASES: tuple[Phase, ...] = LADDER[1:]
# Phases whose replicas alternate treatment and control epochs (in shadow that is an A/A comparison).
SWITCHBACK_PHASES: tuple[Phase, ...] = SERVING_PHASES


class Action(StrEnum):
    """What one rollout decision does (§6)."""

    HOLD = "hold"
    START = "start"
    ADVANCE = "advance"
    ROLLBACK = "rollback"
    PROMOTE = "promote"
    ABORT = "abort"
    PAUSE = "pause"
    RESUME = "resume"
    REEVALUATE = "reevaluate"  # the fleet's joint contract changed: judge it again from shadow (or baseline)
    # Adaptive only: back to the static cost tables, the stage judged afresh on them (a policy change).
    REVERT_TABLE = "revert_table"
    # Adaptive only: a replica group serves a new fitted cost table. Not a policy change: the stage, its
    # evidence and its counters go on (the table's version travels in the payload's ``cost_tables``).
    PUBLISH_TABLE = "publish_table"


OPERATOR_ACTIONS: tuple[Action, ...] = (Action.PROMOTE, Action.ABORT, Action.PAUSE, Action.RESUME, Action.REVERT_TABLE)
# The same as a type, for the API's path parameter; it must stay the tuple above.
OperatorAction = Literal["promote", "abort", "pause", "resume", "revert_table"]
assert get_args(OperatorAction) == OPERATOR_ACTIONS
# Every action but a hold or a table publication serves a new policy revision.
CHANGES_POLICY: frozenset[Action] = frozenset(Action) - {Action.HOLD, Action.PUBLISH_TABLE}


class Arm(StrEnum):
    """Which side of a switchback comparison an epoch serves (§6)."""

    TREATMENT = "treatment"  # the phase's policy
    CONTROL = "control"  # the baseline's: every request static (adaptive: compact on the static cost table)


class FinishReason(StrEnum):
    """Why a request stopped (§4 request records)."""

    EOS = "eos"
    LENGTH = "length"
    CANCELLED = "cancelled"


class CheckKind(StrEnum):
    """What a replica's consistency check compared (§3 invariants 1 and 4)."""

    GREEDY_REPLAY = "greedy_replay"  # a greedy compact request replayed in static
    STATE_ROLLBACK = "state_rollback"  # a request's cache state against a dense replay


class Outcome(StrEnum):
    """A gate's verdict, and the outcome of one evaluation interval (§6)."""

    PASS = "pass"
    FAIL = "fail"
    INCONCLUSIVE = "inconclusive"
    # Its input could not be measured (a PromQL query or the store failed): not "no data", which is
    # inconclusive; an interval with one (and no failure) is an error interval, counted against error_limit.
    ERROR = "error"
    CRITICAL = "critical"  # an interval outcome only: a critical gate failed


# The comparison gates' ratios, treatment over control (controller.comparison), and each one's drift
# between the comparison window before the newest and the newest.
COMPARISON_METRICS = ("p99_step_ratio", "tokens_per_s_ratio", "p99_tpot_ratio", "p99_ttft_ratio", "goodput_ratio")
DRIFT_METRICS = {f"{metric}_drift": metric for metric in COMPARISON_METRICS}
# The gates over the full-block survival labels, fleet-wide and per replica: their min_samples decide how
# far back the gates' window reaches when the newest intervals hold too few labels (controller.lookback).
LABEL_METRICS = ("survival_ece", "survival_ece_upper", "survival_ece_debiased", "survival_ece_drift")
REPLICA_LABEL_METRICS = ("survival_ece_debiased_replica",)
