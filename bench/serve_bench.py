"""Online serving: the real server under Poisson load, beside the offline engine on the same requests.

    python bench/serve_bench.py --shape llama3-8b --num-prompts 512 --rates 8,16,inf \\
        --adapters 8 --json out.json

Starts `loraplex serve` (SQLite, the in-process rate limiter, the engine in its own process) on
a Llama-3-8B-shape random model, registers a tenant with limits out of the way, its key and
`--adapters` random adapters (rank 16 on all 7 projections) through the CLI, then sends the
requests through the `openai` client, streaming (or not: `--no-stream`), as a Poisson process
at each `--rates` request rate (`inf`: all at once, saturation), from `--client-processes`
processes (one Python process parsing 512 streams is slower than the server); requests spread
round-robin over the adapters and the base model. Reports per rate: output tok/s, time to first
token and inter-token latency p50 / p90 / p99, the CPU time of the server's API process and of
its engine process (per output token, and as a share of one core: near 1.0, that process is the
bottleneck), how fast requests reached the engine (its queue sampled from /metrics:
EngineSampler), and how the engine spent the run: its steps, their mean length and tokens, and
the share of the wall time spent in them (`engine_busy_share`; the offline run reports the
same). Last, with the server stopped, the offline engine (`LLM.generate`) runs the same
requests: the server's throughput at saturation is reported against it, per saturated round
and as their median (`--rates inf,inf,inf` for three). Prompts are fresh random tokens for
every rate (prefix caching would otherwise serve repeats).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing as mp
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import httpx
from openai import AsyncOpenAI
from workload import LORA_MODULES, write_random_adapter, write_shape_checkpoint

from loraplex.engine import LLM, LoRARequest, SamplingParams


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


LORAPLEX = [
    sys.executable,
    "-c",
    "from loraplex.platform.cli import main; raise SystemExit(main())",
]


def cli(env: dict[str, str], *args: str) -> str:
    command = [*LORAPLEX, *args]
    return subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) a live process has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def child_pids(pid: int) -> list[int]:
    """The live process's children (Linux /proc)."""
    return [
        int(c)
        for task in Path(f"/proc/{pid}/task").iterdir()
        for c in (task / "children").read_text().split()
    ]


def server_cpu_seconds(pid: int) -> dict[str, float]:
    """CPU seconds of the server's process ("api": HTTP, auth, streaming) and of its children
    (the engine process, plus any tensor-parallel workers: "engine")."""
    return {"api": cpu_seconds(pid), "engine": sum(cpu_seconds(c) for c in child_pids(pid))}


