"""Load benchmark for a running Loraplex server: open-loop Poisson arrivals of streaming requests.

Requests arrive at `--rate` per second (exponential gaps, seeded) whether or not earlier ones
have finished, as real traffic does; each streams its completion over SSE. Reports throughput
(requests/s, output tokens/s), TTFT, inter-token latency and end-to-end latency percentiles,
and how many requests got 429. Localhost only, bounded in count and time.

    python bench/serve_load.py --base-url http://127.0.0.1:8000 --api-key lpx-... \\
        --num-requests 64 --rate 4 --max-tokens 32 --json bench/results/cpu.json
    python bench/serve_load.py --spawn --num-requests 32 --rate 2      # starts `serve --demo`

Without `--model`, the models of GET /v1/models (base model and adapters) are used at random.
TTFT: send -> first non-empty content chunk. Inter-token latency: gaps between content chunks
(a chunk may carry more than one token, as in vLLM's benchmark). Output tokens come from the
final usage chunk (`stream_options.include_usage`), else from the number of content chunks.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx

MAX_REQUESTS = 10_000
MAX_DURATION_S = 3600.0
LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}
API_KEY_RE = re.compile(r"lpx-[A-Za-z0-9_-]{43}")
_TEXT = (
    "the model serves many tenants with their own adapters batched together in one step while "
    "the scheduler keeps every request moving through a paged cache of keys and values"
)
WORDS = tuple(_TEXT.split(" "))


@dataclass
class RequestResult:
    model: str
    start_s: float  # offset from the benchmark start
    status: int = 0  # HTTP status; 0 = transport error
    error: str | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    retry_after: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None


def percentiles(values: Sequence[float], qs: Sequence[int] = (50, 90, 99)) -> dict[str, float]:
    """Linear-interpolated percentiles (numpy's default) plus the mean; {} when empty."""
    if not values:
        return {}
    xs = sorted(values)
    out: dict[str, float] = {"mean": sum(xs) / len(xs)}
    for q in qs:
        pos = (len(xs) - 1) * q / 100
        lo, hi = math.floor(pos), math.ceil(pos)
        out[f"p{q}"] = xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)
    return out


def make_prompt(rng: random.Random, num_words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(num_words))


def arrival_offsets(rng: random.Random, rate: float, num: int, duration_s: float) -> list[float]:
    """Poisson process: exponential gaps of mean 1/rate, until `num` or `duration_s`."""
    offsets, t = [], 0.0
    for i in range(num):
        if i > 0 and math.isfinite(rate):
            t += rng.expovariate(rate)
        if t > duration_s:
            break
        offsets.append(t)
    return offsets


def build_body(args: argparse.Namespace, model: str, prompt: str) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if args.ignore_eos:
        body["ignore_eos"] = True
    if args.endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return body


async def one_request(
    client: httpx.AsyncClient, args: argparse.Namespace, model: str, prompt: str, t0: float
) -> RequestResult:
    path = "/v1/chat/completions" if args.endpoint == "chat" else "/v1/completions"
    sent = time.perf_counter()
    result = RequestResult(model=model, start_s=sent - t0)
    last: float | None = None
    num_chunks = 0
    try:
        async with client.stream("POST", path, json=build_body(args, model, prompt)) as resp:
            result.status = resp.status_code
            if resp.status_code != 200:
                result.retry_after = resp.headers.get("retry-after")
                result.error = (await resp.aread()).decode(errors="replace")[:300]
                return result
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    break
                chunk = json.loads(payload)
                if "error" in chunk:
                    result.error = json.dumps(chunk["error"])[:300]
                    break
                if chunk.get("usage"):
                    result.prompt_tokens = int(chunk["usage"].get("prompt_tokens") or 0)
                    result.completion_tokens = int(chunk["usage"].get("completion_tokens") or 0)
                if _chunk_text(chunk):
                    now = time.perf_counter()
                    num_chunks += 1
                    if last is None:
                        result.ttft_s = now - sent
                    else:
                        result.itl_s.append(now - last)
                    last = now
        result.e2e_s = time.perf_counter() - sent
        if result.completion_tokens == 0:
            result.completion_tokens = num_chunks
    except (httpx.HTTPError, json.JSONDecodeError, ValueError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"[:300]
    return result


def _chunk_text(chunk: dict[str, Any]) -> str:
    choices = chunk.get("choices") or []
    if not choices:
        return ""
    choice = choices[0]
    if "delta" in choice:
        return str(choice["delta"].get("content") or "")
    return str(choice.get("text") or "")


async def list_models(client: httpx.AsyncClient) -> list[str]:
    resp = await client.get("/v1/models")
    resp.raise_for_status()
    return [m["id"] for m in resp.json()["data"]]


async def run_load(args: argparse.Namespace, base_url: str, api_key: str) -> dict[str, Any]:
    rng = random.Random(args.seed)
    timeout = httpx.Timeout(args.request_timeout, connect=10.0)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    headers = {"Authorization": f"Bearer {api_key}"}
    async with httpx.AsyncClient(
        base_url=base_url, headers=headers, timeout=timeout, limits=limits
    ) as client:
        models = args.model or await list_models(client)
        if not models:
            raise SystemExit("no models to benchmark")
        for i in range(args.warmup):  # not measured: first-use loads, compilation, caches
            await one_request(client, args, models[i % len(models)], make_prompt(rng, 8), 0.0)
        offsets = arrival_offsets(rng, args.rate, args.num_requests, args.duration)
        plan = [(rng.choice(models), make_prompt(rng, args.prompt_words)) for _ in offsets]
        gate = asyncio.Semaphore(args.max_concurrency) if args.max_concurrency else None

        async def fire(model: str, prompt: str) -> RequestResult:
            if gate is None:
                return await one_request(client, args, model, prompt, t0)
            async with gate:
                return await one_request(client, args, model, prompt, t0)

        t0 = time.perf_counter()
        tasks = []
        for offset, (model, prompt) in zip(offsets, plan, strict=True):
            delay = t0 + offset - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(fire(model, prompt)))
        results = list(await asyncio.gather(*tasks))
        wall = time.perf_counter() - t0
    return summarize(args, base_url, models, results, wall)


