"""Every request is bound to its client: a disconnect before admission, while queued in the
engine, while running, streaming or not, ends the engine request at once (blocks, adapter pin
and concurrency slot back) and bills exactly the tokens the engine generated."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from loraplex.engine.stats import EngineStats
from loraplex.platform.ratelimit import TenantLimits
from tests.e2e.live_server import LiveServer, running_server
from tests.platform.platform_harness import make_settings

LONG = {"model": "bot", "prompt": "Once upon a time", "max_tokens": 1000, "ignore_eos": True}


@pytest.fixture
def server(
    tmp_path: Path, tiny_model_dir: Path, adapter_sources: dict[str, Path]
) -> Iterator[LiveServer]:
    settings = make_settings(
        tmp_path / "data",
        tiny_model_dir,
        f"sqlite:///{tmp_path / 'registry.db'}",
        max_model_len=1024,
        max_completion_tokens=1000,
        max_num_seqs=2,  # two running requests fill the engine: a third one queues
    )
    tenants: dict[str, dict[str, object]] = {"pair": {"max_concurrent_requests": 2}, "acme": {}}
    with running_server(settings, tiny_model_dir, adapter_sources["r4"], tenants) as live:
        yield live


def send_raw(server: LiveServer, tenant: str, body: dict[str, object]) -> socket.socket:
    """POST /v1/completions on a fresh socket; the caller closes it whenever it likes."""
    payload = json.dumps(body).encode()
    host, port = server.base_url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: loraplex\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {server.keys[tenant]}\r\n".encode()
        + f"Content-Length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    return sock


def wait_for(server: LiveServer, ready: object, timeout_s: float = 10) -> EngineStats:
    deadline = time.monotonic() + timeout_s
    while True:
        stats = server.app_state.engine.get_stats()
        if callable(ready) and ready(stats):
            return stats
        assert time.monotonic() < deadline, f"timed out: {stats}"
        time.sleep(0.005)


def assert_billed_what_was_generated(server: LiveServer) -> None:
    rows = server.usage_rows()
    generated = server.app_state.engine.get_stats().num_generated_tokens
    assert sum(r.completion_tokens for r in rows) == generated, [
        (r.status, r.completion_tokens) for r in rows
    ]


def assert_no_leases(server: LiveServer, tenant_id: int, max_concurrent: int) -> None:
    limits = TenantLimits(None, None, max_concurrent)
    decision = server.run(server.app_state.limiter.peek(str(tenant_id), limits))
    assert decision.concurrency is not None
    assert decision.concurrency.remaining == max_concurrent


@pytest.mark.parametrize("once_running", [False, True], ids=["at-once", "once-running"])
def test_ten_sockets_closed_right_after_sending(server: LiveServer, once_running: bool) -> None:
    """The issue's reproduction: a tenant limited to 2 concurrent requests never runs more,
    and 1 s after the clients are gone nothing of theirs runs. The sockets close at once
    (most requests end before admission), or once two of them run."""
    most_running = [0]
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.is_set():
            most_running[0] = max(most_running[0], server.app_state.engine.get_stats().num_running)
            time.sleep(0.001)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        sockets = [send_raw(server, "pair", {**LONG, "seed": i}) for i in range(10)]
        if once_running:
            wait_for(server, lambda s: s.num_running == 2)
        for sock in sockets:
            sock.close()
        closed_at = time.monotonic()
        stats = server.wait_until_idle(timeout_s=5)
        assert time.monotonic() - closed_at < 1.0, stats
    finally:
        sampling.set()
        sampler.join()
    assert most_running[0] <= 2
    rows = server.usage_rows()
    assert all(r.status == "aborted" and r.completion_tokens < 1000 for r in rows)
    assert len(rows) >= (2 if once_running else 0)
    assert_billed_what_was_generated(server)
    assert_no_leases(server, server.tenant_id("pair"), 2)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_disconnect_while_queued(server: LiveServer, stream: bool) -> None:
    """Two long requests fill the engine; a third, queued behind them, is dropped by its
    client before it ever ran: it leaves the queue at once, the others run on."""
    body = {**LONG, "stream": True}
    with httpx.Client(base_url=server.base_url, timeout=60) as http:
        headers = {"Authorization": f"Bearer {server.keys['acme']}"}
        with (
            http.stream("POST", "/v1/completions", headers=headers, json=body) as first,
            http.stream("POST", "/v1/completions", headers=headers, json=body) as second,
        ):
            assert first.status_code == second.status_code == 200
            wait_for(server, lambda s: s.num_running == 2)
            queued = send_raw(server, "pair", {**LONG, "stream": stream})
            wait_for(server, lambda s: s.num_waiting == 1)
            queued.close()
            closed_at = time.monotonic()
            stats = wait_for(server, lambda s: s.num_waiting == 0)
            assert time.monotonic() - closed_at < 1.0
            assert stats.num_running == 2  # the others were not disturbed
    server.wait_until_idle()
    rows = server.usage_rows()
    queued_rows = [r for r in rows if r.completion_tokens == 0]
    assert len(rows) == 3 and len(queued_rows) == 1 and queued_rows[0].status == "aborted"
    assert_billed_what_was_generated(server)
    assert_no_leases(server, server.tenant_id("pair"), 2)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_disconnect_while_running(server: LiveServer, stream: bool) -> None:
    queued = send_raw(server, "pair", {**LONG, "stream": stream})
    wait_for(server, lambda s: s.num_generated_tokens >= 5)
    queued.close()
    closed_at = time.monotonic()
    server.wait_until_idle(timeout_s=5)
    assert time.monotonic() - closed_at < 1.0
    rows = server.usage_rows()
    assert [r.status for r in rows] == ["aborted"]
    assert 5 <= rows[0].completion_tokens < 1000
    assert_billed_what_was_generated(server)
    assert_no_leases(server, server.tenant_id("pair"), 2)
