"""A gate input (docs/design.md §6): what the controller measured for one metric, with its sample count."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Measurement:
    """A gate input: ``value`` (None when there is nothing to compute it from; ``why`` then says why, when
    it is not simply a lack of data) and its sample count; a comparison adds its interval (``low``,
    ``high``) and how it was computed (``method``)."""

    value: float | None
    samples: int
    # An interval's bounds; either may be None, open (a fleet with too few pairs on some replica for that
    # side: controller.comparison), and then the gate cannot pass (or fail) by that side.
    low: float | None = None
    high: float | None = None
    method: str | None = None
    why: str | None = None
    error: str | None = None  # measuring failed (not a lack of data): the gate's verdict is an error

    def to_dict(self) -> dict:
        out: dict = {"value": self.value, "samples": self.samples}
        if self.method is not None:
            out.update(low=self.low, high=self.high, method=self.method)
        if self.why is not None:
            out["why"] = self.why
        if self.error is not None:
            out["error"] = self.error
        return out


def span(low: float | None, high: float | None, spec: str = ".4g") -> str:
    """An interval as text (``""`` with neither bound; an open side shows as ``open``)."""
    if low is None and high is None:
        return ""
    return f"[{'open' if low is None else format(low, spec)}, {'open' if high is None else format(high, spec)}]"
