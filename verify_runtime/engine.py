"""The continuous-batching decode loop: admit, prefill, draft, schedule, verify, accept, commit.

Each ``step`` advances every active request by ``accepted + 1`` tokens and emits
one ``StepRecord`` (docs/design.md §4) to the sink; each request that finishes, or
is cancelled (``cancel``), emits one ``RequestRecord`` to the request sink. Request state lives in the KV cache
(committed rows) and in ``Request.history`` (committed tokens, the last one
pending: its K/V is written by the next verify step).
"""

from __future__ import annotations

import collections
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from sparkgate.collectors.request_records import RequestRecord
from sparkgate.collectors.schema import StepRecord
from sparkgate.policies.contract import Contract, hardware_text
from sparkgate.policies.cost_profile import hardware_fingerprint
from sparkgate.policies.window import FixedWindow, WindowContext, WindowPolicy

from .acceptance import AcceptInput, accept, draft_accepts, next_accept_prob
from .admission import check_request
from .drafters import DraftContext, Drafter, temperature_probs
from .kv_cache import KVCache
from .model import EOS, Transformer, model_version
from .modes import mode_codes, verify_plan
from .request_log import request_record
from .rng import ACCEPT, SAMPLE, uniform
from .step_log import StepCosts, StepOutcome, request_rows, step_record
from .tiers import TierGrid, served_grid
from .timing import StageClock
from .verify import TargetRunner


@dataclass
class Request:
    request_id: str
    prompt: list[int]
    max_new_tokens: int
    temperature: float = 0.0
    seed: int = 0
    mode: str | None = None  # None: the engine's mode_for decides
    task: str = "default"
    stop_at_eos: bool = True
    output: list[int] = field(default_factory=list)
    history: list[int] = field(default_factory=list)
    hidden: torch.Tensor | None = None  # last target hidden states, for drafters that read them
    past_survival: list[torch.Tensor] = field(default_factory=list)  # for lagged policies, oldest first
    slot: int = -1
    finish_reason: str | None = None
    arrival_ts: float | None = None  # unix seconds; None: when it is submitted
    # Per commit: unix time and the output length after it (before a finish trims past EOS or the limit).
    commit_ts: list[float] = field(default_factory=list)
    commit_len: list[int] = field(default_factory=list)
    first_mode: str | None = None
    epoch: int | None = None  # the switchback epoch it arrived in
    arm: str | None = None
    spans_epochs: bool = False
    finish_ts: float | None = None
    # A load generator's client who walks away after this many output tokens (None: stays to the end).
    cancel_after: int | None = None


@dataclass
class EngineConfig:
    gamma: int = 7
    max_batch: int = 32
    cache_len: int | None = None  # default: the model's max_seq_len
    replica_id: str = "replica-0"
    phase: str = "baseline"
    policy_revision: int = 0
    default_mode: str = "static"
    sts_version: str | None = None
    cost_table_version: str | None = None
    epoch: int | None = None  # the switchback epoch and arm being served (None: no switchback)
    arm: str | None = None
    # CPU intra-op threads while prefilling (llama.cpp's threads-batch): a prompt batch has
    # thousands of rows, where a second core nearly halves the time, while decode steps have
    # tens to hundreds and keep torch's setting. None: prefill with torch's setting too.
    prefill_threads: int | None = None


Sink = Callable[[StepRecord], None]
RequestSink = Callable[[RequestRecord], None]


