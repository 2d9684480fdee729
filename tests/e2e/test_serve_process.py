"""`loraplex serve` as a process: SIGTERM with a stream in flight drains it, refuses new
work, flushes usage, and exits cleanly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
from sqlalchemy import select

from loraplex.platform.db import Database, UsageRecord
from tests.e2e.live_server import free_port, seed_registry
from tests.platform.platform_harness import make_settings


def test_sigterm_drains_streams_then_exits(
    tmp_path: Path, tiny_model_dir: Path, adapter_sources: dict[str, Path]
) -> None:
    settings = make_settings(
        tmp_path / "data",
        tiny_model_dir,
        f"sqlite:///{tmp_path / 'registry.db'}",
        max_model_len=2048,
        max_completion_tokens=2000,
        shutdown_grace_s=30,
    )
    key = seed_registry(settings, tiny_model_dir, adapter_sources["r4"], {"acme": {}})["acme"]
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LORAPLEX_")}
    env.update(
        {
            "LORAPLEX_DATA_DIR": str(settings.data_dir),
            "LORAPLEX_DATABASE_URL": settings.resolved_database_url,
            "LORAPLEX_JWT_SECRET": settings.hs256_secret(),
            "LORAPLEX_API_KEY_SECRET": settings.api_key_hash_secret().decode(),
            "LORAPLEX_DEVICE": "cpu",
            "LORAPLEX_MAX_MODEL_LEN": "2048",
            "LORAPLEX_MAX_COMPLETION_TOKENS": "2000",
            "LORAPLEX_SHUTDOWN_GRACE_S": "30",
        }
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from loraplex.platform.cli import main; raise SystemExit(main())",
            "serve",
            "--model",
            str(tiny_model_dir),
            "--port",
            str(port),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base_url = f"http://127.0.0.1:{port}"
    headers = {"Authorization": f"Bearer {key}"}
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, proc.communicate()[0]
            try:
                if httpx.get(f"{base_url}/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the server did not become ready"
            time.sleep(0.1)

        lines: list[str] = []
        first_chunk = threading.Event()

        def stream() -> None:
            body = {
                "model": "bot",
                "prompt": "Once",
                "max_tokens": 1500,
                "ignore_eos": True,
                "stream": True,
            }
            with httpx.stream(
                "POST", f"{base_url}/v1/completions", headers=headers, json=body, timeout=60
            ) as r:
                for line in r.iter_lines():
                    lines.append(line)
                    first_chunk.set()

        reader = threading.Thread(target=stream)
        reader.start()
        assert first_chunk.wait(30)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        try:  # new work is refused: the listener is closed, or the app answers 503
            r = httpx.post(
                f"{base_url}/v1/completions",
                headers=headers,
                timeout=5,
                json={"model": "bot", "prompt": "x", "max_tokens": 1},
            )
            assert r.status_code == 503, r.text
        except httpx.TransportError:
            pass
        reader.join(timeout=60)
        # uvicorn re-raises the signal once it has shut down gracefully (the usual convention).
        assert proc.wait(timeout=60) in (0, -signal.SIGTERM)
        output = proc.communicate()[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "Finished server process" in output or "Shutting down" in output, output[-2000:]
    lines = [line for line in lines if line]
    assert not any('"error"' in line for line in lines), (lines[:3], output[-3000:])
    assert lines[-1] == "data: [DONE]", lines[-3:]  # the stream in flight was finished
    db = Database(settings.resolved_database_url)
    with db.session() as session:
        rows = session.scalars(select(UsageRecord)).all()
    db.dispose()
    assert [(r.status, r.completion_tokens) for r in rows] == [("ok", 1500)]
