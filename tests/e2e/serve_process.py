"""`loraplex serve` as a real process, for the tests that signal or kill it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from loraplex.platform.settings import Settings


def spawn_server(
    settings: Settings, model_dir: Path, port: int, **env: str
) -> subprocess.Popen[str]:
    """Start `loraplex serve --model` with `settings` passed through the environment."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("LORAPLEX_")}
    environment.update(
        {
            "LORAPLEX_DATA_DIR": str(settings.data_dir),
            "LORAPLEX_DATABASE_URL": settings.resolved_database_url,
            "LORAPLEX_JWT_SECRET": settings.hs256_secret(),
            "LORAPLEX_API_KEY_SECRET": settings.api_key_hash_secret().decode(),
            "LORAPLEX_DEVICE": "cpu",
            "LORAPLEX_MAX_MODEL_LEN": str(settings.max_model_len),
            "LORAPLEX_MAX_COMPLETION_TOKENS": str(settings.max_completion_tokens),
            "LORAPLEX_SHUTDOWN_GRACE_S": str(settings.shutdown_grace_s),
            **env,
        }
    )
    if settings.max_num_seqs is not None:
        environment["LORAPLEX_MAX_NUM_SEQS"] = str(settings.max_num_seqs)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    log = (settings.data_dir / "serve.log").open("a")
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from loraplex.platform.cli import main; raise SystemExit(main())",
            "serve",
            "--model",
            str(model_dir),
            "--port",
            str(port),
        ],
        env=environment,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )


def wait_ready(proc: subprocess.Popen[str], base_url: str, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        assert proc.poll() is None, "the server exited: see serve.log in its data dir"
        try:
            if httpx.get(f"{base_url}/ready", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "the server did not become ready"
        time.sleep(0.1)


def stop(proc: subprocess.Popen[str], settings: Settings) -> str:
    """Kill the process if it still runs; its output so far."""
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    return (settings.data_dir / "serve.log").read_text()
