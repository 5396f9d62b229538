"""The policy payload a replica serves under: ``GET /v1/policy`` (docs/design.md §6).

One typed model for the three parties that handle it: the supervisor builds it
from the rollout state, the service returns it (and documents it in OpenAPI),
and a replica validates what it fetched before it follows it, so a key renamed on
one side fails loudly on the other instead of reading ``None``.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from sparkgate.policies.switchback import Switchback
from sparkgate.policies.vocabulary import Phase

# Where a replica (or any writer) finds the bearer token it signs its records with; the server's
# ``collectors.writers`` reads the same variable for its one default writer.
WRITER_TOKEN_ENV = "SPARKGATE_WRITER_TOKEN"


class SwitchbackSpec(BaseModel):
    """``policies.switchback.Switchback`` on the wire: epoch 0 starts at ``origin`` (unix seconds)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    seed: int
    epoch_s: float = Field(gt=0, allow_inf_nan=False)
    origin: float = Field(allow_inf_nan=False)


class PolicyPayload(BaseModel):
    """What every replica of a fleet follows.

    Invariants: ``revision`` grows by one exactly when anything a replica acts on
    changes, but for ``cost_tables`` (a table update must not restart the stage's evidence);
    ``0 <= compact_fraction, observe_fraction <= 1``;
    ``0 <= fallback_window <= gamma``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    revision: int = Field(ge=0)
    phase: Phase
    compact_fraction: float = Field(ge=0.0, le=1.0)
    observe_fraction: float = Field(ge=0.0, le=1.0)
    gamma: int = Field(ge=1)  # before fallback_window, which is checked against it
    fallback_window: int = Field(ge=0)
    cost_table_version: str | None
    cost_tables: dict[str, str] = Field(
        description="Adaptive: the fitted cost table version each replica group serves, keyed by the version of "
        "the static table the group starts from (empty: every group serves its static table). A change here "
        "keeps the revision: replicas compare it on every poll.",
    )
    sts_version: str | None
    switchback: SwitchbackSpec | None = Field(
        description="The epoch schedule replicas alternate treatment and control on (null: no control)."
    )

    @field_validator("fallback_window")
    @classmethod
    def _within_gamma(cls, value: int, info: ValidationInfo) -> int:
        gamma = info.data.get("gamma")  # absent when gamma itself was refused
        if gamma is not None and value > gamma:
            raise ValueError(f"must be at most gamma ({gamma})")
        return value

    def schedule(self) -> Switchback | None:
        spec = self.switchback
        return None if spec is None else Switchback(spec.seed, spec.epoch_s, spec.origin)
