"""The controller service over real HTTP on 127.0.0.1 with a real DuckDB file."""

from __future__ import annotations

import errno
import json
import socket

import httpx
import pytest

import sparkgate.controller.service as service_module
from sparkgate.collectors.aggregate import Aggregate
from sparkgate.collectors.ingest import Ingestor
from sparkgate.collectors.ingest_api import serve_in_thread
from sparkgate.collectors.labels import explode
from sparkgate.collectors.metrics import Metrics
from sparkgate.collectors.store import Store
from sparkgate.collectors.synth import synthetic_wire
from sparkgate.collectors.wire import flatten
from sparkgate.collectors.writers import Writer, Writers
from sparkgate.controller.service import PICK_TRIES, check_bind, create_app, listen
from sparkgate.controller.supervisor import Controller
from sparkgate.policies.errors import InputError
from sparkgate.policies.rollout import parse_rollout_policy
from tests.conftest import T0, Clock, with_columns

TOKEN = "s3cret-token"
POLICY = parse_rollout_policy(
    {
        "gates": [
            {"metric": "survival_ece", "threshold": 0.5, "direction": "at_most"},
            {"metric": "consistency_mismatches", "threshold": 0, "direction": "at_most", "critical": True},
        ]
    }
)


@pytest.fixture
def service(store):
    clock = Clock(T0 + 30)
    pushed = []
    controller = Controller(store, POLICY, metrics=Metrics(), actuators=[pushed.append], clock=clock, resamples=20)
    app = create_app(controller, Ingestor(store, controller.exporter.metrics), token=TOKEN)
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=30) as http:
        yield http, controller, clock, pushed


def ndjson(steps: int, first_step: int = 0, ts: float = T0 + 31, phase: str = "baseline") -> bytes:
    wire = with_columns(synthetic_wire(steps, 8, 7, "r0", first_step=first_step, seed=first_step, ts=ts), phase=phase)
    return b"".join(json.dumps(r).encode() + b"\n" for r in wire.to_pylist())


def operator(action: str, token: str | None = TOKEN, who: str = "alice") -> dict:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return {"url": f"/v1/rollout/{action}", "headers": headers, "json": {"operator": who, "note": "test"}}


def test_policy_records_status_and_decisions(service):
    http, controller, _, _ = service
    assert http.get("/healthz").json() == {"ok": True, "revision": 1}
    policy = http.get("/v1/policy").json()
    assert policy == {
        "revision": 1,
        "phase": "baseline",
        "compact_fraction": 0.0,
        "observe_fraction": 0.05,
        "fallback_window": 7,
        "gamma": 7,
        "cost_table_version": None,
        "cost_tables": {},
        "sts_version": None,
        "switchback": None,
    }
    response = http.post("/v1/records", content=ndjson(5), headers={"content-type": "application/x-ndjson"})
    assert response.status_code == 200 and response.json()["steps"] == 5
    bad = http.post("/v1/records", content=b'{"replica_id": 3}\n', headers={"content-type": "application/x-ndjson"})
    assert bad.status_code == 422 and bad.json()["quarantined"] == 1
    controller.tick()
    status = http.get("/v1/status").json()
    assert status["gates"][0]["gate"] == "baseline_reference" and status["passes"] == 1
    decisions = http.get("/v1/decisions", params={"limit": 10}).json()
    assert [d["action"] for d in decisions] == ["start", "hold"]
    report = http.get("/v1/report").json()
    assert report["tiers"]["steps"] == 5 and "survival" in report["calibration"]
    assert http.get("/v1/report", params={"since": T0 + 1, "until": T0}).status_code == 422


