"""`loraplex serve` as a process, SIGTERM under load: streaming and non-streaming requests in
flight all finish, new work is refused (503, or the listener is already closed), usage is
flushed, and the process exits cleanly."""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import httpx
from sqlalchemy import select

from loraplex.platform.auth import TokenCodec
from loraplex.platform.db import Database, UsageRecord
from tests.e2e.live_server import free_port, seed_registry
from tests.e2e.serve_process import spawn_server, stop, wait_ready
from tests.platform.platform_harness import make_settings

MAX_TOKENS = 600


def test_sigterm_under_load_finishes_in_flight_then_exits(
    tmp_path: Path, tiny_model_dir: Path, adapter_sources: dict[str, Path]
) -> None:
    settings = make_settings(
        tmp_path / "data",
        tiny_model_dir,
        f"sqlite:///{tmp_path / 'registry.db'}",
        max_model_len=2048,
        max_completion_tokens=2000,
        # The six requests end in about 7 s on an idle 2-core machine, and in 50-60 s or more
        # when the CPU is shared with other work: the grace must outlast that.
        shutdown_grace_s=180,
    )
    keys = seed_registry(settings, tiny_model_dir, adapter_sources["r4"], {"acme": {}, "beta": {}})
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    proc = spawn_server(settings, tiny_model_dir, port)
    results: dict[str, object] = {}
    try:
        wait_ready(proc, base_url)
        started = threading.Barrier(7)

        def client(name: str, tenant: str, stream: bool) -> None:
            headers = {"Authorization": f"Bearer {keys[tenant]}"}
            body = {
                "model": "bot",
                "prompt": "Once",
                "max_tokens": MAX_TOKENS,
                "ignore_eos": True,
                "stream": stream,
            }
            with httpx.Client(base_url=base_url, timeout=120) as http:
                if not stream:
                    started.wait()
                    r = http.post("/v1/completions", headers=headers, json=body)
                    results[name] = (r.status_code, r.json()["usage"]["completion_tokens"])
                    return
                with http.stream("POST", "/v1/completions", headers=headers, json=body) as r:
                    lines = r.iter_lines()
                    first = next(lines)
                    started.wait()
                    results[name] = (r.status_code, [first, *(ln for ln in lines if ln)])

        threads = [
            threading.Thread(target=client, args=(f"{kind}{i}", tenant, kind == "stream"))
            for i, tenant in enumerate(("acme", "beta", "acme"))
            for kind in ("stream", "json")
        ]
        for thread in threads:
            thread.start()
        started.wait()  # every stream has its first token; the JSON requests are on their way
        admin = {"Authorization": f"Bearer {TokenCodec(settings).issue_admin_token('t', 60)}"}
        deadline = time.monotonic() + 30
        while (
            httpx.get(f"{base_url}/admin/v1/engine", headers=admin).json()["num_inflight_requests"]
            < 6
        ):
            assert time.monotonic() < deadline, "not all six requests are in flight"
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        try:  # new work is refused: the listener is closed, or the app answers 503
            r = httpx.post(
                f"{base_url}/v1/completions",
                headers={"Authorization": f"Bearer {keys['acme']}"},
                timeout=5,
                json={"model": "bot", "prompt": "x", "max_tokens": 1},
            )
            assert r.status_code == 503, r.text
        except httpx.TransportError:
            pass
        for thread in threads:
            thread.join(timeout=240)
        # uvicorn re-raises the signal once it has shut down gracefully (the usual convention).
        assert proc.wait(timeout=60) in (0, -signal.SIGTERM)
    finally:
        output = stop(proc, settings)
    assert "Shutting down" in output or "Finished server process" in output, output[-2000:]
    assert len(results) == 6, (results.keys(), output[-3000:])
    for name, (status, payload) in results.items():
        assert status == 200, (name, output[-3000:])
        if name.startswith("json"):
            assert payload == MAX_TOKENS, name
            continue
        assert isinstance(payload, list) and payload[-1] == "data: [DONE]", name
        assert not any('"error"' in line for line in payload), name
        text = "".join(
            json.loads(line.removeprefix("data: "))["choices"][0]["text"] for line in payload[:-1]
        )
        assert text, name
    db = Database(settings.resolved_database_url)
    with db.session() as session:
        rows = session.scalars(select(UsageRecord)).all()
    db.dispose()
    assert sorted((r.status, r.completion_tokens) for r in rows) == [("ok", MAX_TOKENS)] * 6
