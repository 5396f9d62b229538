"""``controller.service.listen``: serve binds every address its host resolves to, as uvicorn's own binding
does, before it opens anything."""

from __future__ import annotations

import errno
import socket

import pytest

from sparkgate.controller.service import PICK_TRIES, listen
from sparkgate.policies.errors import InputError


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


def _second_address_taken(monkeypatch, times: int) -> list[int]:
    """Two loopback addresses, the second refusing its first ``times`` binds as taken: which port the system
    picks cannot be steered, so this stands in for another process holding it there. Returns the ports the
    refused binds asked for."""
    addresses = [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, 0)) for a in ("127.0.0.1", "127.0.0.2")]
    monkeypatch.setattr(socket, "getaddrinfo", lambda *args, **kwargs: addresses)
    refused: list[int] = []

    class Taken(socket.socket):
        def bind(self, address):
            if address[0] == "127.0.0.2" and len(refused) < times:
                refused.append(address[1])
                raise OSError(errno.EADDRINUSE, "Address already in use")
            super().bind(address)

    monkeypatch.setattr(socket, "socket", Taken)
    return refused


def test_port_0_is_picked_again_when_the_first_pick_is_taken_on_another_address(monkeypatch):
    refused = _second_address_taken(monkeypatch, times=1)
    listening = listen("127.0.0.1", 0)
    try:
        assert [s.getsockname()[0] for s in listening] == ["127.0.0.1", "127.0.0.2"] and len(refused) == 1
        assert len({s.getsockname()[1] for s in listening}) == 1
    finally:
        close_all(listening)


def test_port_0_gives_up_after_its_tries_and_a_given_port_is_not_picked_again(monkeypatch):
    refused = _second_address_taken(monkeypatch, times=10**6)
    with pytest.raises(InputError, match=r"\(127\.0\.0\.2: Address already in use\)$"):
        listen("127.0.0.1", 0)
    assert len(refused) == PICK_TRIES
    with socket.create_server(("127.0.0.1", 0)) as held:
        port = held.getsockname()[1]
    refused.clear()
    with pytest.raises(InputError):
        listen("127.0.0.1", port)
    assert refused == [port]
