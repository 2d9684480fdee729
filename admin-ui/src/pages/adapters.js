// Adapters of one tenant: drag-and-drop upload with real progress, versions, residency,
// grants, delete.

import { api, uploadAdapter } from "../api.js";
import { bytes, hashParam, utc } from "../format.js";
import {
  ConfirmByName,
  ErrorMessage,
  html,
  Modal,
  Notice,
  TenantPicker,
  useAction,
  useEffect,
  useRef,
  useState,
} from "../ui.js";

const POLL_MS = 5000;
const RESIDENCY = { gpu: "GPU", cpu: "CPU cache", disk: "disk only" };

function DropZone({ files, onFiles }) {
  const input = useRef(null);
  const [over, setOver] = useState(false);
  const drop = (event) => {
    event.preventDefault();
    setOver(false);
    onFiles([...event.dataTransfer.files]);
  };
  const keydown = (event) => {
    if (event.key === "Enter" || event.key === " ") {
      event.preventDefault();
      input.current.click();
    }
  };
  return html`<div class=${`dropzone${over ? " over" : ""}`} role="button" tabindex="0"
      aria-describedby="drop-help" onKeyDown=${keydown} onClick=${() => input.current.click()}
      onDragOver=${(e) => { e.preventDefault(); setOver(true); }} onDragLeave=${() => setOver(false)}
      onDrop=${drop}>
    <p id="drop-help">Drop <code>adapter_config.json</code> and <code>adapter_model.safetensors</code>,
      or one <code>.zip</code> / <code>.tar.gz</code> of the adapter's folder, here — or press to choose.</p>
    ${files.length > 0 && html`<ul class="files">${files.map((f) => html`<li>${f.name} (${bytes(f.size)})</li>`)}</ul>`}
  </div>
  <input ref=${input} id="adapter-files" type="file" multiple class="visually-hidden"
    tabindex="-1" aria-label="Adapter files" onChange=${(e) => onFiles([...e.target.files])} />`;
}

function Upload({ tenantId, onUploaded }) {
  const [name, setName] = useState("");
  const [files, setFiles] = useState([]);
  const [progress, setProgress] = useState(null);
  const [result, setResult] = useState(null);
  const [run, busy, error] = useAction();
  const submit = async (event) => {
    event.preventDefault();
    setResult(null);
    const form = new FormData();
    form.append("tenant_id", String(tenantId));
    form.append("name", name.trim());
    for (const file of files) form.append("files", file, file.name);
    setProgress(0);
    const adapter = await run(() => uploadAdapter(form, setProgress));
    setProgress(null);
    if (adapter) {
      setResult(adapter);
      setFiles([]);
      onUploaded();
    }
  };
  return html`<form class="upload" onSubmit=${submit}>
    <label>Adapter name <input id="adapter-name" required value=${name} maxlength="64"
      onInput=${(e) => setName(e.target.value)} /></label>
    <${DropZone} files=${files} onFiles=${setFiles} />
    ${progress !== null && html`<div class="progress">
      <label for="upload-progress">${progress < 1 ? "Uploading" : "Validating and load-checking"}</label>
      <progress id="upload-progress" max="1" value=${progress}>${Math.round(progress * 100)} %</progress>
      <span>${Math.round(progress * 100)} %</span>
    </div>`}
    <${ErrorMessage} error=${error} />
    ${result && result.status === "ready" && html`<${Notice}>
      <strong>${result.name}@v${result.version}</strong> is ready: <code>model: "${result.name}"</code> now serves it.<//>`}
    ${result && result.status === "failed" && html`<div class="error" role="alert">
      <strong>${result.name}@v${result.version} failed its load check:</strong> ${result.status_reason}. It is not served.</div>`}
    <div class="actions"><button type="submit" class="primary"
      disabled=${!tenantId || !files.length || !name.trim() || busy}>Upload</button></div>
  </form>`;
}

function Grants({ adapter, onClose }) {
  const [grants, setGrants] = useState([]);
  const [tenantId, setTenantId] = useState(null);
  const [reload, setReload] = useState(0);
  const [run, busy, error] = useAction();
  useEffect(() => {
    run(async () => setGrants(await api.get(`/admin/v1/adapters/${adapter.id}/grants`)));
  }, [reload]);
  const add = async () => {
    if (await run(() => api.post(`/admin/v1/adapters/${adapter.id}/grants`, { tenant_id: tenantId }))) setReload((n) => n + 1);
  };
  const remove = async (id) => {
    if ((await run(() => api.del(`/admin/v1/adapters/${adapter.id}/grants/${id}`).then(() => true)))) setReload((n) => n + 1);
  };
  return html`<${Modal} title=${`Grants of ${adapter.name}@v${adapter.version}`} onClose=${onClose}>
    <p>Granted tenants call it as <code>${"<owner>"}/${adapter.name}</code>. New versions inherit these grants.</p>
    <ul>${grants.map((g) => html`<li>tenant #${g.tenant_id} since ${utc(g.created_at)}
      <button onClick=${() => remove(g.tenant_id)} aria-label=${`Remove grant of tenant ${g.tenant_id}`}>Remove</button></li>`)}</ul>
    ${!grants.length && html`<p>No grants.</p>`}
    <${TenantPicker} id="grant-tenant" value=${tenantId} onChange=${setTenantId} />
    <${ErrorMessage} error=${error} />
    <div class="actions">
      <button class="primary" onClick=${add} disabled=${!tenantId || busy}>Grant</button>
      <button onClick=${onClose}>Close</button>
    </div>
  <//>`;
}

