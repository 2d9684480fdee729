// Tenants: server-side search and paging, create, edit tier and limits, suspend, delete.

import { api } from "../api.js";
import { number, utc } from "../format.js";
import {
  ConfirmByName,
  ErrorMessage,
  html,
  Modal,
  Notice,
  Pager,
  useAction,
  useEffect,
  useState,
} from "../ui.js";

const PAGE_SIZE = 20;
const TIERS = ["interactive", "standard", "batch"];
const LIMITS = [
  ["requests_per_minute", "Requests / minute"],
  ["tokens_per_minute", "Tokens / minute"],
  ["max_concurrent_requests", "Concurrent requests"],
];

// The form's fields -> a request body (empty limits left out: the server's defaults).
function bodyOf(fields) {
  const body = { name: fields.name.trim(), priority: fields.priority };
  for (const [key] of LIMITS) if (fields[key] !== "") body[key] = Number(fields[key]);
  return body;
}

function TenantForm({ initial, submitLabel, onSubmit, error, busy }) {
  const [fields, setFields] = useState(initial);
  const set = (key) => (e) => setFields({ ...fields, [key]: e.target.value });
  const submit = (event) => {
    event.preventDefault();
    onSubmit(bodyOf(fields));
  };
  const prefix = submitLabel.replace(/\W/g, "").toLowerCase();
  return html`<form class="grid-form" onSubmit=${submit}>
    <label>Name <input required value=${fields.name} onInput=${set("name")}
      pattern="[A-Za-z0-9][A-Za-z0-9._\\-]{0,63}" title="letters, digits, . _ -; up to 64" /></label>
    <label>Tier
      <select value=${fields.priority} onChange=${set("priority")}>
        ${TIERS.map((t) => html`<option value=${t}>${t}</option>`)}
      </select>
    </label>
    ${LIMITS.map(([key, label]) => html`<label>${label}
      <input id=${`${prefix}-${key}`} type="number" min="1" value=${fields[key]}
        placeholder="server default" onInput=${set(key)} /></label>`)}
    <${ErrorMessage} error=${error} />
    <div class="actions"><button type="submit" class="primary" disabled=${busy}>${submitLabel}</button></div>
  </form>`;
}

const EMPTY = { name: "", priority: "standard", requests_per_minute: "", tokens_per_minute: "",
  max_concurrent_requests: "" };

export function TenantsPage() {
  const [q, setQ] = useState("");
  const [skip, setSkip] = useState(0);
  const [page, setPage] = useState({ data: [], count: 0 });
  const [reload, setReload] = useState(0);
  const [editing, setEditing] = useState(null);
  const [deleting, setDeleting] = useState(null);
  const [notice, setNotice] = useState(null);
  const [load, , loadError] = useAction();
  const [create, creating, createError] = useAction();
  const [edit, saving, editError] = useAction();
  const [toggle, , toggleError] = useAction();
  useEffect(() => {
    const timer = setTimeout(() => {
      load(async () => setPage(await api.get("/admin/v1/tenants", { q, skip, limit: PAGE_SIZE })));
    }, 200);
    return () => clearTimeout(timer);
  }, [q, skip, reload]);
  const refresh = (message) => {
    setNotice(message);
    setReload((n) => n + 1);
  };
  const onCreate = async (body) => {
    const tenant = await create(() => api.post("/admin/v1/tenants", body));
    if (tenant) refresh(`Created tenant ${tenant.name}.`);
  };
  const onEdit = async (body) => {
    const tenant = await edit(() => api.patch(`/admin/v1/tenants/${editing.id}`, body));
    if (tenant) {
      setEditing(null);
      refresh(`Saved tenant ${tenant.name}.`);
    }
  };
  const onToggle = async (t) => {
    const status = t.status === "active" ? "suspended" : "active";
    const tenant = await toggle(() => api.patch(`/admin/v1/tenants/${t.id}`, { status }));
    if (tenant) refresh(`Tenant ${tenant.name} is ${tenant.status}.`);
  };
  return html`
    ${notice && html`<${Notice}>${notice}<//>`}
    <section aria-labelledby="new-tenant">
      <h2 id="new-tenant">New tenant</h2>
      <${TenantForm} initial=${EMPTY} submitLabel="Create tenant" onSubmit=${onCreate}
        error=${createError} busy=${creating} />
    </section>
    <section aria-labelledby="all-tenants">
      <h2 id="all-tenants">Tenants</h2>
      <label class="search">Search by name
        <input type="search" value=${q} onInput=${(e) => { setQ(e.target.value); setSkip(0); }} />
      </label>
      <${ErrorMessage} error=${loadError || toggleError} />
      <div class="table-wrap" role="region" aria-label="Tenants table" tabindex="0">
        <table>
          <thead><tr>
            <th scope="col">ID</th><th scope="col">Name</th><th scope="col">Tier</th>
            <th scope="col">Status</th><th scope="col">Req/min</th><th scope="col">Tok/min</th>
            <th scope="col">Concurrent</th><th scope="col">Created</th><th scope="col">Actions</th>
          </tr></thead>
          <tbody>
            ${page.data.map((t) => html`<tr>
              <td>${t.id}</td><td>${t.name}</td><td>${t.priority}</td>
              <td><span class=${`badge ${t.status}`}>${t.status}</span></td>
              <td>${number(t.requests_per_minute)}</td><td>${number(t.tokens_per_minute)}</td>
              <td>${number(t.max_concurrent_requests)}</td><td>${utc(t.created_at)}</td>
              <td class="row-actions">
                <button onClick=${() => setEditing(t)} aria-label=${`Edit ${t.name}`}>Edit</button>
                <button onClick=${() => onToggle(t)} aria-label=${`${t.status === "active" ? "Suspend" : "Activate"} ${t.name}`}>
                  ${t.status === "active" ? "Suspend" : "Activate"}</button>
                <a href=${`#/keys?tenant=${t.id}`}>Keys</a>
                <a href=${`#/adapters?tenant=${t.id}`}>Adapters</a>
                <button class="danger" onClick=${() => setDeleting(t)} aria-label=${`Delete ${t.name}`}>Delete</button>
              </td>
            </tr>`)}
          </tbody>
        </table>
      </div>
      ${!page.data.length && html`<p>No tenants${q ? ` match “${q}”` : ""}.</p>`}
      <${Pager} skip=${skip} limit=${PAGE_SIZE} count=${page.count} onPage=${setSkip} />
    </section>
    ${editing && html`<${Modal} title=${`Edit ${editing.name}`} onClose=${() => setEditing(null)}>
      <${TenantForm} initial=${{ ...editing }} submitLabel="Save" onSubmit=${onEdit}
        error=${editError} busy=${saving} />
      <div class="actions"><button onClick=${() => setEditing(null)}>Close</button></div>
    <//>`}
    ${deleting && html`<${ConfirmByName} title=${`Delete ${deleting.name}`} name=${deleting.name}
      consequence="Deletes the tenant with its API keys, adapters (and their files), grants and usage. This cannot be undone."
      action=${() => api.del(`/admin/v1/tenants/${deleting.id}`).then(() => true)}
      onDone=${() => { setDeleting(null); refresh(`Deleted tenant ${deleting.name}.`); }}
      onClose=${() => setDeleting(null)} />`}
  `;
}
