"""Field types the policy file's models share: strict numbers (YAML's ``yes`` never passes for 1), the
phase names as Literals (the JSON Schema spells them out), and the one form of a bad value's message."""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import ConfigDict, Strict

from sparkgate.policies.vocabulary import LADDER, SERVING_PHASES

Int = Annotated[int, Strict()]
Float = Annotated[float, Strict()]
Bool = Annotated[bool, Strict()]
FROZEN = ConfigDict(extra="forbid", frozen=True)

LadderPhase = Literal["baseline", "shadow", "canary", "compact", "adaptive"]
ServingPhase = Literal["shadow", "canary", "compact", "adaptive"]
# The Literals spell the vocabulary out for the JSON Schema; they must be the vocabulary.
LADDER_PHASES: tuple[LadderPhase, ...] = get_args(LadderPhase)
SERVING_PHASE_NAMES: tuple[ServingPhase, ...] = get_args(ServingPhase)
assert tuple(LADDER) == LADDER_PHASES and tuple(SERVING_PHASES) == SERVING_PHASE_NAMES


def want(key: str, value: Any, what: str) -> str:
    """A bad value's message: the key, what it must be, what it was."""
    return f"{key}: expected {what}, got {value!r}"


def raise_all(problems: list[str]) -> None:
    """Every problem a model's check found, at once (pydantic names the model's path before each)."""
    if problems:
        raise ValueError("\n".join(problems))
