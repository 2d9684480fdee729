"""Debian's Chromium driven by Playwright (`playwright install` cannot download browsers here:
.ci/run installs the `chromium` package), plus axe-core and drag-and-drop helpers."""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, Playwright

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
REPO = Path(__file__).resolve().parents[2]
AXE_JS = REPO / "admin-ui" / "vendor" / "axe" / "axe.min.js"
BLOCKING_IMPACTS = ("serious", "critical")


def ensure_chromium() -> str:
    """Debian's Chromium, installed when missing (as .ci/run does); skipped outside CI when it
    cannot be had, a failure in CI."""
    if not Path(CHROMIUM).exists() and shutil.which("apt-get") and os.geteuid() == 0:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        install = ["apt-get", "install", "-y", "-q", "chromium"]
        if subprocess.run(install, env=env, check=False).returncode != 0:
            subprocess.run(["apt-get", "update", "-q"], env=env, check=False)
            subprocess.run(install, env=env, check=False)
    if not Path(CHROMIUM).exists():
        message = f"{CHROMIUM} is missing (apt-get install chromium)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return CHROMIUM


def launch(playwright: Playwright) -> Browser:
    return playwright.chromium.launch(
        executable_path=ensure_chromium(), headless=True, args=CHROMIUM_ARGS
    )


def sign_in(page: Page, base_url: str, token: str) -> None:
    page.goto(f"{base_url}/admin/")
    page.get_by_label("Admin token").fill(token)
    page.get_by_role("button", name="Sign in").click()
    page.get_by_role("navigation", name="Main").wait_for()


def drop_files(page: Page, selector: str, files: list[tuple[str, bytes]]) -> None:
    """Drop files on an element as a user dragging them from the desktop would."""
    payload = [{"name": n, "b64": base64.b64encode(d).decode()} for n, d in files]
    data_transfer = page.evaluate_handle(
        """(files) => {
            const dt = new DataTransfer();
            for (const f of files) {
                const bytes = Uint8Array.from(atob(f.b64), (c) => c.charCodeAt(0));
                dt.items.add(new File([bytes], f.name));
            }
            return dt;
        }""",
        payload,
    )
    page.dispatch_event(selector, "dragover", {"dataTransfer": data_transfer})
    page.dispatch_event(selector, "drop", {"dataTransfer": data_transfer})


def axe_violations(page: Page) -> list[dict[str, Any]]:
    """axe-core's serious and critical violations on the page as it is now."""
    if not page.evaluate("() => typeof window.axe !== 'undefined'"):
        page.evaluate(AXE_JS.read_text())  # through the debugger: the page's CSP is untouched
    result: dict[str, Any] = page.evaluate("async () => await window.axe.run(document)")
    return [
        {"id": v["id"], "impact": v["impact"], "nodes": [n["target"] for n in v["nodes"]][:5]}
        for v in result["violations"]
        if v["impact"] in BLOCKING_IMPACTS
    ]
