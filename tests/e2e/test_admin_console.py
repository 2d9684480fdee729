"""The admin console in a real browser (Debian's Chromium through Playwright) against a real
server on a tiny random model: the operator's whole flow, every API error shown, keyboard use,
the CSP, and axe-core on every page. One server and one browser for the whole module."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from tests.e2e.browser import axe_violations, drop_files, launch, sign_in
from tests.e2e.live_server import LiveServer, serving
from tests.platform.platform_harness import make_settings
from tests.platform.upload_helpers import adapter_files

PAGES = ["dashboard", "tenants", "keys", "adapters", "usage", "audit"]
CHAT = {"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 6, "temperature": 0}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[LiveServer]:
    root = tmp_path_factory.mktemp("console")
    settings = make_settings(root / "data", tiny_model_dir, f"sqlite:///{root / 'registry.db'}")
    from loraplex.platform.db import upgrade

    upgrade(settings.resolved_database_url)
    with serving(settings, {}) as live:
        yield live


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        browser = launch(playwright)
        yield browser
        browser.close()


@pytest.fixture
def page(browser: Browser, server: LiveServer) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    yield page
    context.close()
    assert errors == [], errors  # no uncaught script error on any page


def admin_token(server: LiveServer) -> str:
    return server.app_state.tokens.issue_admin_token("browser-tests", 3600)


def chat(server: LiveServer, key: str, model: str) -> httpx.Response:
    return httpx.post(
        f"{server.base_url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={**CHAT, "model": model},
        timeout=60,
    )


def upload_in_console(page: Page, name: str, files: list[tuple[str, bytes]], version: int) -> None:
    page.get_by_label("Adapter name").fill(name)
    drop_files(page, ".dropzone", files)
    expect(page.locator(".dropzone .files li")).to_have_count(len(files))
    page.get_by_role("button", name="Upload", exact=True).click()
    expect(page.get_by_role("status").filter(has_text=f"{name}@v{version} is ready")).to_be_visible(
        timeout=60_000
    )


def test_the_operators_flow(
    page: Page, server: LiveServer, adapter_sources: dict[str, Path]
) -> None:
    base = server.base_url
    # Sign in: a bad token is refused in words; the good one opens the dashboard.
    page.goto(f"{base}/admin/")
    page.get_by_label("Admin token").fill("not-a-token")
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("alert")).to_contain_text("HTTP 401")
    sign_in(page, base, admin_token(server))
    assert "token" not in page.url
    expect(page.get_by_role("heading", name="Dashboard")).to_be_visible()

    # A tenant; the same name again is an API error shown to the user.
    page.get_by_role("link", name="Tenants").click()
    expect(page.get_by_role("heading", name="Tenants", level=1)).to_be_visible()
    form = page.locator("form", has=page.get_by_role("button", name="Create tenant"))
    form.get_by_label("Name").fill("acme")
    form.get_by_role("button", name="Create tenant").click()
    expect(page.get_by_role("status")).to_contain_text("Created tenant acme")
    form.get_by_role("button", name="Create tenant").click()
    expect(page.get_by_role("alert")).to_contain_text("already exists")
    row = page.get_by_role("row", name=re.compile("acme"))
    tenant_id = int(row.get_by_role("cell").first.inner_text())

    # A key, revealed once.
    row.get_by_role("link", name="Keys").click()
    page.get_by_label("Key name").fill("ci")
    page.get_by_role("button", name="Create key").click()
    dialog = page.get_by_role("dialog")
    expect(dialog).to_contain_text("you will not see it again")
    key = page.locator("#new-key").input_value()
    assert key.startswith("lpx-")
    dialog.get_by_role("button", name="I have stored it").click()
    expect(page.get_by_role("cell", name=f"{key[:12]}…")).to_be_visible()

    # An adapter by drag and drop: ready, and served to the key's calls.
    page.goto(f"{base}/admin/#/adapters?tenant={tenant_id}")
    upload_in_console(page, "support", adapter_files(adapter_sources["r4"]), 1)
    expect(page.get_by_role("cell", name="support@v1 latest: support")).to_be_visible()
    r = chat(server, key, "support")
    assert r.status_code == 200, r.text
    v1_text = r.json()["choices"][0]["message"]["content"]

    # Usage and the dashboard move.
    # Usage is written in batches: give the writer a flush, then refresh the page.
    page.wait_for_timeout(1000)
    page.get_by_role("link", name="Usage").click()
    expect(page.get_by_role("heading", name="Usage", level=1)).to_be_visible()
    page.get_by_role("radio", name="adapter").check()
    page.get_by_role("button", name="Refresh").click()
    expect(page.get_by_role("cell", name="support", exact=True)).to_be_visible(timeout=15_000)
    with page.expect_download() as download:
        page.get_by_role("button", name="Export CSV").click()
    csv = Path(download.value.path()).read_text()
    assert csv.startswith("Date (UTC),Tenant ID,Model,Requests") and ",support,1," in csv
    page.get_by_role("link", name="Dashboard").click()
    expect(page.get_by_role("heading", name="Dashboard", level=1)).to_be_visible()
    expect(page.locator("dd[aria-labelledby=s-req]")).not_to_have_text("0", timeout=10_000)

    # v2: the name follows it; v1 stays callable.
    page.goto(f"{base}/admin/#/adapters?tenant={tenant_id}")
    upload_in_console(page, "support", adapter_files(adapter_sources["r8"]), 2)
    expect(page.get_by_role("cell", name="support@v2 latest: support")).to_be_visible()
    v2_text = chat(server, key, "support@v2").json()["choices"][0]["message"]["content"]
    assert chat(server, key, "support").json()["choices"][0]["message"]["content"] == v2_text
    assert chat(server, key, "support@v1").json()["choices"][0]["message"]["content"] == v1_text
    assert v1_text != v2_text

    # Revoking the key: calls fail with 401.
    page.goto(f"{base}/admin/#/keys?tenant={tenant_id}")
    page.once("dialog", lambda d: d.accept())
    page.get_by_role("button", name=f"Revoke key {key[:12]}").click()
    expect(page.get_by_role("status")).to_contain_text("Revoked key")
    assert chat(server, key, "support").status_code == 401

    # The audit log: each change above, newest first, by this token's subject, with how it
    # ended; the refused duplicate tenant is there too; the filters narrow it server-side.
    page.get_by_role("link", name="Audit").click()
    expect(page.get_by_role("heading", name="Audit", level=1)).to_be_visible()
    rows = page.get_by_role("region", name="Audit log table").get_by_role("row")
    expect(rows).to_have_count(7)  # the header and six changes
    expect(rows.nth(1)).to_contain_text("key.revoke")
    expect(rows.nth(1)).to_contain_text("admin:browser-tests")
    expect(page.get_by_role("navigation", name="Pages")).to_contain_text("1–6 of 6")
    page.get_by_label("Result").select_option("failed")
    expect(rows).to_have_count(2)
    expect(rows.nth(1)).to_contain_text("tenant.create")
    expect(rows.nth(1)).to_contain_text("409 conflict")
    expect(rows.nth(1)).to_contain_text("already exists")
    page.get_by_role("button", name="Clear filters").click()
    page.get_by_label("Action").select_option("adapter.upload")
    expect(rows).to_have_count(3)
    expect(rows.nth(1)).to_contain_text("version: 2")
    page.get_by_label("Target ID").fill("999")
    expect(page.get_by_text("No events match these filters.")).to_be_visible()
    assert key not in page.content() and key[4:] not in page.content()


def test_validation_errors_are_shown_in_words(page: Page, server: LiveServer) -> None:
    sign_in(page, server.base_url, admin_token(server))
    tenant = httpx.post(
        f"{server.base_url}/admin/v1/tenants",
        headers={"Authorization": f"Bearer {admin_token(server)}"},
        json={"name": "errors"},
    ).json()
    page.goto(f"{server.base_url}/admin/#/adapters?tenant={tenant['id']}")
    page.get_by_label("Adapter name").fill("evil")
    drop_files(page, ".dropzone", [("adapter_config.json", b"{}"), ("adapter_model.bin", b"x")])
    page.get_by_role("button", name="Upload", exact=True).click()
    expect(page.get_by_role("alert")).to_contain_text("pickle files are refused")


def test_keyboard_reaches_the_file_chooser(page: Page, server: LiveServer) -> None:
    """The drop zone is a focusable button: Tab reaches it, Enter and Space open the file
    chooser (the hidden file input's click, which is what opens it)."""
    sign_in(page, server.base_url, admin_token(server))
    page.goto(f"{server.base_url}/admin/#/adapters")
    page.get_by_role("heading", name="Versions").wait_for()
    page.wait_for_load_state("networkidle")  # the tenant picker has settled
    page.evaluate(
        """() => {
            window.chooserOpened = 0;
            const input = document.getElementById("adapter-files");
            input.addEventListener("click", (e) => { e.preventDefault(); window.chooserOpened++; });
        }"""
    )
    page.get_by_label("Adapter name").focus()
    page.keyboard.press("Tab")
    assert "dropzone" in page.evaluate("() => document.activeElement.className")
    page.keyboard.press("Enter")
    page.keyboard.press("Space")
    assert page.evaluate("() => window.chooserOpened") == 2


def test_security_headers(server: LiveServer) -> None:
    r = httpx.get(f"{server.base_url}/admin/")
    assert r.status_code == 200
    csp = r.headers["content-security-policy"]
    assert (
        "script-src 'self'" in csp
        and "unsafe-inline" not in csp
        and "frame-ancestors 'none'" in csp
    )
    assert r.headers["x-content-type-options"] == "nosniff"
    assert not re.search(r"<script(?![^>]*\bsrc=)", r.text)  # no inline script
    assert httpx.get(f"{server.base_url}/admin", follow_redirects=False).status_code in (307, 308)


@pytest.mark.parametrize("width", [1280, 390])
def test_every_page_passes_axe(browser: Browser, server: LiveServer, width: int) -> None:
    context = browser.new_context(viewport={"width": width, "height": 900})
    page = context.new_page()
    try:
        page.goto(f"{server.base_url}/admin/")
        page.get_by_label("Admin token").wait_for()
        assert axe_violations(page) == [], "sign-in page"
        sign_in(page, server.base_url, admin_token(server))
        for route in PAGES:
            page.goto(f"{server.base_url}/admin/#/{route}")
            page.get_by_role("heading", level=1).wait_for()
            page.wait_for_load_state("networkidle")
            assert axe_violations(page) == [], route
            # Works narrow: nothing but scrollable tables is wider than the window.
            overflow = page.evaluate("() => document.documentElement.scrollWidth")
            assert overflow <= width + 1, (route, overflow)
        # The check can fail: an image without a text alternative is a critical violation.
        page.evaluate("() => document.body.append(Object.assign(new Image(), {src: 'data:,'}))")
        assert [v["id"] for v in axe_violations(page)] == ["image-alt"]
    finally:
        context.close()


def test_the_tenant_picker_says_when_it_shows_only_the_first_matches(
    page: Page, server: LiveServer
) -> None:
    """Last in the module: it leaves many tenants behind."""
    headers = {"Authorization": f"Bearer {admin_token(server)}"}
    for i in range(55):
        r = httpx.post(
            f"{server.base_url}/admin/v1/tenants", headers=headers, json={"name": f"bulk-{i:02d}"}
        )
        assert r.status_code == 201, r.text
    sign_in(page, server.base_url, admin_token(server))
    page.goto(f"{server.base_url}/admin/#/keys")
    more = page.locator(".picker-more")
    expect(more).to_contain_text(re.compile(r"first 50 of \d+: type to narrow"))
    page.get_by_label("Find tenant").fill("bulk-07")
    expect(page.get_by_label("Tenant", exact=True)).to_contain_text("bulk-07")
    expect(more).to_have_count(0)