export function AdaptersPage() {
  const [tenantId, setTenantId] = useState(Number(hashParam("tenant")) || null);
  const [adapters, setAdapters] = useState([]);
  const [reload, setReload] = useState(0);
  const [granting, setGranting] = useState(null);
  const [deleting, setDeleting] = useState(null);
  const [notice, setNotice] = useState(null);
  const [error, setError] = useState(null);
  useEffect(() => {
    if (!tenantId) return undefined;
    const load = () =>
      api.get("/admin/v1/adapters", { tenant_id: tenantId })
        .then((page) => { setAdapters(page.data); setError(null); })
        .catch(setError);
    load();
    const timer = setInterval(load, POLL_MS); // residency changes as requests come and go
    return () => clearInterval(timer);
  }, [tenantId, reload]);
  return html`
    <${TenantPicker} value=${tenantId} onChange=${setTenantId} />
    ${notice && html`<${Notice}>${notice}<//>`}
    <section aria-labelledby="upload-title">
      <h2 id="upload-title">Upload an adapter or a new version</h2>
      <p class="muted">Uploading a name that exists makes its next version; the name follows
        the latest ready version, and <code>name@vN</code> pins one.</p>
      <${Upload} tenantId=${tenantId} onUploaded=${() => setReload((n) => n + 1)} />
    </section>
    <section aria-labelledby="versions-title">
      <h2 id="versions-title">Versions</h2>
      <${ErrorMessage} error=${error} />
      <div class="table-wrap" role="region" aria-label="Adapter versions table" tabindex="0">
        <table>
          <thead><tr><th scope="col">Model name</th><th scope="col">Status</th>
            <th scope="col">Where it lives</th><th scope="col">Rank</th><th scope="col">Targets</th>
            <th scope="col">Size</th><th scope="col">SHA-256</th><th scope="col">Uploaded</th>
            <th scope="col">Actions</th></tr></thead>
          <tbody>${adapters.map((a) => html`<tr>
            <td><code>${a.name}@v${a.version}</code>${a.is_latest && html` <span class="badge latest">latest: ${a.name}</span>`}</td>
            <td><span class=${`badge ${a.status}`}>${a.status}</span>${a.status_reason && html`<div class="reason">${a.status_reason}</div>`}</td>
            <td>${RESIDENCY[a.residency]}</td><td>${a.rank}</td><td>${a.target_modules.join(", ")}</td>
            <td>${bytes(a.size_bytes)}</td><td><code title=${a.sha256}>${a.sha256.slice(0, 12)}…</code></td>
            <td>${utc(a.created_at)}</td>
            <td class="row-actions">
              <button onClick=${() => setGranting(a)} aria-label=${`Grants of ${a.name}@v${a.version}`}>Grants</button>
              <button class="danger" onClick=${() => setDeleting(a)} aria-label=${`Delete ${a.name}@v${a.version}`}>Delete</button>
            </td>
          </tr>`)}</tbody>
        </table>
      </div>
      ${tenantId && !adapters.length && html`<p>This tenant has no adapters.</p>`}
    </section>
    ${granting && html`<${Grants} adapter=${granting} onClose=${() => setGranting(null)} />`}
    ${deleting && html`<${ConfirmByName} title=${`Delete ${deleting.name}@v${deleting.version}`}
      name=${`${deleting.name}@v${deleting.version}`}
      consequence="New requests naming this version get 404 (the bare name falls back to the latest remaining ready version); requests in flight finish."
      action=${() => api.del(`/admin/v1/adapters/${deleting.id}`).then(() => true)}
      onDone=${() => { setNotice(`Deleted ${deleting.name}@v${deleting.version}.`); setDeleting(null); setReload((n) => n + 1); }}
      onClose=${() => setDeleting(null)} />`}
  `;
}