class EngineSampler:
    """Samples the server's /metrics every `interval` s on a thread: requests the API has
    admitted and not finished (in flight), and the engine's running and waiting requests. How
    fast the engine's queue fills at saturation says whether admission through the API (auth,
    limits, tokenization, the engine pipe) holds the engine back."""

    NAMES = {
        "loraplex_requests_in_flight": "in_flight",
        "loraplex_engine_num_requests_running": "running",
        "loraplex_engine_num_requests_waiting": "waiting",
    }

    def __init__(self, base_url: str, interval: float) -> None:
        self.base_url, self.interval = base_url, interval
        self.samples: list[dict[str, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> EngineSampler:
        self._start = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        with httpx.Client(timeout=5) as http:
            while not self._stop.wait(self.interval):
                sample = {"t": round(time.perf_counter() - self._start, 3)}
                response = http.get(f"{self.base_url}/metrics")
                response.raise_for_status()
                for line in response.text.splitlines():
                    name = line.split("{")[0].split(" ")[0]
                    if name in self.NAMES:
                        key = self.NAMES[name]
                        sample[key] = sample.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
                self.samples.append(sample)

    def summary(self, num_requests: int) -> dict:
        """When the API had admitted 95% of the requests, when the engine held 95% of them
        (running + waiting), and the mean running batch until the first request finished."""

        def first_time(key: Callable[[dict[str, float]], float]) -> float | None:
            return next((s["t"] for s in self.samples if key(s) >= 0.95 * num_requests), None)

        held = [s.get("running", 0) + s.get("waiting", 0) for s in self.samples]
        peak = max(range(len(held)), key=held.__getitem__, default=0)
        running = [s.get("running", 0) for s in self.samples[: peak + 1]]
        return {
            "api_admitted_95pct_s": first_time(lambda s: s.get("in_flight", 0)),
            "engine_holds_95pct_s": first_time(lambda s: s.get("running", 0) + s.get("waiting", 0)),
            "mean_running_until_peak": sum(running) / max(len(running), 1),
            "samples": self.samples,
        }


ENGINE_COUNTERS = {
    "loraplex_engine_steps_total": "steps",
    "loraplex_engine_step_seconds_total": "step_seconds",
    "loraplex_engine_scheduled_tokens_total": "scheduled_tokens",
}


def engine_counters(base_url: str) -> dict[str, float]:
    """The engine's cumulative step counters, from /metrics."""
    text = httpx.get(f"{base_url}/metrics", timeout=10).text
    return {
        key: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        for name, key in ENGINE_COUNTERS.items()
        if line.startswith(name + " ")
    }


def step_summary(before: dict[str, float], after: dict[str, float], seconds: float) -> dict:
    """How the engine spent a run: its steps, their mean length and size, and the share of the
    run's wall time it spent in them (the rest it waited for work or handled messages)."""
    steps = after["steps"] - before["steps"]
    busy = after["step_seconds"] - before["step_seconds"]
    return {
        "engine_steps": steps,
        "engine_step_ms": 1000 * busy / max(steps, 1),
        "engine_tokens_per_step": (after["scheduled_tokens"] - before["scheduled_tokens"])
        / max(steps, 1),
        "engine_busy_share": busy / seconds,
    }


class PySpy:
    """py-spy sampling the server's API process and its engine process (raw folded stacks,
    `--nonblocking`: the processes are never paused) while a rate runs; written on exit."""

    def __init__(self, server_pid: int, out_dir: Path, tag: str) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        children = child_pids(server_pid)
        self.targets = {"api": server_pid} | {f"engine{i}": c for i, c in enumerate(children)}
        self.out_dir, self.tag = out_dir, tag
        self.procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> PySpy:
        for name, pid in self.targets.items():
            output = self.out_dir / f"{self.tag}_{name}.txt"
            self.procs.append(subprocess.Popen(
                ["py-spy", "record", "--pid", str(pid), "--rate", "250", "--nonblocking",
                 "--format", "raw", "--output", str(output)],
                stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
            ))  # fmt: skip
        time.sleep(1.0)  # attached before the first request
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            proc.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
        for proc in self.procs:
            proc.wait(timeout=60)


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"p50": pick(0.5), "p90": pick(0.9), "p99": pick(0.99)}


def random_prompts(
    count: int, min_len: int, max_len: int, vocab_size: int, seed: int
) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(10, vocab_size) for _ in range(rng.randint(min_len, max_len))]
            for _ in range(count)]  # fmt: skip


async def one_request(
    client: AsyncOpenAI, model: str, prompt: list[int], output_len: int, stream: bool
) -> tuple[float | None, list[float], int]:
    """(time to first token, inter-token gaps, output tokens) of one completion, streamed; not
    streamed: (None, [the whole request's latency], output tokens)."""
    start = time.perf_counter()
    if not stream:
        response = await client.completions.create(
            model=model, prompt=prompt, max_tokens=output_len, temperature=0.0,
            extra_body={"ignore_eos": True},
        )  # fmt: skip
        assert response.usage is not None
        return None, [time.perf_counter() - start], response.usage.completion_tokens
    first, last, gaps, tokens = None, None, [], 0
    stream = await client.completions.create(
        model=model, prompt=prompt, max_tokens=output_len, temperature=0.0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
    )  # fmt: skip
    async for chunk in stream:
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
        if not chunk.choices or not chunk.choices[0].text:
            continue
        now = time.perf_counter()
        if first is None:
            first = now - start
        elif last is not None:
            gaps.append(now - last)
        last = now
    return first, gaps, tokens


