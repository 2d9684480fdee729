"""Adapters uploaded over HTTP: served at once (greedy output equal to PEFT on the same
weights), versions (`name` follows the latest ready one, `name@vN` pins one, a request in flight
finishes on the version it started with), archives, the load check, deletion."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from loraplex.engine.errors import InvalidAdapterError
from loraplex.engine.request import LoRARequest
from loraplex.platform.services import adapter_check
from tests.engine.hf_reference import hf_greedy
from tests.platform.platform_harness import MAX_MODEL_LEN, Platform
from tests.platform.upload_helpers import (
    adapter_files,
    registered,
    store_entries,
    tar_gz_of,
    upload,
    zip_of,
)

PROMPT = [5, 17, 42, 99, 7, 3]
MAX_TOKENS = 8


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def complete(server: Platform, headers: dict[str, str], model: str, **body: Any) -> Any:
    return await server.client.post(
        "/v1/completions",
        headers=headers,
        json={"model": model, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0,
              "ignore_eos": True, **body},
    )  # fmt: skip


def peft_text(server: Platform, adapter_dir: Path) -> str:
    [ids] = hf_greedy(server.model_dir, [PROMPT], MAX_TOKENS, ["a"], {"a": adapter_dir})
    return server.state.engine.tokenizer.decode(ids)


async def test_upload_versions_and_delete(
    server: Platform, adapter_sources: dict[str, Path]
) -> None:
    tenant, headers = await server.tenant("acme")
    r = await upload(server, tenant["id"], "support", adapter_files(adapter_sources["r4"]))
    assert r.status_code == 201, r.text
    v1 = r.json()
    assert (v1["name"], v1["version"], v1["status"], v1["is_latest"]) == (
        "support",
        1,
        "ready",
        True,
    )
    assert v1["rank"] == 4 and v1["target_modules"] == ["q_proj", "v_proj"]
    assert v1["residency"] in ("gpu", "cpu")  # the load check loaded it
    assert v1["status_reason"] is None and len(v1["sha256"]) == 64 and v1["size_bytes"] > 0

    # Served at once, without a restart, exactly as PEFT computes it.
    r4_text = peft_text(server, adapter_sources["r4"])
    r = await complete(server, headers, "support")
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == r4_text

    # A second upload of the name is v2; the bare name follows it, v1 stays callable.
    r = await upload(server, tenant["id"], "support", adapter_files(adapter_sources["r8"]))
    assert r.status_code == 201 and r.json()["version"] == 2, r.text
    v2 = r.json()
    r8_text = peft_text(server, adapter_sources["r8"])
    assert r8_text != r4_text
    assert (await complete(server, headers, "support")).json()["choices"][0]["text"] == r8_text
    assert (await complete(server, headers, "support@v2")).json()["choices"][0]["text"] == r8_text
    assert (await complete(server, headers, "support@v1")).json()["choices"][0]["text"] == r4_text
    listed = {a["version"]: a for a in await registered(server)}
    assert not listed[1]["is_latest"] and listed[2]["is_latest"]
    models = (await server.client.get("/v1/models", headers=headers)).json()["data"]
    assert [m["id"] for m in models] == [server.model_name, "support"]

    # Deleting v1: support@v1 is gone, support still v2; deleting v2: support is gone too.
    admin = server.admin
    assert (
        await server.client.delete(f"/admin/v1/adapters/{v1['id']}", headers=admin)
    ).status_code == 204
    assert (await complete(server, headers, "support@v1")).status_code == 404
    assert (await complete(server, headers, "support")).json()["choices"][0]["text"] == r8_text
    assert (
        await server.client.delete(f"/admin/v1/adapters/{v2['id']}", headers=admin)
    ).status_code == 204
    r = await complete(server, headers, "support")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    assert store_entries(server) == set()  # the files went with the last version using them
    assert server.state.engine.engine.engine.list_loras() == []


async def test_a_request_in_flight_finishes_on_its_version(
    server: Platform, adapter_sources: dict[str, Path]
) -> None:
    tenant, headers = await server.tenant("acme")
    await upload(server, tenant["id"], "support", adapter_files(adapter_sources["r4"]))
    body = {"max_tokens": 48}
    v1_text = (await complete(server, headers, "support", **body)).json()["choices"][0]["text"]
    chunks: list[str] = []
    async with server.client.stream(
        "POST",
        "/v1/completions",
        headers=headers,
        json={"model": "support", "prompt": PROMPT, "temperature": 0, "ignore_eos": True,
              "stream": True, **body},
    ) as stream:  # fmt: skip
        lines = stream.aiter_lines()
        first = await anext(lines)
        chunks.append(first)
        # v2 arrives while the v1 request is running.
        r = await upload(server, tenant["id"], "support", adapter_files(adapter_sources["r8"]))
        assert r.status_code == 201 and r.json()["status"] == "ready"
        new = await complete(server, headers, "support", **body)
        chunks += [line async for line in lines]
    streamed = "".join(
        json.loads(line[6:])["choices"][0]["text"]
        for line in chunks
        if line.startswith("data: {") and json.loads(line[6:])["choices"]
    )
    assert streamed == v1_text  # finished on v1
    assert new.json()["choices"][0]["text"] != v1_text  # the next request got v2


async def test_archive_uploads(server: Platform, adapter_sources: dict[str, Path]) -> None:
    tenant = await server.create_tenant("acme")
    files = dict(adapter_files(adapter_sources["r4"]))
    zipped = zip_of(
        {f"my-adapter/{n}": d for n, d in files.items()} | {"my-adapter/README.md": b"hi"}
    )
    r = await upload(server, tenant["id"], "zipped", [("my-adapter.zip", zipped)])
    assert r.status_code == 201 and r.json()["status"] == "ready", r.text
    r2 = await upload(server, tenant["id"], "tarred", [("a.tar.gz", tar_gz_of(files))])
    assert r2.status_code == 201 and r2.json()["status"] == "ready", r2.text
    assert r.json()["sha256"] == r2.json()["sha256"]  # the same content, stored once
    assert len(store_entries(server)) == 1


async def test_an_adapter_failing_its_load_check_is_never_served(
    server: Platform, adapter_sources: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The validator catches what it can see in the files (NaN weights among them); the load
    check catches what only loading shows. A fault injected into the engine's load stands for
    the latter."""
    tenant, headers = await server.tenant("acme")

    def failing_load(lora_request: LoRARequest) -> None:
        raise InvalidAdapterError("injected: the weights could not be read")

    loader = server.state.engine.engine.engine.lora_manager.loader  # the in-process engine's
    with monkeypatch.context() as patch:
        patch.setattr(loader, "load", failing_load)
        r = await upload(server, tenant["id"], "broken", adapter_files(adapter_sources["r4"]))
    assert r.status_code == 201, r.text
    failed = r.json()
    assert failed["status"] == "failed" and "injected" in failed["status_reason"]
    assert not failed["is_latest"] and failed["residency"] == "disk"
    assert (await complete(server, headers, "broken")).status_code == 404
    assert (await complete(server, headers, "broken@v1")).status_code == 404
    # A good version of the name is v2 and is served.
    r = await upload(server, tenant["id"], "broken", adapter_files(adapter_sources["r4"]))
    assert r.json()["version"] == 2 and r.json()["status"] == "ready"
    assert (await complete(server, headers, "broken")).status_code == 200
    assert (await complete(server, headers, "broken@v1")).status_code == 404