def test_operator_routes_need_the_bearer_token(service):
    http, controller, _, pushed = service
    assert http.post(**operator("promote", token=None)).status_code == 401
    assert http.post(**operator("promote", token="wrong")).status_code == 403
    assert controller.state.revision == 1
    promoted = http.post(**operator("promote"))
    assert promoted.status_code == 200 and promoted.json()["phase_to"] == "shadow"
    assert promoted.json()["operator"] == "alice"
    assert pushed[-1].phase == "shadow" and pushed[-1].revision == 2
    conflict = http.post(**operator("resume"))
    assert conflict.status_code == 409 and "only from fallback or paused" in conflict.json()["detail"]
    assert http.post(**operator("jump")).status_code == 422
    nobody = http.post("/v1/rollout/abort", headers=operator("abort")["headers"], json={"operator": ""})
    assert nobody.status_code == 422


def test_a_consistency_mismatch_rolls_back_at_the_next_evaluation(service):
    http, controller, clock, pushed = service
    for _ in range(3):
        http.post(**operator("promote"))
    assert controller.state.phase == "canary"
    # Steps from before the canary began: the window holds none, yet the critical failure stands.
    http.post("/v1/records", content=ndjson(50, ts=T0), headers={"content-type": "application/x-ndjson"})
    tokens = http.get("/v1/requests/req-3/committed").json()
    assert tokens["modes"] and len(tokens["tokens"]) >= 1
    assert http.get("/v1/requests/nope/committed").status_code == 404
    report = {
        "replica_id": "r0",
        "checks": [{"request_id": "req-3", "tokens": len(tokens["tokens"]), "mismatch_at": 2, "expected": 5, "got": 6}],
    }
    assert http.post("/v1/consistency", json=report).json() == {"recorded": 1, "stored": 1, "mismatches": 1}
    # A retry (the answer was lost) is not a second mismatch.
    assert http.post("/v1/consistency", json=report).json() == {"recorded": 1, "stored": 0, "mismatches": 1}
    assert controller.store.query("SELECT count(*) AS n FROM consistency_checks").column("n")[0].as_py() == 1
    clock.now += 60
    decision = controller.tick()
    assert (decision.action, decision.outcome, decision.phase_to) == ("rollback", "critical", "fallback")
    assert pushed[-1].phase == "fallback"
    metrics = http.get("/metrics").text
    assert 'sparkgate_rollout_phase{phase="fallback"} 1.0' in metrics
    assert 'sparkgate_gate_verdict{gate="consistency_mismatches"} 0.0' in metrics
    assert "sparkgate_ingested_steps_total 50.0" in metrics


def _aggregate(seed: int) -> Aggregate:
    flat = flatten(synthetic_wire(4, 8, 7, f"r{seed}", seed=seed))
    return Aggregate.from_tables(flat.requests, explode(flat), 7)