async def send_share(
    base_url: str, key: str, models: list[str], prompts: dict[int, list[int]], rate: float,
    output_len: int, seed: int, stream: bool,
) -> tuple[float, float, list[tuple[float | None, list[float], int]], float]:  # fmt: skip
    """Send `prompts` ({request index: prompt}) as a Poisson process at `rate`; (wall-clock
    start, end, each request's (TTFT, inter-token gaps, output tokens), this process's CPU
    seconds)."""
    cpu = time.process_time()
    rng = random.Random(seed)
    client = AsyncOpenAI(base_url=f"{base_url}/v1", api_key=key, max_retries=0, timeout=3600)
    tasks = []
    start = time.time()
    for i, prompt in prompts.items():
        tasks.append(asyncio.create_task(
            one_request(client, models[i % len(models)], prompt, output_len, stream)
        ))  # fmt: skip
        if math.isfinite(rate):
            await asyncio.sleep(rng.expovariate(rate))
    results = await asyncio.gather(*tasks)
    end = time.time()
    await client.close()
    return start, end, list(results), time.process_time() - cpu


def client_process(
    share: tuple,
) -> tuple[float, float, list[tuple[float | None, list[float], int]], float]:
    return asyncio.run(send_share(*share))


def run_rate(
    clients: ProcessPoolExecutor, num_clients: int, base_url: str, key: str, models: list[str],
    prompts: list[list[int]], rate: float, output_len: int, seed: int, stream: bool = True,
) -> dict:  # fmt: skip
    """All `prompts` at `rate` requests/s, sent by `num_clients` processes (a share each, at
    rate / num_clients: together still a Poisson process at `rate`). One Python process
    parsing every stream of a saturated server through the openai client would measure the
    client, not the server."""
    shares = [
        (base_url, key, models, {i: prompts[i] for i in range(c, len(prompts), num_clients)},
         rate / num_clients, output_len, seed * 1000 + c, stream)
        for c in range(num_clients)
    ]  # fmt: skip
    parts = list(clients.map(client_process, shares))
    elapsed = max(end for _, end, _, _ in parts) - min(start for start, _, _, _ in parts)
    results = [r for _, _, rs, _ in parts for r in rs]
    ttfts = [r[0] for r in results if r[0] is not None]
    gaps = [g for r in results for g in r[1]]
    num_tokens = sum(r[2] for r in results)
    return {
        "rate": rate,
        "client_processes": num_clients,
        "seconds": elapsed,
        "output_tok_s": num_tokens / elapsed,
        "ttft_s": percentiles(ttfts),
        # Not streamed: each request's whole latency (there is no token to time before it).
        "itl_s" if stream else "request_latency_s": percentiles(gaps),
        # The busiest client process's CPU time over the round: near 1.0, the clients may be
        # what limits the round (more --client-processes), not the server.
        "client_cpu_share_max": max(cpu for _, _, _, cpu in parts) / elapsed,
    }


def offline_run(
    model_dir: Path,
    adapters: list[Path],
    prompts: list[list[int]],
    output_len: int,
    engine_args: dict,
    warmup: list[list[int]],
) -> dict:
    llm = LLM(str(model_dir), **engine_args)
    loras: list[LoRARequest | None] = [None]
    loras += [LoRARequest(f"a{i}", i + 1, str(p)) for i, p in enumerate(adapters)]
    params = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
    requests = [{"prompt_token_ids": p} for p in prompts]
    per_request = [loras[i % len(loras)] for i in range(len(prompts))]
    llm.generate(
        [{"prompt_token_ids": p} for p in warmup],
        params,
        lora_request=[loras[i % len(loras)] for i in range(len(warmup))],
        use_tqdm=False,
    )

    def counters() -> dict[str, float]:
        stats = llm.engine.get_stats()
        return {"steps": stats.num_steps, "step_seconds": stats.step_seconds,
                "scheduled_tokens": stats.num_scheduled_tokens}  # fmt: skip

    before, start, kernels = counters(), time.perf_counter(), triton_cache_entries()
    llm.generate(requests, params, lora_request=per_request, use_tqdm=False)
    seconds = time.perf_counter() - start
    return {
        "output_tok_s": len(prompts) * output_len / seconds,
        "seconds": seconds,
        "new_triton_kernels": compiled_kernels(triton_cache_entries() - kernels),
        **step_summary(before, counters(), seconds),
    }


def triton_cache_entries() -> set[str]:
    """Entries of Triton's on-disk kernel cache (shared by every process of this user): one
    more for each kernel variant compiled, whichever process compiled it. A measured run that
    adds some compiled kernels on its way (each costs its process a pause)."""
    cache = triton_cache_dir()
    return {entry.name for entry in cache.iterdir()} if cache.is_dir() else set()


