"""Writer credentials: who may post records, consistency checks and aggregates, and for which replicas.

Operator tokens steer the rollout; writer tokens only feed it, yet forged records can push any gate
either way and one forged mismatch trips a critical gate, so writers authenticate too whenever a server
has writers configured (and must, beyond loopback: ``controller.service.check_bind``). Each writer is
bound to the replica ids it may post for (``fnmatch`` patterns); a body naming any other replica is
refused whole with 403, logged and counted (``sparkgate_writer_refusals_total``). A writer may also be
bound to the static cost tables it registers (``cost_tables``, by version, which names the replica group
that serves the table), so one fleet cannot register another's table before it does.

Tokens come from the environment or a file, never from the policy or the command line::

    writers:
      - {name: fleet-a, token_env: SPARKGATE_WRITER_FLEET_A, replicas: ["replica-a-*"],
         cost_tables: ["fleet-a-*"]}
      - {name: collector, token_file: /run/secrets/collector-token, replicas: ["sglang-*"]}

``SPARKGATE_WRITER_TOKEN`` alone configures one writer, ``default``, for every replica.
"""

from __future__ import annotations

import fnmatch
import hmac
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkgate.policies import yaml_text
from sparkgate.policies.errors import InputError
from sparkgate.policies.payload import WRITER_TOKEN_ENV

log = logging.getLogger(__name__)


class WritersError(InputError):
    """A bad writers file; the message names the entry and the key."""


@dataclass(frozen=True)
class Writer:
    """``replicas``: the replica ids it may post for; ``cost_tables``: the static cost-table versions it may
    register (a static table's version names the replica group serving it); both ``fnmatch`` patterns."""

    name: str
    token: str
    replicas: tuple[str, ...] = ("*",)
    cost_tables: tuple[str, ...] = ("*",)

    def may_post_for(self, replica_id: str) -> bool:
        return any(fnmatch.fnmatchcase(replica_id, pattern) for pattern in self.replicas)

    def may_register(self, version: str) -> bool:
        return any(fnmatch.fnmatchcase(version, pattern) for pattern in self.cost_tables)


class Refused(Exception):
    """A writer request refused: ``status`` 401 (no credential), 403 (wrong one, or another replica's id)."""

    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status, self.reason = status, reason


class Writers:
    """The configured writers; ``check`` names the writer of a request or raises ``Refused``."""

    def __init__(self, writers: Iterable[Writer], on_refusal: Any = None):
        self.writers = list(writers)
        if not self.writers:
            raise WritersError("writers: at least one writer")
        self.on_refusal = on_refusal  # called with (writer name or None, reason) for each refusal

    def _refuse(self, status: int, reason: str, writer: str | None = None) -> Refused:
        log.warning("writer request refused (%s): %s", writer or "unauthenticated", reason)
        if self.on_refusal is not None:
            self.on_refusal(writer or "unauthenticated", "forbidden" if status == 403 else "unauthenticated")
        return Refused(status, reason)

    def identify(self, authorization: str | None) -> Writer:
        """The writer whose token the ``Authorization: Bearer`` header carries."""
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise self._refuse(401, "missing writer bearer token")
        # Compare with every token, so the time taken does not tell which one nearly matched.
        found = [w for w in self.writers if hmac.compare_digest(w.token.encode(), token.encode())]
        if not found:
            raise self._refuse(403, "wrong writer token")
        return found[0]

    def permit(self, writer: Writer, replica_ids: Iterable[str | None]) -> None:
        """Refused (403) unless ``writer`` may post for every replica a body names. A record that names none
        (null) is left to validation, which refuses it, naming the missing field, and stores nothing of it."""
        for replica_id in replica_ids:
            if replica_id is not None and not writer.may_post_for(replica_id):
                raise self._refuse(403, f"writer {writer.name!r} may not post for replica {replica_id!r}", writer.name)

    def permit_table(self, writer: Writer, version: str) -> None:
        """Refused (403) unless ``writer`` may register the static cost table ``version``."""
        if not writer.may_register(version):
            raise self._refuse(403, f"writer {writer.name!r} may not register cost table {version!r}", writer.name)


_KEYS = ("name", "token_env", "token_file", "replicas", "cost_tables")


def _patterns(entry: Mapping[str, Any], key: str, where: str, what: str) -> tuple[str, ...]:
    patterns = entry.get(key, ["*"])
    if not isinstance(patterns, list) or not patterns or not all(isinstance(p, str) and p for p in patterns):
        raise WritersError(f"{where}.{key}: expected a non-empty list of {what} patterns")
    return tuple(patterns)


def _token(entry: Mapping[str, Any], where: str, environ: Mapping[str, str]) -> str:
    if ("token_env" in entry) == ("token_file" in entry):
        raise WritersError(f"{where}: give exactly one of token_env and token_file")
    if "token_env" in entry:
        token = environ.get(str(entry["token_env"]), "")
        if not token:
            raise WritersError(f"{where}.token_env: environment variable {entry['token_env']} is not set")
        return token
    try:
        token = Path(str(entry["token_file"])).read_text().strip()
    except OSError as exc:
        raise WritersError(f"{where}.token_file: {exc}") from None
    if not token:
        raise WritersError(f"{where}.token_file: {entry['token_file']} is empty")
    return token


def load_writers(path: str | Path | None, environ: Mapping[str, str] | None = None) -> list[Writer]:
    """Writers from a YAML file, or the one ``SPARKGATE_WRITER_TOKEN`` writer; [] when neither is given."""
    env = os.environ if environ is None else environ
    if path is None:
        token = env.get(WRITER_TOKEN_ENV, "")
        return [Writer("default", token)] if token else []
    try:
        raw = yaml_text.load_file(path)
    except (OSError, yaml_text.YAMLTextError) as exc:  # a file that is not UTF-8 is one of the latter
        raise WritersError(f"{path}: {exc}") from None
    entries = raw.get("writers") if isinstance(raw, dict) else None
    if not isinstance(entries, list) or not entries:
        raise WritersError(f"{path}: expected `writers:` with a list of writers")
    writers = []
    for i, entry in enumerate(entries):
        where = f"{path}: writers[{i}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not entry["name"]:
            raise WritersError(f"{where}.name: expected a non-empty string")
        token = _token(entry, where, env)  # first: an inline `token:` is told where tokens come from
        unknown = [str(k) for k in entry if k not in _KEYS]
        if unknown:  # a misspelt binding would leave the writer bound to everything
            raise WritersError(f"{where}.{unknown[0]}: unknown key (known: {', '.join(_KEYS)})")
        replicas = _patterns(entry, "replicas", where, "replica id")
        writers.append(Writer(entry["name"], token, replicas, _patterns(entry, "cost_tables", where, "cost-table")))
    names = [w.name for w in writers]
    if len(set(names)) != len(names):
        raise WritersError(f"{path}: writer names must be unique, got {names}")
    return writers
