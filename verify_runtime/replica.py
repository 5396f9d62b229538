"""A runtime replica that follows a controller (docs/design.md §6, §7); ``replica_cli`` runs it.

The replica polls ``GET /v1/policy`` and, when the revision changes, sets the
engine's phase, revision, window policy and per-request mode. A request's arm is
a stable hash of its id against the fractions, so it keeps its arm for its whole
life (until the phase itself changes). Step records are posted to
``POST /v1/records`` in batches; sampled greedy compact requests are replayed in
static once their records are stored, every ``state_every`` steps one active
request's cache state is checked against a dense replay, and both kinds of
comparison are posted to ``POST /v1/consistency``.

Under a payload with a switchback schedule the replica alternates epochs: in a
control epoch every request is verified static (the baseline; in adaptive,
compact on the static cost table), in a treatment epoch as the phase says (in
adaptive, on the fitted table the payload names, ``table_swap``); steps carry
the epoch, the arm and the cost table they were served on. Every request that
finishes or is cancelled becomes a request record, posted to
``POST /v1/request-records`` beside the step records.

When the controller cannot be reached the replica keeps serving under the last
policy it received; unsent records wait in its ``spool`` (on disk, replayed in
order, ``spool.Spool``; request records in its ``requests/`` folder), or without
one a bounded number wait in memory.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence

import httpx

from sparkgate.collectors.request_records import RequestRecord
from sparkgate.collectors.schema import MAX_CHECKS_PER_REPORT, StepRecord
from sparkgate.policies.payload import PolicyPayload
from sparkgate.policies.switchback import Switchback
from sparkgate.policies.vocabulary import Arm, Mode, Phase
from sparkgate.policies.window import CostAwareScheduler, FixedWindow, WindowPolicy

from .consistency import GreedyReplay, state_check, unit_hash, wanted
from .controller_client import REQUEST_RECORDS_ROUTE, ControllerClient
from .engine import Engine, Request
from .spool import Spool, bodies
from .table_swap import TableSwap

log = logging.getLogger(__name__)
MAX_PENDING_RECORDS = 10_000
# A post's body at most (an eighth of the ingest routes' 64 MiB limit): a backlog goes in several.
MAX_POST_BYTES = 8 << 20
# Checks kept while the controller cannot take them; past this the oldest clean ones go first (a mismatch
# is what the critical gate reads).
MAX_PENDING_CHECKS = 100_000


def mode_for(request_id: str, policy: PolicyPayload) -> Mode:
    """The verify mode of a request under a policy payload.

    baseline: static. fallback: static, or compact with the fallback window when it
    is shorter than γ. Otherwise the request is in the compact arm when its hash is
    below ``compact_fraction``; within that arm ``observe_fraction`` of requests run
    cap_accept (full verification, so gates keep uncensored labels); the rest of
    the traffic runs shadow (full verification with the suggestion logged).
    """
    if policy.phase is Phase.BASELINE:
        return Mode.STATIC
    if policy.phase is Phase.FALLBACK:
        return Mode.STATIC if policy.fallback_window >= policy.gamma else Mode.COMPACT
    if unit_hash(request_id, "arm") >= policy.compact_fraction:
        return Mode.SHADOW
    return Mode.CAP_ACCEPT if unit_hash(request_id, "observe") < policy.observe_fraction else Mode.COMPACT


class Replica:
    """An engine driven by a controller's policy. ``scheduler`` chooses windows outside fallback; when it is
    cost-aware, its table is the replica's static one, and in adaptive treatment epochs serve the fitted table
    the payload names for the replica's group (``table_swap``)."""

    def __init__(
        self,
        engine: Engine,
        client: ControllerClient,
        scheduler: WindowPolicy,
        *,
        replay: GreedyReplay | None = None,
        consistency_fraction: float = 0.05,
        state_every: int = 0,
        poll_s: float = 1.0,
        flush_steps: int = 16,
        spool: Spool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.engine, self.client, self.scheduler, self.replay = engine, client, scheduler, replay
        self.consistency_fraction, self.state_every, self.poll_s, self.flush_steps, self.clock = (
            consistency_fraction,
            state_every,
            poll_s,
            flush_steps,
            clock,
        )
        self.spool = spool  # where records wait while the controller is unreachable
        self.request_spool = Spool(spool.dir / "requests", spool.max_bytes) if spool is not None else None
        self.payload: PolicyPayload | None = None
        self.schedule: Switchback | None = None
        self.tables: TableSwap | None = None
        self.use_static(scheduler)
        self.pending: list[StepRecord] = []
        self.pending_requests: list[RequestRecord] = []
        self.compact_ids: set[str] = set()
        self.to_check: list[Request] = []
        self.checked: list[dict] = []  # state checks waiting to be posted
        self.stats = {"steps": 0, "finished": 0, "posted": 0, "dropped": 0, "checks": 0, "mismatches": 0,
                      "checks_dropped": 0, "request_records": 0, "requests_dropped": 0, "cancelled": 0,
                      "tables_refused": 0}  # fmt: skip
        self._last_poll = float("-inf")
        engine.sink = self._keep
        engine.request_sink = self._keep_request

    def _keep_request(self, record: RequestRecord) -> None:
        self.pending_requests.append(record)  # not a bound append: flush replaces the list

    def _keep(self, record: StepRecord) -> None:
        self.pending.append(record)
        self.compact_ids.update(r.request_id for r in record.requests if r.mode == "compact")

    # -- policy ----------------------------------------------------------------
    def use_static(self, scheduler: WindowPolicy) -> None:
        """Serve ``scheduler`` outside fallback from now on, its table as the static one (a fault swaps it)."""
        self.scheduler = scheduler
        self.tables = TableSwap(scheduler) if isinstance(scheduler, CostAwareScheduler) else None
        if self.tables is not None:
            self.engine.config.cost_table_version = self.tables.group

    def register(self) -> None:
        """Tell the controller the static table (nothing to tell without a cost-aware scheduler)."""
        if self.tables is None or self.tables.group is None:
            return
        try:
            self.client.register_table(self.engine.config.replica_id, self.tables.static.cost_table)
        except httpx.HTTPError as exc:  # adaptive cannot fit this group's table; serving goes on
            log.warning("registering cost table %s failed: %s", self.tables.group, exc)

    def _follow_tables(self, payload: PolicyPayload) -> None:
        if self.tables is None:
            return
        try:
            self.tables.follow(payload.cost_tables, self.client.cost_table)
        except httpx.HTTPError as exc:
            log.warning("fetching a cost table failed (%s); will retry", exc)
        self.stats["tables_refused"] = len(self.tables.refused)

    def follow(self, payload: PolicyPayload) -> None:
        """Serve under ``payload`` from the next step on."""
        config = self.engine.config
        if payload.gamma != config.gamma:
            raise RuntimeError(
                f"policy gamma={payload.gamma} but this replica runs gamma={config.gamma}; "
                "restart it with the policy's gamma"
            )
        config.phase, config.policy_revision = payload.phase, payload.revision
        # Adaptive's control serves compact on the static table: what adaptation changes is the table alone.
        static_control = payload.phase is not Phase.ADAPTIVE
        self.engine.mode_for = lambda request: (
            Mode.STATIC if config.arm == Arm.CONTROL and static_control else mode_for(request.request_id, payload)
        )
        self.payload, self.schedule = payload, payload.schedule()
        self._follow_tables(payload)
        self.switch()

    def switch(self, now: float | None = None) -> None:
        """Serve the epoch and arm the schedule holds at ``now`` (unix seconds; none without a schedule), and
        the window policy of that arm."""
        config, schedule, payload = self.engine.config, self.schedule, self.payload
        epoch = schedule.epoch(time.time() if now is None else now) if schedule is not None else -1
        config.epoch, config.arm = (
            (epoch, schedule.arm(config.replica_id, epoch)) if schedule and epoch >= 0 else (None, None)
        )
        if payload is not None and payload.phase is Phase.FALLBACK:
            # A fixed window prices nothing: its steps must not read as served on the last cost table.
            self.engine.policy, config.cost_table_version = FixedWindow(payload.fallback_window), None
        elif self.tables is not None:
            fitted = payload is not None and payload.phase is Phase.ADAPTIVE and config.arm != Arm.CONTROL
            config.cost_table_version, self.engine.policy = self.tables.current(fitted)
        else:
            self.engine.policy = self.scheduler

    def poll(self, force: bool = False) -> None:
        if not force and self.clock() - self._last_poll < self.poll_s:
            return
        self._last_poll = self.clock()
        try:
            payload = self.client.policy()
        except httpx.HTTPError as exc:
            if self.payload is None:
                raise
            log.warning("policy poll failed (%s); keeping revision %s", exc, self.payload.revision)
            return
        if self.payload is None:
            self.follow(payload)
            self.register()
        elif payload.revision != self.payload.revision:
            self.follow(payload)
        elif payload.cost_tables != self.payload.cost_tables:
            self.payload = payload
            self._follow_tables(payload)

    # -- records and checks ----------------------------------------------------
    def flush(self) -> None:
        """Post what the spools hold, then pending step and request records, then check the sampled requests
        whose records are now stored. While the controller is unreachable pending records go to the spool
        (with one, in order behind what it holds); without one at most ``MAX_PENDING_RECORDS`` of each
        kind wait in memory."""
        client = self.client
        self.pending, steps_ok = self._deliver(
            self.pending, self.spool, client.post_records, client.post_body, ("posted", "dropped")
        )
        self.pending_requests, _ = self._deliver(
            self.pending_requests,
            self.request_spool,
            client.post_request_records,
            lambda body: client.post_body(body, REQUEST_RECORDS_ROUTE),
            ("request_records", "requests_dropped"),
        )
        if steps_ok:
            self._check()

    def _deliver(
        self,
        records: list,
        spool: Spool | None,
        post_records: Callable[[Sequence, bytes], object],
        post_body: Callable[[bytes], object],
        counters: tuple[str, str],
    ) -> tuple[list, bool]:
        """Post ``spool``'s segments, then ``records`` in bodies of at most ``MAX_POST_BYTES``; returns (what
        still waits in memory, delivered)."""
        posted, dropped = counters
        try:
            if spool is not None:
                self.stats[posted] += spool.replay(post_body)
            for body, chunk in bodies(records, MAX_POST_BYTES):
                post_records(chunk, body)
                self.stats[posted] += len(chunk)
                records = records[len(chunk) :]  # delivered: never posted again
            return [], True
        except httpx.HTTPError as exc:
            log.warning("posting %d records failed (%s); will retry", len(records), exc)
            if spool is not None:
                spool.append(records)
                self.stats[dropped] = spool.dropped
                return [], False
            overflow = len(records) - MAX_PENDING_RECORDS
            if overflow > 0:
                self.stats[dropped] += overflow
                records = records[overflow:]
            return records, False

    def _check(self) -> None:
        """Replay the sampled requests whose records are stored, then post every check held, in bodies the
        route takes. A check leaves ``checked`` only once posted: while the controller cannot take them
        they wait (and the requests not yet replayed with them), never lost to one failed post."""
        replica_id = self.engine.config.replica_id
        try:
            self._replay_checks(replica_id)
            while self.checked:
                chunk = self.checked[:MAX_CHECKS_PER_REPORT]
                self.client.post_checks(replica_id, chunk)
                del self.checked[: len(chunk)]
                self.stats["checks"] += len(chunk)
                self.stats["mismatches"] += sum(c["mismatch_at"] is not None for c in chunk)
        except httpx.HTTPError as exc:
            log.warning("posting %d consistency checks failed (%s); will retry", len(self.checked), exc)
            self._bound_checks()

    def _replay_checks(self, replica_id: str) -> None:
        replay = self.replay
        while self.to_check:
            request = self.to_check[0]
            if replay is not None and (committed := self.client.committed(request.request_id, replica_id)):
                self.checked.append(replay.check(request.request_id, request.prompt, committed).to_dict())
            self.to_check.pop(0)

    def _bound_checks(self) -> None:
        over = len(self.checked) - MAX_PENDING_CHECKS
        if over <= 0:
            return
        oldest_clean_first = sorted(range(len(self.checked)), key=lambda i: self.checked[i]["mismatch_at"] is not None)
        dropped = set(oldest_clean_first[:over])
        self.checked = [c for i, c in enumerate(self.checked) if i not in dropped]
        self.stats["checks_dropped"] += over

    def _check_state(self) -> None:
        """Every ``state_every`` steps, one active request, in turn."""
        if self.state_every and self.engine.active and self.stats["steps"] % self.state_every == 0:
            request = self.engine.active[self.stats["steps"] // self.state_every % len(self.engine.active)]
            self.checked.append(state_check(self.engine, request).to_dict())

    def cancel(self, request_id: str) -> bool:
        """Cancel a waiting or running request (``Engine.cancel``); its record is posted like any other."""
        cancelled = self.engine.cancel(request_id)
        self.stats["cancelled"] += cancelled
        return cancelled

    def _walk_away(self) -> None:
        """Cancel the running requests whose client leaves now (``Request.cancel_after``)."""
        for request in list(self.engine.active):
            if request.cancel_after is not None and len(request.output) >= request.cancel_after:
                self.cancel(request.request_id)

    def _finished(self) -> None:
        for request_id, request in list(self.engine.finished.items()):
            mode = "compact" if request_id in self.compact_ids else "other"
            if self.replay is not None and wanted(request, mode, self.consistency_fraction):
                self.to_check.append(request)
            self.compact_ids.discard(request_id)
            del self.engine.finished[request_id]  # a long-running replica must not keep every request
            self.stats["finished"] += 1

    # -- the loop ----------------------------------------------------------------
    def serve(self, requests: Iterable[Request], max_steps: int | None = None) -> dict:
        """Serve ``requests`` (possibly endless) until they are done or ``max_steps``; returns counters."""
        source: Iterator[Request] = iter(requests)
        self.poll(force=True)
        while max_steps is None or self.stats["steps"] < max_steps:
            while len(self.engine.queue) < self.engine.config.max_batch:
                request = next(source, None)
                if request is None:
                    break
                self.engine.submit(request)
            if not (self.engine.queue or self.engine.active):
                break
            self.poll()
            self.switch()
            self.engine.step()
            self.stats["steps"] += 1
            self._walk_away()
            self._check_state()
            self._finished()
            if len(self.pending) >= self.flush_steps:
                self.flush()
        self.flush()
        assert self.payload is not None  # serve polls (force=True) before its first step
        return {**self.stats, "revision": self.payload.revision, "phase": str(self.payload.phase)}


def workload_requests(
    replica_id: str,
    count: int,
    max_new_tokens: int,
    temperature: float,
    seed: int,
    cancel_fraction: float = 0.0,
    prompt_len: int = 96,
) -> Iterator[Request]:
    """Requests over the mixed workload (``count`` 0: endless), ids unique per replica; a stable
    ``cancel_fraction`` of them is cancelled by its client after a uniform share of its tokens."""
    from .workload import mixed_workload

    prompts = mixed_workload(256, seed, prompt_len=prompt_len)
    numbers = itertools.count() if count == 0 else range(count)
    for i in numbers:
        prompt, request_id = prompts[i % len(prompts)], f"{replica_id}-{i}"
        leaves = unit_hash(request_id, "cancel") < cancel_fraction
        after = 1 + int(unit_hash(request_id, "cancel-at") * max(max_new_tokens - 1, 1)) if leaves else None
        yield Request(request_id, prompt.tokens, max_new_tokens, temperature, seed + i, task=prompt.task,
                      cancel_after=after)  # fmt: skip
