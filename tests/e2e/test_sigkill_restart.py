"""`loraplex serve` killed with SIGKILL under load, then restarted on the same registry: every
request whose client saw it complete has its usage row, with the tokens the client got; the
registry holds no row that points at nothing and the adapter store no file without its row;
the restarted server serves."""

from __future__ import annotations

import json
import random
import signal
import threading
import time
from pathlib import Path

import httpx
from sqlalchemy import select

from loraplex.platform.db import Adapter, ApiKey, Database, Tenant, UsageRecord
from loraplex.platform.storage import AdapterStore
from tests.e2e.live_server import free_port, seed_registry
from tests.e2e.serve_process import spawn_server, stop, wait_ready
from tests.platform.platform_harness import make_settings

Completed = dict[str, int]  # request id -> completion tokens the client received


def load(base_url: str, key: str, seed: int, until: threading.Event, done: Completed) -> None:
    """Requests back to back, streaming or not, until `until`; each one the client saw to its
    end goes into `done`."""
    rng = random.Random(seed)
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=base_url, timeout=30) as http:
        while not until.is_set():
            body = {
                "model": rng.choice(["bot", "tiny-llama"]),
                "prompt": "Once upon a time",
                "max_tokens": rng.randint(4, 120),
                "ignore_eos": True,
            }
            try:
                if rng.random() < 0.5:
                    r = http.post("/v1/completions", headers=headers, json=body)
                    if r.status_code == 200:
                        done[r.json()["id"]] = r.json()["usage"]["completion_tokens"]
                    continue
                stream_body = {**body, "stream": True, "stream_options": {"include_usage": True}}
                with http.stream("POST", "/v1/completions", headers=headers, json=stream_body) as r:
                    lines = [line for line in r.iter_lines() if line]
                if r.status_code == 200 and lines[-1] == "data: [DONE]":
                    usage = json.loads(lines[-2].removeprefix("data: "))
                    done[usage["id"]] = usage["usage"]["completion_tokens"]
            except httpx.HTTPError:
                return  # the server is gone


def admin_load(base_url: str, token: str, until: threading.Event) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=base_url, timeout=30) as http:
        i = 0
        while not until.is_set():
            try:
                r = http.post("/admin/v1/tenants", headers=headers, json={"name": f"t{i}"})
                if r.status_code == 201:
                    tenant_id = r.json()["id"]
                    http.post(f"/admin/v1/tenants/{tenant_id}/api-keys", headers=headers, json={})
                    if i % 2:
                        http.delete(f"/admin/v1/tenants/{tenant_id}", headers=headers)
            except httpx.HTTPError:
                return
            i += 1


def test_sigkill_under_load_then_restart(
    tmp_path: Path, tiny_model_dir: Path, adapter_sources: dict[str, Path]
) -> None:
    settings = make_settings(
        tmp_path / "data",
        tiny_model_dir,
        f"sqlite:///{tmp_path / 'registry.db'}",
        max_model_len=512,
        max_completion_tokens=200,
    )
    keys = seed_registry(settings, tiny_model_dir, adapter_sources["r4"], {"acme": {}, "beta": {}})
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    proc = spawn_server(settings, tiny_model_dir, port)
    done: Completed = {}
    stopping = threading.Event()
    try:
        wait_ready(proc, base_url)
        from loraplex.platform.auth import TokenCodec

        token = TokenCodec(settings).issue_admin_token("tests", 600)
        workers = [
            threading.Thread(target=load, args=(base_url, keys[t], i, stopping, done))
            for i, t in enumerate(["acme", "beta", "acme", "beta"])
        ]
        workers.append(threading.Thread(target=admin_load, args=(base_url, token, stopping)))
        for worker in workers:
            worker.start()
        deadline = time.monotonic() + 30
        while len(done) < 20:
            assert time.monotonic() < deadline and proc.poll() is None, "the load did not run"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)  # mid-load: requests in flight, rows being written
        proc.wait(timeout=10)
        stopping.set()
        for worker in workers:
            worker.join(timeout=30)
    finally:
        stopping.set()
        stop(proc, settings)
    seen = dict(done)  # what clients saw complete before the kill

    proc = spawn_server(settings, tiny_model_dir, port)
    try:
        wait_ready(proc, base_url)
        r = httpx.post(
            f"{base_url}/v1/completions",
            headers={"Authorization": f"Bearer {keys['acme']}"},
            json={"model": "bot", "prompt": "Once", "max_tokens": 3},
            timeout=30,
        )
        assert r.status_code == 200, r.text
    finally:
        output = stop(proc, settings)

    db = Database(settings.resolved_database_url)
    try:
        with db.session() as session:
            rows = {r.request_id: r for r in session.scalars(select(UsageRecord))}
            tenant_ids = set(session.scalars(select(Tenant.id)))
            key_ids = set(session.scalars(select(ApiKey.id)))
            adapters = list(session.scalars(select(Adapter)))
    finally:
        db.dispose()
    missing = [request_id for request_id in seen if request_id not in rows]
    assert not missing, (len(missing), len(seen), output[-2000:])
    assert all(rows[i].completion_tokens == n and rows[i].status == "ok" for i, n in seen.items())
    assert all(r.tenant_id in tenant_ids for r in rows.values())
    assert all(r.api_key_id is None or r.api_key_id in key_ids for r in rows.values())
    # Every registered adapter has its files, and every stored file its registration.
    store = AdapterStore(settings.resolved_adapter_dir)
    assert all(store.size_bytes(a.sha256) > 0 for a in adapters)
    stored = {p.name for p in settings.resolved_adapter_dir.glob("*/*") if p.is_dir()}
    assert stored == {a.sha256 for a in adapters}
    assert not list(settings.resolved_adapter_dir.glob(".staging-*"))
