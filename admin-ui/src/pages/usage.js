// Usage per tenant and per adapter over a range of UTC days: a chart, a table, a CSV export.

import { api } from "../api.js";
import { download, isoDay, number, toCsv } from "../format.js";
import { ErrorMessage, html, TenantPicker, TimeChart, useAction, useEffect, useState } from "../ui.js";

const DAY_MS = 86400000;
const COLUMNS = [
  { key: "date", label: "Date (UTC)" },
  { key: "tenant_id", label: "Tenant ID" },
  { key: "model", label: "Model" },
  { key: "requests", label: "Requests" },
  { key: "prompt_tokens", label: "Prompt tokens" },
  { key: "completion_tokens", label: "Completion tokens" },
  { key: "total_tokens", label: "Total tokens" },
];

// Rows -> uPlot data: one x per UTC day of the range, one series per tenant or model.
function chartData(rows, start, end, seriesKey) {
  const days = [];
  for (let t = Date.parse(`${start}T00:00:00Z`); t <= Date.parse(`${end}T00:00:00Z`); t += DAY_MS) {
    days.push(t / 1000);
  }
  const names = [...new Set(rows.map(seriesKey))];
  const series = names.map((name) => {
    const byDay = new Map(rows.filter((r) => seriesKey(r) === name)
      .map((r) => [Date.parse(`${r.date}T00:00:00Z`) / 1000, r.total_tokens]));
    return days.map((d) => byDay.get(d) ?? 0);
  });
  return { labels: names.map(String), data: [days, ...series] };
}

export function UsagePage() {
  const today = new Date();
  const [tenantId, setTenantId] = useState(null);
  const [perAdapter, setPerAdapter] = useState(false);
  const [start, setStart] = useState(isoDay(new Date(today.getTime() - 6 * DAY_MS)));
  const [end, setEnd] = useState(isoDay(today));
  const [rows, setRows] = useState([]);
  const [reload, setReload] = useState(0);
  const [load, busy, error] = useAction();
  useEffect(() => {
    load(async () => {
      const page = await api.get("/admin/v1/usage", {
        tenant_id: tenantId, start, end, group_by: perAdapter ? "day,adapter" : "day",
      });
      setRows(page.data.map((r) => ({ ...r, model: r.model ?? "(all)" })));
    });
  }, [tenantId, perAdapter, start, end, reload]);
  const seriesKey = perAdapter ? (r) => `${r.tenant_id}: ${r.model}` : (r) => `tenant ${r.tenant_id}`;
  const chart = chartData(rows, start, end, seriesKey);
  const exportCsv = () => download(`loraplex-usage-${start}-${end}.csv`, toCsv(COLUMNS, rows));
  return html`
    <p class="muted">All dates are UTC days; <em>end</em> is included.</p>
    <${TenantPicker} id="usage-tenant" value=${tenantId} onChange=${setTenantId} allowAll=${true} />
    <form class="grid-form filters" onSubmit=${(e) => e.preventDefault()}>
      <label>From (UTC) <input type="date" value=${start} max=${end} onChange=${(e) => setStart(e.target.value)} /></label>
      <label>To (UTC) <input type="date" value=${end} min=${start} onChange=${(e) => setEnd(e.target.value)} /></label>
      <fieldset><legend>Per</legend>
        <label><input type="radio" name="per" checked=${!perAdapter} onChange=${() => setPerAdapter(false)} /> tenant</label>
        <label><input type="radio" name="per" checked=${perAdapter} onChange=${() => setPerAdapter(true)} /> adapter</label>
      </fieldset>
    </form>
    <${ErrorMessage} error=${error} />
    ${busy && html`<p role="status">Loading…</p>`}
    <${TimeChart} key=${chart.labels.join("|")} title="Total tokens per UTC day" series=${chart.labels}
      data=${chart.data} bars=${true} height=${200} />
    <div class="actions">
      <button onClick=${() => setReload((n) => n + 1)} disabled=${busy}>Refresh</button>
      <button onClick=${exportCsv} disabled=${!rows.length}>Export CSV</button>
    </div>
    <div class="table-wrap" role="region" aria-label="Usage table" tabindex="0">
      <table>
        <thead><tr>${COLUMNS.map((c) => html`<th scope="col">${c.label}</th>`)}</tr></thead>
        <tbody>${rows.map((r) => html`<tr>
          <td>${r.date}</td><td>${r.tenant_id}</td><td>${r.model}</td><td>${number(r.requests)}</td>
          <td>${number(r.prompt_tokens)}</td><td>${number(r.completion_tokens)}</td><td>${number(r.total_tokens)}</td>
        </tr>`)}</tbody>
      </table>
    </div>
    ${!rows.length && !busy && html`<p>No usage in this range.</p>`}
  `;
}
