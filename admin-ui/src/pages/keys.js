// API keys of one tenant: create (the secret shown once, with a copy button), list masked with
// last use, revoke.

import { api } from "../api.js";
import { hashParam, utc } from "../format.js";
import {
  ErrorMessage,
  html,
  Modal,
  Notice,
  TenantPicker,
  useAction,
  useEffect,
  useState,
} from "../ui.js";

function Reveal({ created, onClose }) {
  const [copied, setCopied] = useState(null);
  const copy = async () => {
    try {
      await navigator.clipboard.writeText(created.key);
      setCopied("Copied to the clipboard.");
    } catch (err) {
      setCopied(`Could not copy (${err.message}): select the key and copy it by hand.`);
    }
  };
  return html`<${Modal} title="New API key" onClose=${onClose}>
    <p><strong>Copy this key now: you will not see it again.</strong> Only a hash of it is stored.</p>
    <label>API key <input id="new-key" readonly value=${created.key} onFocus=${(e) => e.target.select()} /></label>
    <div class="actions">
      <button class="primary" onClick=${copy}>Copy</button>
      <button onClick=${onClose}>I have stored it</button>
    </div>
    ${copied && html`<p role="status">${copied}</p>`}
  <//>`;
}

function keyStatus(k) {
  if (k.revoked_at) return "revoked";
  if (k.expires_at && new Date(k.expires_at) < new Date()) return "expired";
  return "active";
}

export function KeysPage() {
  const [tenantId, setTenantId] = useState(Number(hashParam("tenant")) || null);
  const [keys, setKeys] = useState([]);
  const [name, setName] = useState("");
  const [days, setDays] = useState("");
  const [created, setCreated] = useState(null);
  const [notice, setNotice] = useState(null);
  const [reload, setReload] = useState(0);
  const [load, , loadError] = useAction();
  const [create, creating, createError] = useAction();
  const [revoke, , revokeError] = useAction();
  useEffect(() => {
    if (tenantId) load(async () => setKeys((await api.get(`/admin/v1/tenants/${tenantId}/api-keys`)).data));
  }, [tenantId, reload]);
  const onCreate = async (event) => {
    event.preventDefault();
    const body = { name: name.trim() };
    if (days) body.expires_at = new Date(Date.now() + Number(days) * 86400000).toISOString();
    const key = await create(() => api.post(`/admin/v1/tenants/${tenantId}/api-keys`, body));
    if (key) {
      setCreated(key);
      setName("");
      setReload((n) => n + 1);
    }
  };
  const onRevoke = async (k) => {
    if (!window.confirm(`Revoke key ${k.prefix}…${k.name ? ` (${k.name})` : ""}? Calls with it will fail at once.`)) return;
    const row = await revoke(() => api.del(`/admin/v1/api-keys/${k.id}`));
    if (row) {
      setNotice(`Revoked key ${row.prefix}….`);
      setReload((n) => n + 1);
    }
  };
  return html`
    <${TenantPicker} value=${tenantId} onChange=${setTenantId} />
    ${notice && html`<${Notice}>${notice}<//>`}
    <section aria-labelledby="new-key-title">
      <h2 id="new-key-title">New key</h2>
      <form class="grid-form" onSubmit=${onCreate}>
        <label>Key name <input value=${name} maxlength="64" onInput=${(e) => setName(e.target.value)} /></label>
        <label>Expires in (days, optional)
          <input type="number" min="1" value=${days} onInput=${(e) => setDays(e.target.value)} /></label>
        <${ErrorMessage} error=${createError} />
        <div class="actions"><button type="submit" class="primary" disabled=${!tenantId || creating}>Create key</button></div>
      </form>
    </section>
    <section aria-labelledby="keys-title">
      <h2 id="keys-title">Keys</h2>
      <${ErrorMessage} error=${loadError || revokeError} />
      <div class="table-wrap" role="region" aria-label="API keys table" tabindex="0">
        <table>
          <thead><tr><th scope="col">Key</th><th scope="col">Name</th><th scope="col">Status</th>
            <th scope="col">Created</th><th scope="col">Last used</th><th scope="col">Expires</th>
            <th scope="col">Actions</th></tr></thead>
          <tbody>${keys.map((k) => html`<tr>
            <td><code>${k.prefix}…</code></td><td>${k.name || "—"}</td>
            <td><span class=${`badge ${keyStatus(k)}`}>${keyStatus(k)}</span></td>
            <td>${utc(k.created_at)}</td><td>${k.last_used_at ? utc(k.last_used_at) : "never"}</td>
            <td>${k.expires_at ? utc(k.expires_at) : "never"}</td>
            <td>${!k.revoked_at && html`<button class="danger" onClick=${() => onRevoke(k)}
              aria-label=${`Revoke key ${k.prefix}`}>Revoke</button>`}</td>
          </tr>`)}</tbody>
        </table>
      </div>
      ${tenantId && !keys.length && html`<p>This tenant has no keys.</p>`}
    </section>
    ${created && html`<${Reveal} created=${created} onClose=${() => setCreated(null)} />`}
  `;
}