def test_replicas_report_aggregates_and_the_fleet_view_merges_them(service, store, tmp_path, monkeypatch):
    http, *_ = service
    parts = [_aggregate(seed) for seed in (1, 2)]
    for i, part in enumerate(parts):
        body = {"replica_id": f"r{i}", "interval_start": T0, "interval_end": T0 + 10, "aggregate": part.to_dict()}
        ok = http.post("/v1/aggregates", json=body)
        assert ok.status_code == 200 and ok.json() == {
            "recorded": 1,
            "duplicate": False,
            "labels": int(part.survival.count.sum()),
        }
    retry = http.post("/v1/aggregates", json=body)  # the last report again: counted once
    assert retry.status_code == 200 and retry.json()["duplicate"] is True
    fleet = http.get("/v1/fleet").json()
    merged = parts[0].merge(parts[1])
    assert fleet["reports"] == 2 and fleet["replicas"] == ["r0", "r1"]
    assert fleet["calibration"]["survival"]["3"]["ece"] == pytest.approx(merged.survival.ece()[3])
    assert fleet["utilization"]["upper_bound"] == pytest.approx(merged.upper_bound_utilization())
    assert http.get("/v1/fleet", params={"since": T0 + 5}).json() == {"reports": 0, "replicas": []}
    assert http.get("/v1/fleet", params={"since": T0 + 5, "until": T0}).status_code == 422
    with monkeypatch.context() as patch:  # a span too large to merge in one answer is refused, not slow
        patch.setattr(service_module, "MAX_FLEET_REPORTS", 1)
        too_many = http.get("/v1/fleet")
        assert too_many.status_code == 422 and "2 aggregate reports" in too_many.json()["detail"]
        assert http.get("/v1/fleet", params={"since": T0 + 10, "until": T0 + 10}).json()["reports"] == 0

    # Another interval of r1 sharing [T0+5, T0+10) would count those labels twice: refused, nothing written.
    overlap = http.post("/v1/aggregates", json={**body, "interval_start": T0 + 5, "interval_end": T0 + 20})
    assert overlap.status_code == 409 and overlap.json()["stored_interval"] == [T0, T0 + 10]
    assert "'r1'" in overlap.json()["detail"] and len(store.aggregates()) == 2
    # Intervals are half-open: the next one starts where the last ended.
    adjacent = http.post("/v1/aggregates", json={**body, "interval_start": T0 + 10, "interval_end": T0 + 20})
    assert adjacent.status_code == 200 and adjacent.json()["duplicate"] is False

    # Every problem is named and nothing is written.
    bad = parts[0].to_dict()
    bad["survival.count"] = [[[-1]]]
    del bad["full_hist"]
    refused = http.post(
        "/v1/aggregates", json={"replica_id": "r9", "interval_start": T0 + 5, "interval_end": T0, "aggregate": bad}
    )
    assert refused.status_code == 422
    fields = [p["field"] for p in refused.json()["problems"]]
    assert fields == ["interval_end", "full_hist"]
    worse = {**parts[0].to_dict(), "survival.sum_y": (parts[0].survival.count + 1).tolist()}
    assert (
        http.post(
            "/v1/aggregates", json={"replica_id": "r9", "interval_start": T0, "interval_end": T0, "aggregate": worse}
        ).json()["problems"][0]["field"]
        == "survival.sum_y"
    )
    # Counts that would wrap int64 (alone, or summed over a report) and huge or non-numeric JSON numbers.
    for field, value in [
        ("accept_hist", 1e19),
        ("survival.count", 4 * 10**18),
        ("full_hist", 10**400),
        ("suggest_hist", "3"),
        ("conditional.count", True),
    ]:
        odd = parts[0].to_dict()
        odd[field][0][1][0] = value
        refused = http.post(
            "/v1/aggregates", json={"replica_id": "r9", "interval_start": T0, "interval_end": T0, "aggregate": odd}
        )
        assert refused.status_code == 422 and refused.json()["problems"][0]["field"] == field, (field, refused.text)
    assert store.counts()["quarantine"] == 0 and len(store.aggregates()) == 3

    # Acknowledged reports are durable: a reopened store still holds them.
    path = store.path
    store.close()
    with Store(path) as again:
        assert [r for r, _ in again.aggregates()] == ["r0", "r1", "r1"]


def test_openapi_spec_is_published(service):
    http, *_ = service
    spec = http.get("/openapi.json").json()
    assert {
        "/v1/policy",
        "/v1/records",
        "/v1/status",
        "/v1/decisions",
        "/v1/consistency",
        "/metrics",
        "/healthz",
        "/v1/rollout/{action}",
        "/v1/aggregates",
        "/v1/fleet",
    } <= spec["paths"].keys()
    assert "application/x-ndjson" in spec["paths"]["/v1/records"]["post"]["requestBody"]["content"]


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost"])
def test_loopback_binds_need_no_token(host):
    check_bind(host, None)


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "example.org"])
def test_non_loopback_binds_are_refused_without_an_operator_token_and_writer_credentials(host):
    with pytest.raises(ValueError, match="needs an operator token"):
        check_bind(host, None)
    with pytest.raises(ValueError, match="needs writer credentials"):
        check_bind(host, TOKEN)  # records and checks steer the gates as surely as operator actions do
    check_bind(host, TOKEN, Writers([Writer("fleet", "w-secret")]))


