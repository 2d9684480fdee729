"""Writes one screenshot per admin console page to admin-ui/screenshots/ (`make screenshots`).

A real server on a tiny random model, seeded over the HTTP API the way an operator would
(tenants, keys, adapters uploaded as versions, a grant, some traffic), then Debian's Chromium at
1280 x 900. Keep the committed set current when the console changes.
"""

from __future__ import annotations

import tempfile
import threading
from pathlib import Path

import httpx
from playwright.sync_api import Page, sync_playwright

from loraplex.platform.db import upgrade
from loraplex.platform.demo.adapters import write_random_adapter
from loraplex.platform.demo.tiny_checkpoint import write_random_checkpoint
from tests.e2e.browser import REPO, launch, sign_in
from tests.e2e.live_server import LiveServer, serving
from tests.platform.platform_harness import make_settings
from tests.platform.upload_helpers import adapter_files

OUT = REPO / "admin-ui" / "screenshots"
PAGES = ["dashboard", "tenants", "keys", "adapters", "usage", "audit"]


def traffic(server: LiveServer, key: str, rounds: int) -> None:
    tenant = {"Authorization": f"Bearer {key}"}
    for i, model in enumerate(["support", "support@v1", "summarizer", "tiny-llama"] * rounds):
        httpx.post(
            f"{server.base_url}/v1/chat/completions",
            headers=tenant,
            json={"model": model, "messages": [{"role": "user", "content": f"Hi {i}"}],
                  "max_tokens": 12},
            timeout=60,
        )  # fmt: skip


def seed(server: LiveServer, adapters: dict[str, Path]) -> tuple[int, str]:
    """Tenants, keys, adapter versions, a grant and traffic; returns the main tenant's id and
    a key of it."""
    admin = {"Authorization": f"Bearer {server.app_state.tokens.issue_admin_token('shots', 600)}"}
    with httpx.Client(base_url=server.base_url, headers=admin, timeout=60) as c:
        ids = {}
        for name, fields in {
            "acme": {"priority": "interactive", "requests_per_minute": 1200},
            "globex": {},
            "initech": {"priority": "batch", "status": "suspended"},
        }.items():
            ids[name] = c.post("/admin/v1/tenants", json={"name": name, **fields}).json()["id"]
        c.post("/admin/v1/tenants", json={"name": "acme"})  # refused (409): the audit log shows it
        key = c.post(f"/admin/v1/tenants/{ids['acme']}/api-keys", json={"name": "prod"}).json()
        c.post(f"/admin/v1/tenants/{ids['acme']}/api-keys", json={"name": "ci"})
        for name, source in (("support", "r4"), ("support", "r8"), ("summarizer", "r4")):
            files = [("files", f) for f in adapter_files(adapters[source])]
            c.post("/admin/v1/adapters", data={"tenant_id": ids["acme"], "name": name}, files=files)
        support_v2 = next(
            a for a in c.get("/admin/v1/adapters").json()["data"] if a["version"] == 2
        )
        c.post(f"/admin/v1/adapters/{support_v2['id']}/grants", json={"tenant_id": ids["globex"]})
    traffic(server, key["key"], 3)
    return int(ids["acme"]), str(key["key"])


def shoot(page: Page, name: str) -> None:
    page.wait_for_load_state("networkidle")
    page.wait_for_timeout(600)  # charts draw after the data arrives
    page.screenshot(path=str(OUT / f"{name}.png"), full_page=True)
    print(f"wrote {OUT / name}.png")


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model = write_random_checkpoint(root / "tiny-llama", arch="llama")
        adapters = {
            "r4": write_random_adapter(model, root / "r4", rank=4, seed=1, b_std=0.5),
            "r8": write_random_adapter(
                model, root / "r8", rank=8, seed=2, b_std=0.5,
                target_modules=("q_proj", "k_proj", "v_proj", "o_proj"),
            ),
        }  # fmt: skip
        settings = make_settings(root / "data", model, f"sqlite:///{root / 'registry.db'}")
        upgrade(settings.resolved_database_url)
        with serving(settings, {}) as server, sync_playwright() as playwright:
            tenant_id, key = seed(server, adapters)
            browser = launch(playwright)
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(f"{server.base_url}/admin/")
            page.get_by_label("Admin token").wait_for()
            shoot(page, "signin")
            sign_in(page, server.base_url, server.app_state.tokens.issue_admin_token("shots", 600))
            for route in PAGES:
                query = f"?tenant={tenant_id}" if route in ("keys", "adapters") else ""
                page.goto(f"{server.base_url}/admin/#/{route}{query}")
                page.get_by_role("heading", level=1).wait_for()
                if route == "dashboard":  # a few polls under traffic: the charts move
                    sender = threading.Thread(target=traffic, args=(server, key, 12))
                    sender.start()
                    page.wait_for_timeout(6000)
                    sender.join()
                shoot(page, route)
            browser.close()


if __name__ == "__main__":
    main()
