// Live engine and traffic figures, polled every 2 s; rates come from counter deltas.

import { api } from "../api.js";
import { number, percent } from "../format.js";
import { byLabel, parseMetrics, total } from "../metrics.js";
import { ErrorMessage, html, TimeChart, useEffect, useRef, useState } from "../ui.js";

const POLL_MS = 2000;
const WINDOW_POINTS = 150; // 5 minutes
const REFUSALS = ["requests", "tokens", "concurrency", "engine_overloaded"];

function Stat({ label, value, id }) {
  return html`<div class="stat"><dt id=${id}>${label}</dt><dd aria-labelledby=${id}>${value}</dd></div>`;
}

export function DashboardPage() {
  const [error, setError] = useState(null);
  const [now, setNow] = useState(null);
  const [history, setHistory] = useState({ t: [], rps: [], tps: [], run: [], wait: [], swap: [], kv: [] });
  const last = useRef(null);
  useEffect(() => {
    let stopped = false;
    const poll = async () => {
      try {
        const [engine, text] = await Promise.all([api.get("/admin/v1/engine"), api.text("/metrics")]);
        const samples = parseMetrics(text);
        const at = Date.now() / 1000;
        const counters = {
          requests: total(samples, "loraplex_requests_total"),
          tokens: total(samples, "loraplex_tokens_total", { kind: "completion" }),
        };
        const prev = last.current;
        const dt = prev ? at - prev.at : 0;
        const rps = dt > 0 ? Math.max(0, (counters.requests - prev.counters.requests) / dt) : 0;
        const tps = dt > 0 ? Math.max(0, (counters.tokens - prev.counters.tokens) / dt) : 0;
        last.current = { at, counters };
        const stats = engine.stats;
        const refused = byLabel(samples, "loraplex_rate_limited_total", "kind");
        if (stopped) return;
        setNow({ engine, rps, tps, refused, counters });
        setHistory((h) => {
          const keep = (list, value) => [...list, value].slice(-WINDOW_POINTS);
          return {
            t: keep(h.t, at),
            rps: keep(h.rps, rps),
            tps: keep(h.tps, tps),
            run: keep(h.run, stats.num_running),
            wait: keep(h.wait, stats.num_waiting),
            swap: keep(h.swap, stats.num_swapped),
            kv: keep(h.kv, engine.kv_usage * 100),
          };
        });
        setError(null);
      } catch (err) {
        if (!stopped) setError(err);
      }
    };
    poll();
    const timer = setInterval(poll, POLL_MS);
    return () => {
      stopped = true;
      clearInterval(timer);
    };
  }, []);
  if (!now) return html`<${ErrorMessage} error=${error} />${!error && html`<p>Loading…</p>`}`;
  const { engine, rps, tps, refused, counters } = now;
  const stats = engine.stats;
  const tiers = { gpu: 0, cpu: 0 };
  for (const r of stats.lora.resident) tiers[r.tier] += 1;
  return html`
    <${ErrorMessage} error=${error} />
    <p class="muted">Model <strong>${engine.model}</strong> · rate limiter ${engine.ratelimit_backend}
      ${engine.draining ? " · draining" : ""} · refreshed every 2 s</p>
    <dl class="stats">
      <${Stat} id="s-rps" label="Requests/s" value=${number(rps, 2)} />
      <${Stat} id="s-tps" label="Output tokens/s" value=${number(tps, 1)} />
      <${Stat} id="s-req" label="Requests served" value=${number(counters.requests)} />
      <${Stat} id="s-run" label="Running / waiting / swapped"
        value=${`${stats.num_running} / ${stats.num_waiting} / ${stats.num_swapped}`} />
      <${Stat} id="s-kv" label="KV cache in use" value=${percent(engine.kv_usage)} />
      <${Stat} id="s-ad" label="Adapters on GPU / CPU" value=${`${tiers.gpu} / ${tiers.cpu}`} />
    </dl>
    <section aria-labelledby="refusals-title">
      <h2 id="refusals-title">429 refusals by reason (since start)</h2>
      <dl class="stats">
        ${REFUSALS.map((kind) => html`<${Stat} id=${`s-429-${kind}`} label=${kind.replace("_", " ")}
          value=${number(refused[kind] || 0)} />`)}
      </dl>
    </section>
    <section class="charts" aria-label="The last minutes">
      <${TimeChart} title="Requests/s" series=${["requests/s"]} data=${[history.t, history.rps]} />
      <${TimeChart} title="Output tokens/s" series=${["tokens/s"]} data=${[history.t, history.tps]} />
      <${TimeChart} title="Requests in the engine" series=${["running", "waiting", "swapped"]}
        data=${[history.t, history.run, history.wait, history.swap]} />
      <${TimeChart} title="KV cache in use (%)" series=${["KV %"]} data=${[history.t, history.kv]} />
    </section>`;
}