class Engine:
    def __init__(
        self,
        model: Transformer,
        drafter: Drafter,
        config: EngineConfig | None = None,
        *,
        policy: WindowPolicy | None = None,
        sink: Sink | None = None,
        request_sink: RequestSink | None = None,
        calibrate: Callable[[torch.Tensor], torch.Tensor] | None = None,
        mode_for: Callable[[Request], str] | None = None,
        tiers: TierGrid | None = None,
        graphs: bool = False,
        passes=draft_accepts,
    ):
        self.config = config or EngineConfig()
        self.model, self.drafter = model.eval(), drafter
        self.device = model.output.weight.device
        self.cache = KVCache(
            model.args, self.config.max_batch, self.config.cache_len, self.device, model.output.weight.dtype
        )
        grid = served_grid(tiers or TierGrid(), self.device.type, graphs)
        runner_graphs = self.schedule_graphs = None
        if graphs:
            from .cuda_graphs import GraphTiers, ScheduleGraphs

            runner_graphs = GraphTiers(model, self.cache, grid, self.config.gamma, self.config.max_batch)
            self.schedule_graphs = ScheduleGraphs(self.config.max_batch, self.config.gamma, self.device)
        self.runner = TargetRunner(model, self.cache, grid, runner_graphs)
        self.policy = policy or FixedWindow(self.config.gamma)
        self.sink, self.request_sink = sink, request_sink
        # Without STS the survival is the plain running product of raw confidences.
        self.calibrate = calibrate or (lambda conf: conf.cumprod(-1))
        if self.schedule_graphs is not None:
            self.schedule_graphs.prepare(self._schedule, (self.policy, self.calibrate), self._lag > 0)
        self.config.sts_version = self.config.sts_version or getattr(calibrate, "version", None)
        self.mode_for = mode_for or (lambda r: r.mode or self.config.default_mode)
        self.passes = passes
        self.queue: collections.deque[Request] = collections.deque()
        self.active: list[Request] = []
        self.finished: dict[str, Request] = {}
        self._live: set[str] = set()  # ids queued or running: one id per request the engine holds
        self.step_id = 0
        self.model_version = model_version(model)
        self._hardware = hardware_text(hardware_fingerprint(self.device))
        self._fingerprint: tuple[tuple[int, str | None], str] | None = None

    @property
    def contract(self) -> Contract:
        """The joint contract this engine's steps are measured under (read per step: ``config`` may change)."""
        return Contract(
            self.model_version, self.drafter.version, self.config.gamma, self.config.sts_version, self._hardware
        )

    def contract_fingerprint(self) -> str:
        """``contract.fingerprint()``, hashed again only when a part that can change (γ, STS) did."""
        key = (self.config.gamma, self.config.sts_version)
        if self._fingerprint is None or self._fingerprint[0] != key:
            self._fingerprint = (key, self.contract.fingerprint())
        return self._fingerprint[1]

    # -- admission -----------------------------------------------------------
    def submit(self, request: Request) -> None:
        """Queue ``request``, or raise ``ValueError`` naming what cannot be served (``admission``)."""
        check_request(request, self.model.args.vocab_size, self.cache.max_len, self.config.gamma, self._live)
        self._live.add(request.request_id)
        if request.arrival_ts is None:
            request.arrival_ts = time.time()
        request.epoch, request.arm = self.config.epoch, self.config.arm
        self.queue.append(request)

    def cancel(self, request_id: str) -> bool:
        """Stop a waiting or running request now: its cache slot and lagged survivals go with it, and its
        record (``finish_reason`` cancelled, the commits it had) is emitted. False when it is not here."""
        for request in self.queue:
            if request.request_id == request_id:
                self.queue.remove(request)
                self._finish(request, "cancelled")
                return True
        for request in self.active:
            if request.request_id == request_id:
                self.active.remove(request)
                self.cache.release(request.slot)
                request.past_survival = []
                self._finish(request, "cancelled")
                return True
        return False

    def _finish(self, request: Request, reason: str) -> None:
        self._live.discard(request.request_id)
        request.finish_reason, request.finish_ts = reason, time.time()
        self.finished[request.request_id] = request
        if self.request_sink is not None:
            self.request_sink(request_record(request, self.config, self.contract_fingerprint()))

    def _admit(self) -> None:
        admitted = []
        while self.queue and len(self.active) < self.config.max_batch and self.cache.free_slots:
            request = self.queue.popleft()
            request.slot = self.cache.alloc()
            request.history = list(request.prompt)
            admitted.append(request)
        if not admitted:
            return
        # The last prompt token stays pending: the first verify step writes its K/V.
        try:
            with _intra_op_threads(self.config.prefill_threads if self.device.type == "cpu" else None):
                hidden = self.runner.prefill(
                    [r.prompt[:-1] for r in admitted], [r.slot for r in admitted], keep=self.drafter.hidden_window
                )
        except BaseException:  # nothing half-admitted: the requests wait in the queue again, their slots free
            for request in reversed(admitted):
                self.cache.release(request.slot)
                request.slot = -1
                self.queue.appendleft(request)
            raise
        for request, h in zip(admitted, hidden):
            self._keep_hidden(request, h)
        self.active.extend(admitted)

    def _keep_hidden(self, request: Request, new: torch.Tensor) -> None:
        window = self.drafter.hidden_window
        if window:
            old = new[:0] if request.hidden is None else request.hidden
            request.hidden = torch.cat([old, new])[-window:]

    @property
    def _lag(self) -> int:
        """Steps a lagged policy decides behind (0: it reads this step's survivals); read each
        time, since a rollout may swap the policy."""
        return getattr(self.policy, "lag", 0)

    def _lagged(self, reqs: list[Request]) -> torch.Tensor | None:
        """Survivals from ``policy.lag`` steps ago (ones for requests younger than that)."""
        lag = self._lag
        if not lag:
            return None
        ones = torch.ones(self.config.gamma, device=self.device)
        return torch.stack([r.past_survival[0] if len(r.past_survival) == lag else ones for r in reqs])

    def _remember(self, reqs: list[Request], survival: torch.Tensor) -> None:
        lag = self._lag
        if lag:
            survival = survival.clone()  # a graph replay overwrites its output buffers next step
            for r, s in zip(reqs, survival):
                r.past_survival = (r.past_survival + [s])[-lag:]

    def _schedule(self, logits: torch.Tensor, lagged: torch.Tensor | None):
        """Confidence logits -> (confidences, calibrated survivals, the policy's decision): fixed shapes and
        no host syncs, so on CUDA the whole stage is one graph replay (``ScheduleGraphs``)."""
        confidence = torch.sigmoid(logits.float())
        survival = self.calibrate(confidence)
        return confidence, survival, self.policy(survival, WindowContext(logits.shape[0], logits.shape[1], lagged))

    def _draft_context(self, reqs: list[Request], positions, seeds, temps, sampled: bool) -> DraftContext:
        ctx = DraftContext([r.history for r in reqs], positions, seeds, temps, self.config.gamma, sampled=sampled)
        window = self.drafter.hidden_window
        if window:
            hidden = ctx.hidden = torch.zeros(
                len(reqs), window, self.model.args.dim, device=self.device, dtype=self.model.output.weight.dtype
            )
            lengths = []
            for i, r in enumerate(reqs):
                assert r.hidden is not None, "admission keeps every request's hidden states when the drafter reads them"
                n = r.hidden.shape[0]
                if n:
                    hidden[i, window - n :] = r.hidden
                lengths.append(n)
            ctx.hidden_len = torch.tensor(lengths, device=self.device)
        return ctx

    # -- one step ------------------------------------------------------------
    @torch.inference_mode()
    def step(self) -> StepRecord | None:
        self._admit()
        if not self.active:
            return None
        reqs, gamma, dev = self.active, self.config.gamma, self.device
        clock, cpu_start = StageClock(dev), time.process_time()
        syncs = 0
        positions = torch.tensor([self.cache.lengths[r.slot] for r in reqs], device=dev)
        seeds = torch.tensor([r.seed for r in reqs], device=dev)
        temps = torch.tensor([r.temperature for r in reqs], device=dev, dtype=torch.float32)
        sampled = any(r.temperature > 0 for r in reqs)  # on the host: greedy batches skip the sampler

        draft = self.drafter.propose(self._draft_context(reqs, positions, seeds, temps, sampled))
        clock.mark()

        logits, lagged = draft.confidence_logits.to(dev), self._lagged(reqs)
        if self.schedule_graphs is None:
            confidence, survival, decision = self._schedule(logits, lagged)
        else:
            confidence, survival, decision = self.schedule_graphs(
                self._schedule, (self.policy, self.calibrate), logits, lagged
            )
        self._remember(reqs, survival)
        modes = [self.mode_for(r) for r in reqs]
        verified, limit = verify_plan(mode_codes(modes, dev), decision.windows.to(dev), gamma)
        lens = (verified + 1).tolist()  # the row count sizes the step: one host read
        syncs += 1
        clock.mark()

        last = torch.tensor([r.history[-1] for r in reqs], device=dev)
        out = self.runner.verify(torch.cat([last[:, None], draft.tokens.to(dev)], 1), lens, [r.slot for r in reqs])
        clock.mark()

        depth = torch.arange(1, gamma + 2, device=dev)
        inputs = AcceptInput(
            p=temperature_probs(out.logits.float(), temps),
            q=draft.probs.to(dev).float(),
            drafts=draft.tokens.to(dev),
            verified=verified,
            limit=limit,
            greedy=temps <= 0,
            u_accept=uniform(seeds[:, None], positions[:, None] + depth[:-1], ACCEPT) if sampled else None,
            u_sample=uniform(seeds[:, None], positions[:, None] + depth, SAMPLE) if sampled else None,
        )
        result = accept(inputs, self.passes)
        accepted, full, nxt = (t.tolist() for t in (result.accepted, result.full, result.next_token))
        # Only a compact row verifying fewer than γ drafts can use its window up (verify_plan gives every other
        # row the full block): when none does, nobody reads the next draft's probability.
        next_prob = next_accept_prob(inputs).tolist() if min(lens) <= gamma else [None] * len(reqs)
        syncs += 1
        drafts = draft.tokens.tolist()
        clock.mark()

        committed_at, starts, committed = time.time(), [], []
        for i, r in enumerate(reqs):
            starts.append(len(r.history))  # where draft 1 and the first committed token go
            committed.append(drafts[i][: accepted[i]] + [nxt[i]])
            self.cache.commit(r.slot, accepted[i] + 1)
            self._keep_hidden(r, out.hidden[i, : accepted[i] + 1])
            r.history.extend(committed[i])
            r.output.extend(committed[i])
            r.commit_ts.append(committed_at)
            r.commit_len.append(len(r.output))
            r.first_mode = r.first_mode or modes[i]
            r.spans_epochs = r.spans_epochs or r.epoch != self.config.epoch
        outcome = StepOutcome(modes, decision.windows.tolist(), limit.tolist(), accepted, full, committed, drafts,
                              starts, confidence.tolist(), survival.tolist(), next_prob)  # fmt: skip
        rows = request_rows(reqs, outcome, gamma)
        self._retire()
        clock.mark()

        predict = getattr(self.policy, "table_step_ms", None)  # only a cost-aware policy serves a table
        costs = StepCosts(
            stage_ms=clock.durations_ms(),
            lens=lens,
            tier=out.tier,
            host_syncs=syncs if dev.type == "cuda" else 0,
            cpu_ms=(time.process_time() - cpu_start) * 1000,
            predicted_step_ms=_as_float(decision.predicted_step_ms),
            table_step_ms=None if predict is None else predict(len(reqs), sum(lens)),
        )
        versions = (self.model_version, self.drafter.version)
        record = step_record(self.config, self.step_id, time.time(), costs, rows, versions, self.contract_fingerprint())
        self.step_id += 1
        if self.sink is not None:
            self.sink(record)
        return record

    def _retire(self) -> None:
        still = []
        for r in self.active:
            # A step may commit past the limit: an EOS counts only among the tokens the request keeps.
            if r.stop_at_eos and EOS in r.output[: r.max_new_tokens]:
                del r.output[r.output.index(EOS) + 1 :]
                r.finish_reason = "eos"
            elif len(r.output) >= r.max_new_tokens:
                del r.output[r.max_new_tokens :]
                r.finish_reason = "length"
            if r.finish_reason:
                self.cache.release(r.slot)
                self._finish(r, r.finish_reason)
            else:
                still.append(r)
        self.active = still

    def run(self, max_steps: int | None = None) -> dict[str, list[int]]:
        """Step until every submitted request finished; returns outputs by request id."""
        steps = 0
        while (self.queue or self.active) and (max_steps is None or steps < max_steps):
            self.step()
            steps += 1
        return {rid: r.output for rid, r in self.finished.items()}


@contextlib.contextmanager
def _intra_op_threads(threads: int | None):
    before = torch.get_num_threads()
    if threads is None or threads == before:
        yield
        return
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _as_float(value) -> float | None:
    """Policies may return predictions as 0-d tensors (no host sync in the hot path)."""
    return None if value is None else float(value)
