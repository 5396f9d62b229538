"""Poll an SGLang server's DSpark records (``GET /server_info``, docs/design.md §8) into the store.

Each ``internal_states[rank].dspark_info_record.records[]`` entry is one verify
step of one DP rank; it becomes a step record of replica ``NAME/dpRANK``
(``sglang_records`` converts each one, and says how its fields map).

- Synthetic acceptance (``simulate_acc_len`` set: the server fakes how many drafts
  are accepted, for load tests) is quarantined with that reason, never stored as
  real acceptance.
- Requests without ``rid`` (optional in SGLang's ``ReqDetail``) get an identity
  from their KV pool slot: ``~pool<index>.<n>``, where n counts the requests that
  slot has held in this server epoch (a new one when ``prefix_len`` is not the
  previous step's ``prefix_len + acc_len``).
- The buffer (up to 200,000 records, returned whole on every poll) is cleared
  after each committed ingest (``dspark_clear_info_records``), where the server
  accepts it; records the server writes between the read and the clear are lost,
  one round trip's worth, which is the price of not re-reading the buffer.
- Ranks: SGLang lists ``internal_states`` in the order its DP ranks' replies
  arrive (``tokenizer_communicator_mixin.py``'s ``handle_recv`` appends them),
  and no element names its rank. An element's rank is the ``dp_rank`` its
  ``dspark_info_record`` (or the element) carries; a lone element is rank 0.
  A reply of several ranks whose records name no ``dp_rank`` cannot be attributed,
  even when only one element carries records: in builds where every DP rank dumps,
  an idle rank's empty buffer leaves the busy one's place meaningless. Nothing of
  it is ingested or cleared, and the poll fails with that reason (the controller
  counts it as a collector error), since a list position would file one rank's
  records, cursors and pool slots under another's.
- De-duplication: per (server, rank) the highest ``forward_ct`` taken is kept;
  a poll takes only records above it, so an unchanged buffer adds nothing and a
  cleared buffer (no records) is harmless.
- Restarts: when every ``forward_ct`` a rank reports is below the last one
  taken, the server restarted; a new epoch starts and ``step_id = epoch << 40 |
  forward_ct`` keeps keys unique. A restart whose counter overtakes the old one
  between two polls cannot be told apart from progress.
- Resuming: the poller starts from the highest stored step_id per replica, so
  restarting the poller does not re-ingest the server's buffer.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from sparkgate.collectors.ingest import Ingestor
from sparkgate.collectors.schema import (
    Problem,
)
from sparkgate.collectors.sglang_records import convert_record, present, server_contract
from sparkgate.collectors.store import IngestResult
from sparkgate.collectors.wire import from_dicts, reject

log = logging.getLogger(__name__)
CLEAR_KEY = "dspark_clear_info_records"
EPOCH_SHIFT = 40


def server_name(url: str) -> str:
    """The name a server's replicas are stored under (``NAME/dpRANK``): its URL without the scheme."""
    return url.rstrip("/").split("://", 1)[-1]


def replica_prefix(url: str) -> str:
    """What every replica id of the server at ``url`` starts with, and no other server's."""
    return f"{server_name(url)}/dp"


@dataclass
class _Cursor:
    epoch: int = 0
    last: int = -1  # highest forward_ct taken in this epoch
    # KV pool slot -> (requests it has held, the prefix_len its request continues at): identities for reqs
    # without rid. Copied on change, so an uncommitted poll leaves the committed cursor as it was.
    slots: dict[int, tuple[int, int]] = field(default_factory=dict)


def _anonymous_ids(reqs: list[dict], slots: dict[int, tuple[int, int]]) -> list[str]:
    """Each req's rid, or ``~pool<index>.<n>`` for one without; updates ``slots`` in place."""
    ids = []
    for r in reqs:
        index, prefix, committed = r.get("req_pool_index", -1), r.get("prefix_len", -1), r.get("acc_len", 0)
        held, expected = slots.get(index, (0, None))
        if prefix != expected:
            held += 1  # a new request in this slot: it does not continue where the last one stood
        slots[index] = (held, prefix + committed)
        ids.append(str(r["rid"]) if r.get("rid") is not None else f"~pool{index}.{held}")
    return ids


def dp_ranks(states: list[dict]) -> list[int | None]:
    """The DP rank of each ``internal_states`` element (None: it carries no records, so needs none).

    Raises ``ValueError`` naming the element when a rank cannot be told: several elements carry records and
    one names no ``dp_rank`` (SGLang lists the replies in arrival order), a ``dp_rank`` is not a
    non-negative integer, or two elements name the same rank."""
    ranks: list[int | None] = []
    for i, state in enumerate(states):
        info = state.get("dspark_info_record") or {}
        rank = info.get("dp_rank", state.get("dp_rank"))
        if not info.get("records"):
            ranks.append(None)
            continue
        if rank is None:
            if len(states) > 1:
                raise ValueError(
                    f"internal_states[{i}]: {len(states)} DP ranks and this one names no dp_rank; SGLang lists "
                    "them in the order their replies arrive, so its records cannot be attributed (none ingested)"
                )
            rank = 0
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            raise ValueError(f"internal_states[{i}].dp_rank: {rank!r} is not a non-negative integer")
        if rank in ranks:
            raise ValueError(f"internal_states[{i}].dp_rank: rank {rank} appears twice")
        ranks.append(rank)
    return ranks


