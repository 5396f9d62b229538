"""Field types the policy file's models share: strict numbers (YAML's ``yes`` never passes for 1)."""

from __future__ import annotations

from typing import Annotated

from pydantic import ConfigDict, Strict

Int = Annotated[int, Strict()]
Float = Annotated[float, Strict()]
Bool = Annotated[bool, Strict()]
FROZEN = ConfigDict(extra="forbid", frozen=True)