def triton_cache_dir() -> Path:
    return Path(os.environ.get("TRITON_CACHE_DIR") or Path.home() / ".triton" / "cache")


def compiled_kernels(entries: set[str]) -> list[str]:
    """What the cache entries hold: each compiled kernel's name with its warps and stages (from
    the metadata file Triton writes beside the binary); helper modules Triton builds for itself
    have no such file and are left out."""
    kernels = []
    for entry in sorted(entries):
        for meta in (triton_cache_dir() / entry).glob("*.json"):
            if meta.name.startswith("__grp__"):
                continue
            try:
                info = json.loads(meta.read_text())
            except (OSError, ValueError):
                continue
            kernels.append(
                f"{info.get('name', meta.stem)} (warps {info.get('num_warps')}, "
                f"stages {info.get('num_stages')})"
            )
    return kernels


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--shape", default="llama3-8b", choices=["llama3-8b", "tiny"])
    ap.add_argument("--num-prompts", type=int, default=512)
    ap.add_argument("--min-prompt", type=int, default=512)
    ap.add_argument("--max-prompt", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--rates", default="8,16,inf", help="requests/s; inf = all at once")
    ap.add_argument("--adapters", type=int, default=8)
    ap.add_argument(
        "--client-processes",
        type=int,
        default=8,
        help="processes sending the requests (too few, and the clients rather than the server "
        "limit a saturated round: see client_cpu_share_max)",
    )
    ap.add_argument(
        "--py-spy", help="profile the API and engine processes at saturation into this folder"
    )
    ap.add_argument(
        "--engine-args",
        default="{}",
        help="more engine keywords (LLM(...)'s), as a JSON object: the server and the offline "
        "engine both get them",
    )
    ap.add_argument(
        "--server-env",
        default="{}",
        help='more server settings as a JSON object, e.g. {"LORAPLEX_REGISTRY_CACHE_TTL_S": "0"}',
    )
    ap.add_argument(
        "--sample-interval",
        type=float,
        default=1.0,
        help="seconds between /metrics samples (each scrape costs the API process ~20-30 ms "
        "at the Llama-3-8B shape: at 0.25 s that was ~8%% of its time)",
    )
    ap.add_argument(
        "--warmup-prompts",
        type=int,
        default=64,
        help="requests of the run's shape that warm up the server and the offline engine, "
        "unmeasured",
    )
    ap.add_argument(
        "--no-stream",
        action="store_true",
        help="non-streamed completions (one JSON body each): TTFT and inter-token latency give "
        "way to each request's whole latency",
    )
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    # The server and the offline engine get the same engine keywords, and both leave the rest
    # (max_num_seqs among them) at the engine's defaults: the ratio compares like with like.
    engine_args = {"load_format": "dummy", "enable_prefix_caching": False}
    engine_args |= json.loads(args.engine_args)

    tmp = Path(tempfile.mkdtemp(prefix="loraplex-serve-"))
    model_dir = write_shape_checkpoint(args.shape, tmp / args.shape)
    config = json.loads((model_dir / "config.json").read_text())
    adapters = [
        write_random_adapter(tmp / f"adapter{i}", config, 16, seed=i, modules=LORA_MODULES)
        for i in range(args.adapters)
    ]
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("LORAPLEX_")},
        "LORAPLEX_DATA_DIR": str(tmp / "data"),
        "LORAPLEX_MODEL": str(model_dir),
        "LORAPLEX_PORT": str(port),
        "LORAPLEX_PUBLIC_METRICS": "1",  # EngineSampler reads /metrics
        "LORAPLEX_MAX_WAITING_REQUESTS": "100000",
        "LORAPLEX_MAX_WAITING_TOKENS": "1000000000",
        "LORAPLEX_ENGINE_ARGS": json.dumps(engine_args),
        **json.loads(args.server_env),
    }
    cli(env, "db", "upgrade")
    cli(env, "tenants", "create", "bench", "--rpm", "1000000", "--tpm", "1000000000",
        "--concurrency", "100000")  # fmt: skip
    key = re.search(r"lpx-\S+", cli(env, "keys", "create", "bench"))
    assert key is not None, "no API key printed"
    models = [model_dir.name]
    for i, path in enumerate(adapters):
        cli(env, "adapters", "add", "--tenant", "bench", "--name", f"a{i}",
            "--model", str(model_dir), str(path))  # fmt: skip
        models.append(f"a{i}")
    server = subprocess.Popen(
        [*LORAPLEX, "serve"], env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
    )  # fmt: skip
    base_url = f"http://127.0.0.1:{port}"
    clients = ProcessPoolExecutor(args.client_processes, mp_context=mp.get_context("spawn"))
    results: dict = {"args": vars(args), "rates": []}
    try:
        deadline = time.monotonic() + 1200
        while not _ready(base_url):
            assert server.poll() is None and time.monotonic() < deadline, "the server did not start"
            time.sleep(1)
        # Warm-up, not reported, the same as the offline engine's (`--warmup-prompts` requests
        # of the run's shape over every adapter, all at once): it compiles the server's kernels
        # for prefill-sized steps too, which a few short prompts leave to the first measured
        # rate. Each round names the kernels compiled during it (`new_triton_kernels`).
        warm = random_prompts(
            args.warmup_prompts, args.min_prompt, args.max_prompt, config["vocab_size"], seed=1000
        )
        run_rate(
            clients, args.client_processes, base_url, key[0], models, warm, math.inf,
            args.output_len, seed=1000, stream=not args.no_stream,
        )  # fmt: skip
        for i, rate in enumerate(float(r) for r in args.rates.split(",")):
            prompts = random_prompts(
                args.num_prompts, args.min_prompt, args.max_prompt, config["vocab_size"], seed=i
            )
            before, steps_before = server_cpu_seconds(server.pid), engine_counters(base_url)
            kernels_before = triton_cache_entries()
            with ExitStack() as profiling:
                if args.py_spy and not math.isfinite(rate):
                    profiling.enter_context(PySpy(server.pid, Path(args.py_spy), f"saturation{i}"))
                sampler = profiling.enter_context(EngineSampler(base_url, args.sample_interval))
                run = run_rate(
                    clients, args.client_processes, base_url, key[0], models, prompts, rate,
                    args.output_len, seed=i, stream=not args.no_stream,
                )  # fmt: skip
            after = server_cpu_seconds(server.pid)
            time.sleep(0.1)  # the engine's last stats snapshot of the run reaches the API
            run |= step_summary(steps_before, engine_counters(base_url), run["seconds"])
            run["new_triton_kernels"] = compiled_kernels(triton_cache_entries() - kernels_before)
            queue = sampler.summary(len(prompts))
            tokens = run["output_tok_s"] * run["seconds"]
            for part in ("api", "engine"):
                used = after[part] - before[part]
                run[f"{part}_cpu_s"] = used
                run[f"{part}_cpu_share"] = used / run["seconds"]  # 1.0: one core busy throughout
                run[f"{part}_cpu_ms_per_token"] = 1000 * used / max(tokens, 1)
            print(json.dumps(run | {k: v for k, v in queue.items() if k != "samples"}), flush=True)
            results["rates"].append(run | {"queue": queue})
    finally:
        clients.shutdown()
        server.terminate()
        server.wait(timeout=120)
    prompts = random_prompts(
        args.num_prompts, args.min_prompt, args.max_prompt, config["vocab_size"], seed=99
    )
    warm = random_prompts(
        args.warmup_prompts, args.min_prompt, args.max_prompt, config["vocab_size"], seed=1001
    )
    results["offline"] = offline_run(
        model_dir, adapters, prompts, args.output_len, engine_args, warm
    )
    print(json.dumps(results["offline"]), flush=True)
    offline = results["offline_output_tok_s"] = results["offline"]["output_tok_s"]
    # Each saturated round's ratio, and their median (the figure the server is judged by:
    # a first round can carry one-time costs that a long-running server has paid).
    ratios = [r["output_tok_s"] / offline for r in results["rates"] if not math.isfinite(r["rate"])]
    if ratios:
        results["server_over_offline_rounds"] = ratios
        results["server_over_offline"] = statistics.median(ratios)
    print(f"offline engine: {offline:.1f} output tok/s; server at saturation: "
          f"{results.get('server_over_offline', float('nan')):.3f}x (median; rounds: "
          f"{', '.join(f'{r:.3f}x' for r in ratios)})", flush=True)  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


def _ready(base_url: str) -> bool:
    try:
        return httpx.get(f"{base_url}/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


if __name__ == "__main__":
    main()