def has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


needs_ipv6 = pytest.mark.skipif(not has_ipv6_loopback(), reason="no IPv6 loopback here")


def close_all(sockets: list[socket.socket]) -> None:
    for sock in sockets:
        sock.close()


def test_listen_on_an_ipv4_address_is_one_ipv4_socket():
    (sock,) = listening = listen("127.0.0.1", 0)
    try:
        assert sock.family == socket.AF_INET and sock.getsockname()[0] == "127.0.0.1"
        socket.create_connection(sock.getsockname(), timeout=5).close()  # it listens
    finally:
        close_all(listening)


@needs_ipv6
@pytest.mark.parametrize("host", ["::1", "::"])
def test_listen_on_an_ipv6_address_is_ipv6_only(host):
    (sock,) = listening = listen(host, 0)
    try:
        assert sock.family == socket.AF_INET6
        assert sock.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY) == 1  # "::" takes no IPv4 as well
    finally:
        close_all(listening)


def test_listen_on_a_name_binds_every_address_it_resolves_to_on_one_port():
    listening = listen("localhost", 0)
    try:
        resolved = socket.getaddrinfo("localhost", 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        assert sorted((s.family, s.getsockname()[0]) for s in listening) == sorted({(f, a[0]) for f, *_, a in resolved})
        assert len({s.getsockname()[1] for s in listening}) == 1
    finally:
        close_all(listening)


@needs_ipv6
def test_a_name_listed_for_both_families_shares_the_port_the_system_picked(monkeypatch):
    # localhost as /etc/hosts lists it on many machines (here it may list 127.0.0.1 alone), one line twice.
    both = [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", 0))] * 2 + [
        (socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("::1", 0, 0, 0))
    ]
    monkeypatch.setattr(socket, "getaddrinfo", lambda *args, **kwargs: both)
    listening = listen("localhost", 0)
    try:
        assert [s.family for s in listening] == [socket.AF_INET, socket.AF_INET6]
        (port,) = {s.getsockname()[1] for s in listening}
        for family, address in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
            with socket.socket(family) as client:  # not create_connection: it resolves through the stub
                client.connect((address, port))
    finally:
        close_all(listening)


def test_listen_names_an_address_in_use_and_a_name_that_does_not_resolve():
    with socket.create_server(("127.0.0.1", 0)) as held:
        port = held.getsockname()[1]
        with pytest.raises(InputError) as in_use:
            listen("127.0.0.1", port)
    assert str(in_use.value) == f"--host/--port 127.0.0.1:{port}: cannot listen there (Address already in use)"
    with pytest.raises(InputError, match=r"^--host/--port no-such-host\.invalid:8470: cannot listen there \(.+\)$"):
        listen("no-such-host.invalid", 8470)


def test_a_failed_listen_closes_the_sockets_it_opened(monkeypatch):
    opened = []

    class Recorded(socket.socket):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            opened.append(self)

    # The first address binds; the second (TEST-NET-1) is no address of this machine's.
    addresses = [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, 0)) for a in ("127.0.0.1", "192.0.2.1")]
    monkeypatch.setattr(socket, "getaddrinfo", lambda *args, **kwargs: addresses)
    monkeypatch.setattr(socket, "socket", Recorded)
    with pytest.raises(InputError, match=r"^--host/--port 127\.0\.0\.1:0: cannot listen there \(192\.0\.2\.1: "):
        listen("127.0.0.1", 0)
    assert len(opened) == 2 and [s.fileno() for s in opened] == [-1, -1]


# 63 is no address family this kernel has: socket() fails with EAFNOSUPPORT, as AF_INET6 does with IPv6 off.
NO_SUCH_FAMILY = 63


