// The audit log: every admin change (this console, the API, the CLI), refused ones included,
// newest first, with server-side filters and paging.

import { api } from "../api.js";
import { utc } from "../format.js";
import { ErrorMessage, html, Pager, useAction, useEffect, useState } from "../ui.js";

const PAGE_SIZE = 50;
const ACTIONS = [
  "tenant.create", "tenant.update", "tenant.delete", "key.create", "key.revoke",
  "adapter.upload", "adapter.delete", "grant.create", "grant.delete",
];
const TARGETS = [["tenant", "Tenant"], ["api_key", "API key"], ["adapter", "Adapter"]];
const EMPTY = { actor: "", action: "", target_type: "", target_id: "", result: "", since: "",
  until: "" };

const TARGET_LABELS = Object.fromEntries(TARGETS);

// A detail object as `key: value` pairs (values as JSON: strings quoted, lists bracketed;
// content hashes cut to their first 12 digits, as the adapters page shows them).
function detailText(detail) {
  return Object.entries(detail || {})
    .filter(([, value]) => value !== null)
    .map(([key, value]) => `${key}: ${key === "sha256" ? `${value.slice(0, 12)}…` : JSON.stringify(value)}`)
    .join(", ");
}

function Outcome({ event }) {
  const extra = [event.status_code, event.error_code].filter((x) => x !== null).join(" ");
  return html`<span class=${`badge ${event.result}`}>${event.result}</span>
    ${extra && html` <span class="muted">${extra}</span>`}`;
}

export function AuditPage() {
  const [filters, setFilters] = useState(EMPTY);
  const [skip, setSkip] = useState(0);
  const [page, setPage] = useState({ data: [], count: 0 });
  const [reload, setReload] = useState(0);
  const [load, busy, error] = useAction();
  useEffect(() => {
    const timer = setTimeout(() => {
      // datetime-local has no zone: the API reads a time without an offset as UTC.
      load(async () => setPage(await api.get("/admin/v1/audit", { ...filters, skip, limit: PAGE_SIZE })));
    }, 200);
    return () => clearTimeout(timer);
  }, [filters, skip, reload]);
  const set = (key) => (e) => {
    setFilters({ ...filters, [key]: e.target.value });
    setSkip(0);
  };
  const filtered = Object.values(filters).some((v) => v !== "");
  return html`
    <p class="muted">Every change to tenants, keys, adapters and grants, from this console, the
      API or the command line, including refused ones. Times are UTC.</p>
    <form class="grid-form filters" aria-label="Filters" onSubmit=${(e) => e.preventDefault()}>
      <label>Actor <input value=${filters.actor} placeholder="admin:… or cli:…" maxlength="128"
        onInput=${set("actor")} /></label>
      <label>Action
        <select value=${filters.action} onChange=${set("action")}>
          <option value="">All actions</option>
          ${ACTIONS.map((a) => html`<option value=${a}>${a}</option>`)}
        </select>
      </label>
      <label>Target type
        <select value=${filters.target_type} onChange=${set("target_type")}>
          <option value="">All targets</option>
          ${TARGETS.map(([value, label]) => html`<option value=${value}>${label}</option>`)}
        </select>
      </label>
      <label>Target ID <input type="number" min="1" value=${filters.target_id}
        onInput=${set("target_id")} /></label>
      <label>Result
        <select value=${filters.result} onChange=${set("result")}>
          <option value="">Any result</option>
          <option value="ok">ok</option>
          <option value="failed">failed</option>
        </select>
      </label>
      <label>From (UTC) <input type="datetime-local" value=${filters.since}
        onChange=${set("since")} /></label>
      <label>Before (UTC) <input type="datetime-local" value=${filters.until}
        onChange=${set("until")} /></label>
      <div class="actions">
        <button type="button" onClick=${() => setReload((n) => n + 1)} disabled=${busy}>Refresh</button>
        <button type="button" onClick=${() => { setFilters(EMPTY); setSkip(0); }}
          disabled=${!filtered}>Clear filters</button>
      </div>
    </form>
    <${ErrorMessage} error=${error} />
    <div class="table-wrap" role="region" aria-label="Audit log table" tabindex="0">
      <table>
        <thead><tr>
          <th scope="col">Time (UTC)</th><th scope="col">Actor</th><th scope="col">Action</th>
          <th scope="col">Target</th><th scope="col">Result</th><th scope="col">Detail</th>
          <th scope="col">Request ID</th>
        </tr></thead>
        <tbody>
          ${page.data.map((e) => html`<tr>
            <td class="nowrap">${utc(e.created_at)}</td><td>${e.actor}</td><td>${e.action}</td>
            <td class="nowrap">${TARGET_LABELS[e.target_type]} ${e.target_id === null ? "—" : `#${e.target_id}`}</td>
            <td class="nowrap"><${Outcome} event=${e} /></td>
            <td class="detail">${detailText(e.detail) || "—"}</td>
            <td>${e.request_id ? html`<code>${e.request_id}</code>` : "—"}</td>
          </tr>`)}
        </tbody>
      </table>
    </div>
    ${!page.data.length && !busy && html`<p>No events${filtered ? " match these filters" : ""}.</p>`}
    <${Pager} skip=${skip} limit=${PAGE_SIZE} count=${page.count} onPage=${setSkip} />
  `;
}