async def test_a_load_check_cut_short_leaves_no_request_in_the_engine(
    server: Platform, adapter_sources: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A check past its time limit aborts its generation: nothing keeps running unseen."""
    tenant, _ = await server.tenant("acme")
    # A long generation (the context's worth) and a limit far shorter than it takes here.
    monkeypatch.setattr(adapter_check, "LOAD_CHECK_TOKENS", MAX_MODEL_LEN - 8)
    monkeypatch.setattr(adapter_check, "LOAD_CHECK_TIMEOUT_S", 0.05)
    r = await upload(server, tenant["id"], "slow", adapter_files(adapter_sources["r4"]))
    assert r.status_code == 201, r.text
    assert r.json()["status"] == "failed" and "did not finish" in r.json()["status_reason"]
    engine = server.state.engine
    assert engine.num_inflight == 0
    assert not engine.engine.engine.has_unfinished_requests()


async def test_new_versions_inherit_grants(
    server: Platform, adapter_sources: dict[str, Path]
) -> None:
    owner = await server.create_tenant("owner")
    _, guest = await server.tenant("guest")
    v1 = (await upload(server, owner["id"], "shared", adapter_files(adapter_sources["r4"]))).json()
    guest_id = (await server.client.get("/admin/v1/tenants?q=guest", headers=server.admin)).json()[
        "data"
    ][0]["id"]
    r = await server.client.post(
        f"/admin/v1/adapters/{v1['id']}/grants", headers=server.admin, json={"tenant_id": guest_id}
    )
    assert r.status_code == 201
    v2 = (await upload(server, owner["id"], "shared", adapter_files(adapter_sources["r8"]))).json()
    r = await server.client.get(f"/admin/v1/adapters/{v2['id']}/grants", headers=server.admin)
    assert [g["tenant_id"] for g in r.json()] == [guest_id]
    assert (await complete(server, guest, "owner/shared@v2")).status_code == 200
    assert (await complete(server, guest, "owner/shared")).status_code == 200


async def test_two_uploads_of_one_name_at_once(
    server: Platform, adapter_sources: dict[str, Path]
) -> None:
    tenant = await server.create_tenant("acme")
    files = adapter_files(adapter_sources["r4"])
    boundary = "b0undary"
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="tenant_id"\r\n\r\n{tenant["id"]}\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="name"\r\n\r\nbot\r\n'
    ).encode()
    config, weights = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="files"; filename="{n}"\r\n\r\n'.encode()
        + d
        + b"\r\n"
        for n, d in files
    )
    second_done = asyncio.Event()

    async def slow_body():  # type: ignore[no-untyped-def]
        yield head + config  # the fields have ended: the first upload holds the name
        await second_done.wait()
        yield weights + f"--{boundary}--\r\n".encode()

    first = asyncio.create_task(
        server.client.post(
            "/admin/v1/adapters",
            headers={**server.admin, "content-type": f"multipart/form-data; boundary={boundary}"},
            content=slow_body(),
        )
    )
    # The first upload's config file is being written: its fields came first, so it holds the
    # name by now.
    root = server.settings.resolved_adapter_dir
    for _ in range(600):
        if list(root.glob(".staging-*/adapter_config.json")):
            break
        await asyncio.sleep(0.05)
    second = await upload(server, tenant["id"], "bot", files)
    second_done.set()
    assert second.status_code == 409, second.text
    assert "already in progress" in second.json()["error"]["message"]
    r = await first
    assert r.status_code == 201 and r.json()["version"] == 1, r.text
    assert [a["version"] for a in await registered(server)] == [1]
    [stored] = store_entries(server)  # the winner's files only: no staging left behind
    assert stored.endswith(r.json()["sha256"])


async def test_truncated_and_oversized_bodies(
    server: Platform, adapter_sources: dict[str, Path]
) -> None:
    tenant = await server.create_tenant("acme")
    boundary = "xyz"
    cut = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="tenant_id"\r\n\r\n{tenant["id"]}\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="name"\r\n\r\nbot\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="files"; '
        f'filename="adapter_config.json"\r\n\r\n{{"r": 4'
    ).encode()
    content_type = {"content-type": f"multipart/form-data; boundary={boundary}"}
    r = await server.client.post(
        "/admin/v1/adapters", headers={**server.admin, **content_type}, content=cut
    )
    assert r.status_code == 400 and "cut short" in r.json()["error"]["message"]
    r = await server.client.post(
        "/admin/v1/adapters",
        headers={**server.admin, **content_type, "content-length": str(1 << 40)},
        content=cut,
    )
    assert r.status_code == 413
    r = await server.client.post("/admin/v1/adapters", headers=server.admin, json={"name": "x"})
    assert r.status_code == 400 and "multipart/form-data" in r.json()["error"]["message"]
    assert store_entries(server) == set() and await registered(server) == []