def test_listen_skips_a_family_the_kernel_cannot_open_as_asyncio_does(monkeypatch):
    addresses = [
        (NO_SUCH_FAMILY, socket.SOCK_STREAM, 6, "", ("::1", 0, 0, 0)),
        (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", 0)),
    ]
    monkeypatch.setattr(socket, "getaddrinfo", lambda *args, **kwargs: addresses)
    (sock,) = listening = listen("localhost", 0)
    try:
        assert sock.family == socket.AF_INET
    finally:
        close_all(listening)
    monkeypatch.setattr(socket, "getaddrinfo", lambda *args, **kwargs: addresses[:1])
    with pytest.raises(
        InputError, match=r"^--host/--port localhost:0: cannot listen there \(::1: no address of a family"
    ):
        listen("localhost", 0)


def test_port_0_is_picked_again_when_the_first_pick_is_taken_on_another_address(monkeypatch):
    # Which port the system picks cannot be steered, so the second address refuses the first pick once (a
    # stand-in for another process holding it there); both addresses are this machine's loopback.
    addresses = [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, 0)) for a in ("127.0.0.1", "127.0.0.2")]
    monkeypatch.setattr(socket, "getaddrinfo", lambda *args, **kwargs: addresses)
    refused = []

    class TakenOnce(socket.socket):
        def bind(self, address):
            if address[0] == "127.0.0.2" and not refused:
                refused.append(address[1])
                raise OSError(errno.EADDRINUSE, "Address already in use")
            super().bind(address)

    monkeypatch.setattr(socket, "socket", TakenOnce)
    listening = listen("127.0.0.1", 0)
    try:
        assert [s.getsockname()[0] for s in listening] == ["127.0.0.1", "127.0.0.2"] and len(refused) == 1
        assert len({s.getsockname()[1] for s in listening}) == 1
    finally:
        close_all(listening)


def test_port_0_gives_up_after_its_tries_and_a_given_port_is_not_picked_again(monkeypatch):
    addresses = [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, 0)) for a in ("127.0.0.1", "127.0.0.2")]
    monkeypatch.setattr(socket, "getaddrinfo", lambda *args, **kwargs: addresses)
    tries = []

    class AlwaysTaken(socket.socket):
        def bind(self, address):
            if address[0] == "127.0.0.2":
                tries.append(address[1])
                raise OSError(errno.EADDRINUSE, "Address already in use")
            super().bind(address)

    monkeypatch.setattr(socket, "socket", AlwaysTaken)
    with pytest.raises(InputError, match=r"\(127\.0\.0\.2: Address already in use\)$"):
        listen("127.0.0.1", 0)
    assert len(tries) == PICK_TRIES
    with socket.create_server(("127.0.0.1", 0)) as held:
        port = held.getsockname()[1]
    tries.clear()
    with pytest.raises(InputError):
        listen("127.0.0.1", port)
    assert tries == [port]


@pytest.mark.parametrize(
    "path, body, loc, echoed",
    [
        ("/v1/aggregates", '{"replica_id": "r", "interval_start": NaN, "interval_end": 1, "aggregate": {}}',
         ["body", "interval_start"], "nan"),
        ("/v1/aggregates", '{"replica_id": "r", "interval_start": 0, "interval_end": 1e400, "aggregate": {}}',
         ["body", "interval_end"], "inf"),
        ("/v1/consistency", '{"replica_id": "r", "checks": [{"request_id": "a", "tokens": NaN}]}',
         ["body", "checks", 0, "tokens"], "nan"),
    ],
)  # fmt: skip
def test_a_non_finite_number_gets_a_422_naming_it_and_the_connection_lives_on(service, path, body, loc, echoed):
    http, controller, _, _ = service
    response = http.post(path, content=body, headers={"content-type": "application/json"})
    assert response.status_code == 422
    (error,) = response.json()["detail"]
    assert error["loc"] == loc and error["input"] == echoed
    assert http.get("/healthz").status_code == 200  # the same keep-alive client still works
    assert controller.store.query("SELECT count(*) AS n FROM consistency_checks").column("n")[0].as_py() == 0