def summarize(
    args: argparse.Namespace,
    base_url: str,
    models: list[str],
    results: list[RequestResult],
    wall_s: float,
) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    output_tokens = sum(r.completion_tokens for r in ok)
    prompt_tokens = sum(r.prompt_tokens for r in ok)
    config = {k: v for k, v in vars(args).items() if k not in ("api_key", "json")}
    summary = {
        "num_requests": len(results),
        "num_ok": len(ok),
        "num_429": sum(r.status == 429 for r in results),
        "num_errors": sum(not r.ok and r.status != 429 for r in results),
        "wall_s": wall_s,
        "requests_per_s": len(ok) / wall_s if wall_s > 0 else 0.0,
        "output_tokens_per_s": output_tokens / wall_s if wall_s > 0 else 0.0,
        "prompt_tokens_per_s": prompt_tokens / wall_s if wall_s > 0 else 0.0,
        "output_tokens": output_tokens,
        "prompt_tokens": prompt_tokens,
        "ttft_s": percentiles([r.ttft_s for r in ok if r.ttft_s is not None]),
        "itl_s": percentiles([gap for r in ok for gap in r.itl_s]),
        "e2e_s": percentiles([r.e2e_s for r in ok if r.e2e_s is not None]),
        "errors": sorted({r.error for r in results if r.error and r.status != 429})[:10],
    }
    environment = {
        "base_url": base_url,
        "models": models,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    return {
        "config": config,
        "environment": environment,
        "summary": summary,
        "requests": [asdict(r) for r in results],
    }


def print_report(report: dict[str, Any]) -> None:
    s = report["summary"]
    print(f"models: {', '.join(report['environment']['models'])}")
    print(
        f"requests: {s['num_requests']} sent, {s['num_ok']} ok, {s['num_429']} x 429, "
        f"{s['num_errors']} errors, in {s['wall_s']:.2f} s"
    )
    print(
        f"throughput: {s['requests_per_s']:.2f} req/s, {s['output_tokens_per_s']:.1f} output "
        f"tok/s, {s['prompt_tokens_per_s']:.1f} prompt tok/s"
    )
    for name, key, scale, digits, unit in (
        ("TTFT", "ttft_s", 1000, 1, "ms"),
        ("inter-token", "itl_s", 1000, 1, "ms"),
        ("end-to-end", "e2e_s", 1, 3, "s"),
    ):
        p = s[key]
        if p:
            cols = "  ".join(
                f"{q} {p[q] * scale:.{digits}f}" for q in ("mean", "p50", "p90", "p99")
            )
            print(f"{name:>12}: {cols} {unit}")
    for error in s["errors"]:
        print(f"error: {error}")


# -- spawning a server ----------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def spawned_server(args: argparse.Namespace) -> Iterator[tuple[str, str]]:
    """Start `loraplex serve` on a free localhost port with a throwaway data dir; yield
    (base_url, api_key); stop it (SIGTERM, then SIGKILL) after."""
    port = free_port()
    cmd = server_command(args, port)
    with tempfile.TemporaryDirectory(prefix="loraplex-bench-") as data_dir:
        log_path = Path(data_dir) / "server.log"
        env = {**os.environ, "LORAPLEX_DATA_DIR": args.spawn_data_dir or data_dir}
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            base_url = f"http://127.0.0.1:{port}"
            api_key = wait_until_serving(proc, base_url, log_path, args)
            yield base_url, api_key
        finally:
            stop_process(proc)
            if args.spawn_log:
                Path(args.spawn_log).write_bytes(log_path.read_bytes())


def server_command(args: argparse.Namespace, port: int) -> list[str]:
    """`loraplex serve` through this interpreter (the console script may not be on PATH)."""
    serve = ["--model", args.spawn_model] if args.spawn_model else ["--demo"]
    entry = "import sys; from loraplex.platform.cli import main; sys.exit(main())"
    return [
        sys.executable,
        "-c",
        entry,
        "serve",
        *serve,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]


def wait_until_serving(
    proc: subprocess.Popen[bytes], base_url: str, log_path: Path, args: argparse.Namespace
) -> str:
    deadline = time.monotonic() + args.spawn_timeout
    api_key: str | None = args.api_key
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace")[-3000:]
            raise SystemExit(f"server exited with {proc.returncode}:\n{tail}")
        if api_key is None:
            found = API_KEY_RE.search(log_path.read_text(errors="replace"))
            api_key = found.group(0) if found else None
        try:
            ready = httpx.get(f"{base_url}/ready", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            ready = False
        if ready and api_key is not None:
            return api_key
        time.sleep(0.5)
    tail = log_path.read_text(errors="replace")[-3000:]
    raise SystemExit(f"server not serving within {args.spawn_timeout} s (or no API key):\n{tail}")


def stop_process(proc: subprocess.Popen[bytes], grace_s: float = 30.0) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


# -- command line ---------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument("--api-key", default=os.environ.get("LORAPLEX_API_KEY"))
    p.add_argument("--model", action="append", help="model or adapter name (repeatable)")
    p.add_argument("--endpoint", choices=("completions", "chat"), default="completions")
    p.add_argument("--num-requests", type=int, default=64)
    p.add_argument("--duration", type=float, default=300.0, help="stop sending after (s)")
    p.add_argument("--rate", type=float, default=4.0, help="mean arrivals/s; inf = all at once")
    p.add_argument("--max-concurrency", type=int, default=None, help="optional in-flight cap")
    p.add_argument("--prompt-words", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false")
    p.add_argument("--warmup", type=int, default=1, help="unmeasured requests first")
    p.add_argument("--request-timeout", type=float, default=300.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="OUT", help="write config, summary and per-request rows")
    p.add_argument("--spawn", action="store_true", help="start `loraplex serve --demo` here")
    p.add_argument("--spawn-model", metavar="PATH", help="with --spawn: serve --model PATH")
    p.add_argument("--spawn-data-dir", help="with --spawn: LORAPLEX_DATA_DIR (default: temp)")
    p.add_argument("--spawn-timeout", type=float, default=900.0)
    p.add_argument("--spawn-log", metavar="FILE", help="with --spawn: keep the server's log")
    args = p.parse_args(argv)
    if not 1 <= args.num_requests <= MAX_REQUESTS:
        p.error(f"--num-requests must be in [1, {MAX_REQUESTS}]")
    if not 0 < args.duration <= MAX_DURATION_S:
        p.error(f"--duration must be in (0, {MAX_DURATION_S}]")
    if not args.rate > 0:
        p.error("--rate must be > 0")
    if not args.spawn and urlparse(args.base_url).hostname not in LOCAL_HOSTS:
        p.error("--base-url must be a localhost address")
    if not args.spawn and not args.api_key:
        p.error("--api-key (or LORAPLEX_API_KEY) is needed without --spawn")
    if args.spawn_model and not args.api_key:
        p.error("--spawn-model serves no demo tenant: pass --api-key valid in --spawn-data-dir")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.spawn:
        with spawned_server(args) as (base_url, api_key):
            report = asyncio.run(run_load(args, base_url, api_key))
    else:
        report = asyncio.run(run_load(args, args.base_url, args.api_key))
    print_report(report)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0 if report["summary"]["num_ok"] > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
