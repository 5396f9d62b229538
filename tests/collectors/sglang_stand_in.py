"""An SGLang DSpark server as its own code answers, for contract tests: records and replies shaped as
upstream writes them, not as sparkgate would like them.

Read from sgl-project/sglang:
- ``python/sglang/srt/speculative/dspark_components/dspark_observability.py`` @
  0b79ccf242ea60667ef3533d2fe4e35ad8dd13aa: ``ReqDetail`` and ``DecodeStepRecord`` are msgspec Structs
  with ``omit_defaults=True``, dumped with ``msgspec.to_builtins``, so a field at its default is an
  absent key; ``rid``, ``confidence`` and ``survival`` default to None; ``dump()`` returns ``mode``,
  ``gamma``, ``verify_num_draft_tokens``, ``components`` and ``records``, and the wrapper adds
  ``simulate_acc_len`` (None when off). Records carry no timestamp. The buffer is a deque of at most
  200,000 records, returned whole by every dump; ``clear()`` empties it. ``num_verify_tokens`` and
  ``verify_tokens_graph_key`` are both the padded graph tier.
- ``python/sglang/srt/managers/tokenizer_communicator_mixin.py`` @
  40ef116f011cf1599811af1089ddf00971092bcf: ``set_internal_state`` answers
  ``[res.updated for res in responses]``, one boolean per DP rank; ``get_internal_state`` returns
  ``[res.internal_state for res in responses]``, and ``_Communicator.handle_recv`` appends each reply as it
  arrives, so the list is in arrival order, not rank order (each DP rank's scheduler pushes its reply on
  its own socket). No element names its rank: ``GetInternalStateReqOutput`` carries ``internal_state``
  alone, and ``dump()`` above has no rank field. ``arrival`` reorders the ranks per reply; ``rank_key``
  models a build whose ``dspark_info_record`` names its ``dp_rank`` (no upstream release does).
- ``python/sglang/srt/managers/scheduler_components/internal_state.py`` @
  2784deeea9dab0f20bcaaf1561734fbdfd7e1774: the accepted keys; any other key refuses the whole request
  (``updated=False``); ``dspark_force_budget_frac`` must be in (0, 1] or null, and is answered
  ``updated=True`` in every verify mode, though a static-mode server has no budget planner to apply it
  (``speculative/dspark_components/dspark_verify_planner.py`` @ 00f7df640f18605b5714a5cd8e2bde9087789e7a);
  a truthy ``dspark_clear_info_records`` clears the record buffer.
- ``python/sglang/srt/entrypoints/http_server.py`` @ 0025436eab0556737d615b36a4dd3e1e26e82f3d: that
  release serves the info at ``/get_server_info`` (later ones at ``/server_info``, the old path an alias),
  as ``{**dataclasses.asdict(server_args), **scheduler_info, "internal_states": ..., "version": ...}``:
  every launch argument is a top-level key.
- ``python/sglang/srt/server_args.py`` @ 001067ff: the launch arguments ``LAUNCH_ARGS`` holds (a subset,
  at their names; ``speculative_dspark_confidence_sts_path`` and ``speculative_dspark_sps_table_path``
  default to None).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from tests.collectors.loopback import QuietHandler, serving

# ``SGLANG_DSPARK_DEBUG_DUMP=all``; ``dump()`` lists them sorted. A record carries a timing only when its
# component is on, and leaves out (None) a step or GPU segment timed past 1 s (``_step_cpu_ms``,
# ``_segment_ms``) and the CPU time of the first decode after any other step (``_prev_stamp`` None).
ALL_COMPONENTS = sorted(["core", "step_cpu_time", "step_gpu_time", "draft_gpu_time", "target_verify_gpu_time", "reqs"])
REQ_DEFAULTS: dict[str, Any] = {"rid": None, "confidence": None, "survival": None}
RECORD_DEFAULTS: dict[str, Any] = {
    "bs": -1,
    "mode": "",
    "budget": None,
    "lag_steps": None,
    "num_running_reqs": -1,
    "num_verify_tokens": -1,
    "verify_tokens_local": -1,
    "verify_tokens_dp_synced": -1,
    "verify_tokens_graph_key": -1,
    "predicted_step_ms": None,
    "predicted_theta": None,
    "step_cpu_ms": None,
    "step_gpu_ms": None,
    "draft_gpu_ms": None,
    "target_verify_gpu_ms": None,
    "reqs": None,
}
LAUNCH_ARGS: dict[str, Any] = {
    "model_path": "meta-llama/Llama-3.1-8B-Instruct",
    "tokenizer_path": "meta-llama/Llama-3.1-8B-Instruct",
    "revision": None,
    "speculative_algorithm": "DSPARK",
    "speculative_draft_model_path": "org/dspark-drafter-8b",
    "speculative_draft_model_revision": None,
    "speculative_num_draft_tokens": 5,
    "speculative_dspark_block_size": 4,
    "speculative_dspark_confidence_sts_path": "/models/sts.json",
    "speculative_dspark_sps_table_path": "/models/sps.json",
    "device": "cuda",
    "tp_size": 1,
    "dp_size": 1,
}
SERVER_ARGS = {
    "pp_max_micro_batch_size",
    "speculative_accept_threshold_single",
    "speculative_accept_threshold_acc",
    "dspark_force_budget_frac",
    "dspark_clear_info_records",
}


def omit_defaults(fields: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """What ``msgspec.to_builtins`` writes for a Struct with ``omit_defaults=True``."""
    return {k: v for k, v in fields.items() if not (k in defaults and v == defaults[k])}


class Server:
    """A stateful SGLang server: ``push`` adds step records to a DP rank's buffer; the HTTP routes answer
    as upstream does. ``refuse`` lists server-args keys this build rejects (an older release)."""

    def __init__(self, ranks: int = 1, gamma: int = 4, mode: str = "compact", simulate_acc_len: float | None = None,
                 info_path: str = "/server_info", refuse: frozenset[str] = frozenset(), rank_key: bool = False,
                 arrival: Callable[[int], list[int]] | None = None,
                 components: list[str] = ALL_COMPONENTS):  # fmt: skip
        self.buffers: list[list[dict]] = [[] for _ in range(ranks)]
        self.components = sorted(components)  # pushed records should carry only these components' fields
        # The order of the ranks' replies in the n-th /server_info answer (default: rank order).
        self.arrival = arrival or (lambda n: list(range(ranks)))
        self.rank_key, self.replies = rank_key, 0
        self.gamma, self.mode, self.simulate_acc_len = gamma, mode, simulate_acc_len
        self.info_path, self.refuse = info_path, refuse
        self.server_args: dict[str, Any] = {}
        self.launch_args: dict[str, Any] = {**LAUNCH_ARGS, "dp_size": ranks}
        self.posted: list[dict] = []
        self.lock = threading.Lock()

    def push(self, rank: int, *records: dict) -> None:
        with self.lock:
            self.buffers[rank].extend(records)

    def info(self) -> dict[str, Any]:
        with self.lock:
            info = {"mode": self.mode, "gamma": self.gamma, "verify_num_draft_tokens": self.gamma + 1,
                    "components": self.components, "simulate_acc_len": self.simulate_acc_len}  # fmt: skip
            order, self.replies = self.arrival(self.replies), self.replies + 1
            states = [{"dspark_info_record": {**info, "records": list(self.buffers[r]),
                                              **({"dp_rank": r} if self.rank_key else {})}} for r in order]  # fmt: skip
            launch = dict(self.launch_args)
        return {**launch, "internal_states": states, "version": "0.5.0"}

    def set_internal_state(self, body: dict[str, Any]) -> tuple[int, Any]:
        args = body.get("server_args") or {}
        ok = all(key in SERVER_ARGS and key not in self.refuse for key in args)
        frac = args.get("dspark_force_budget_frac")
        if frac is not None and not 0.0 < float(frac) <= 1.0:
            ok = False
        with self.lock:
            self.posted.append(args)
            if ok:
                # Accepted in any mode, applied only where a budget planner exists: not in static mode
                # (dspark_verify_planner.py @ 00f7df640f18605b5714a5cd8e2bde9087789e7a).
                if "dspark_force_budget_frac" in args and self.mode != "static":
                    self.server_args["dspark_force_budget_frac"] = frac
                if args.get("dspark_clear_info_records"):
                    for buffer in self.buffers:
                        buffer.clear()
        return 200, [ok] * len(self.buffers)


@contextmanager
def running(server: Server) -> Iterator[str]:
    """Serve ``server`` on 127.0.0.1; yields its base URL."""

    class Handler(QuietHandler):
        def do_GET(self):
            if self.path == server.info_path:
                self.reply(json.dumps(server.info()).encode(), "application/json")
            else:
                self.reply(b'{"detail": "Not Found"}', "application/json", 404)

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
            if self.path != "/set_internal_state":
                self.reply(b'{"detail": "Not Found"}', "application/json", 404)
                return
            status, answer = server.set_internal_state(body)
            self.reply(json.dumps(answer).encode(), "application/json", status)

    with serving(Handler) as url:
        yield url