class SGLangPoller:
    """Polls one server; ``poll_once`` commits the new records of every DP rank as one batch."""

    def __init__(
        self,
        url: str,
        ingestor: Ingestor,
        name: str | None = None,
        client: httpx.Client | None = None,
        clear_buffer: bool = True,
        greedy: bool = False,
    ):
        self.url = url.rstrip("/")
        self.greedy = greedy  # the servers' traffic is greedy: their rows feed censored-label recovery
        self.name = name or server_name(self.url)
        self.ingestor = ingestor
        self.client = client or httpx.Client(timeout=10.0)
        self.clear_buffer = clear_buffer  # turned off for good when the server refuses the clear
        self.restarts = self.synthetic = 0
        self._cursors: dict[int, _Cursor] = {}
        self._stored = ingestor.store.max_step_ids()

    def _cursor(self, rank: int) -> _Cursor:
        if rank not in self._cursors:
            stored = self._stored.get(self.replica_id(rank))
            self._cursors[rank] = (
                _Cursor() if stored is None else _Cursor(stored >> EPOCH_SHIFT, stored & ((1 << EPOCH_SHIFT) - 1))
            )
        return self._cursors[rank]

    def replica_id(self, rank: int) -> str:
        return f"{self.name}/dp{rank}"  # starts with replica_prefix(url) when the name is the default

    def _new_records(self, rank: int, info: dict, now: float, server: dict) -> tuple[list[dict], _Cursor]:
        """Converted records above the rank's cursor, and the cursor to keep once they are committed."""
        records = [r for r in info.get("records") or [] if isinstance(r.get("forward_ct"), int)]
        cursor = self._cursor(rank)
        if not records:
            return [], cursor  # buffer cleared, or nothing yet
        if max(r["forward_ct"] for r in records) < cursor.last:
            cursor = _Cursor(cursor.epoch + 1, -1)  # the server restarted: its counter went backwards
        fresh = sorted((r for r in records if r["forward_ct"] > cursor.last), key=lambda r: r["forward_ct"])
        gamma, slots = present(info.get("gamma")), dict(cursor.slots)
        components = [c for c in info.get("components") or [] if isinstance(c, str)]
        contract = server_contract(server, gamma)
        out = []
        for r in fresh:
            step_id = cursor.epoch << EPOCH_SHIFT | r["forward_ct"]
            ids = _anonymous_ids(r.get("reqs") or [], slots)
            out.append(convert_record(r, gamma, self.replica_id(rank), step_id, now, info.get("mode"), ids, contract,
                                      greedy=self.greedy, components=components))  # fmt: skip
        return out, _Cursor(cursor.epoch, fresh[-1]["forward_ct"], slots) if fresh else cursor

    def _server_info(self) -> dict[str, Any]:
        response = self.client.get(f"{self.url}/server_info")
        if response.status_code == 404:  # releases before /server_info serve it at /get_server_info
            response = self.client.get(f"{self.url}/get_server_info")
        response.raise_for_status()
        body = response.json()
        return body if isinstance(body, dict) else {}

    def poll_once(self) -> IngestResult | None:
        """Fetch the server's records and commit what is new; None when nothing was new.

        Cursors move only after the commit, so a failed commit is retried by the next poll; the server's
        buffer is cleared only after a commit. Raises ``ValueError`` when the reply's DP ranks cannot be told
        apart (``dp_ranks``), with nothing ingested or cleared.
        """
        now = time.time()
        steps: list[dict] = []
        cursors: dict[int, _Cursor] = {}
        synthetic: dict[int, list[Problem]] = {}
        server = self._server_info()
        states = [state or {} for state in server.get("internal_states") or []]
        for rank, state in zip(dp_ranks(states), states):
            if rank is not None:
                info = state["dspark_info_record"]
                new, cursors[rank] = self._new_records(rank, info, now, server)
                fake = info.get("simulate_acc_len")
                if fake is not None and new:
                    problem = Problem("simulate_acc_len", fake, "synthetic acceptance, not the drafter's own")
                    synthetic.update({len(steps) + i: [problem] for i in range(len(new))})
                steps.extend(new)
        result = None
        if steps:
            result = self.ingestor.ingest(reject(from_dicts(steps), synthetic), f"sglang:{self.name}")
            self.synthetic += len(synthetic)
        for rank, cursor in cursors.items():
            self.restarts += cursor.epoch - self._cursor(rank).epoch
            self._cursors[rank] = cursor
        if result is not None and self.clear_buffer:
            self._clear()
        return result

    def _clear(self) -> None:
        """Empty the server's record buffer (every DP rank); stop asking if the server refuses."""
        try:
            response = self.client.post(f"{self.url}/set_internal_state", json={"server_args": {CLEAR_KEY: True}})
        except httpx.HTTPError as exc:
            log.warning("%s: clearing the record buffer failed (%s); will retry after the next ingest", self.url, exc)
            return
        answers = response.json() if response.status_code == 200 else None
        if not (isinstance(answers, list) and answers and all(a is True for a in answers)):
            log.warning("%s refused %s (HTTP %s: %s); its buffer is re-read on every poll from now on",
                        self.url, CLEAR_KEY, response.status_code, response.text[:200])  # fmt: skip
            self.clear_buffer = False
