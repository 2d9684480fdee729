// Components every page uses: errors (always shown, never swallowed), modal dialogs, the
// type-the-name confirmation, paging, the tenant picker and small uPlot time charts.

import { html, useEffect, useRef, useState } from "../vendor/preact-htm.standalone.js";
import uPlot from "../vendor/uPlot.esm.js";
import { api } from "./api.js";

export { html, useEffect, useRef, useState };

export function ErrorMessage({ error }) {
  if (!error) return null;
  const status = error.status ? ` (HTTP ${error.status})` : "";
  return html`<div class="error" role="alert">
    <strong>Error${status}:</strong> ${error.message || String(error)}
  </div>`;
}

export function Notice({ children }) {
  return html`<div class="notice" role="status">${children}</div>`;
}

// Runs `action`, keeping its error for display; returns [run, busy, error, setError].
export function useAction() {
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState(null);
  const run = async (action) => {
    setBusy(true);
    setError(null);
    try {
      return await action();
    } catch (err) {
      setError(err);
      return undefined;
    } finally {
      setBusy(false);
    }
  };
  return [run, busy, error, setError];
}

export function Modal({ title, onClose, children }) {
  const ref = useRef(null);
  useEffect(() => {
    const dialog = ref.current;
    dialog.showModal();
    const closed = () => onClose();
    dialog.addEventListener("close", closed);
    return () => dialog.removeEventListener("close", closed);
  }, []);
  return html`<dialog ref=${ref} aria-labelledby="dialog-title">
    <h2 id="dialog-title">${title}</h2>
    ${children}
  </dialog>`;
}

// Deletion needs the resource's name typed back: a slip of the mouse deletes nothing.
export function ConfirmByName({ title, name, consequence, action, onDone, onClose }) {
  const [typed, setTyped] = useState("");
  const [run, busy, error] = useAction();
  const confirm = async (event) => {
    event.preventDefault();
    if ((await run(action)) !== undefined) onDone();
  };
  return html`<${Modal} title=${title} onClose=${onClose}>
    <form onSubmit=${confirm}>
      <p>${consequence}</p>
      <label>Type <strong>${name}</strong> to confirm
        <input value=${typed} onInput=${(e) => setTyped(e.target.value)} autocomplete="off" />
      </label>
      <${ErrorMessage} error=${error} />
      <div class="actions">
        <button type="button" onClick=${onClose}>Cancel</button>
        <button type="submit" class="danger" disabled=${typed !== name || busy}>Delete</button>
      </div>
    </form>
  <//>`;
}

export function Pager({ skip, limit, count, onPage }) {
  const last = Math.max(0, count - 1);
  const from = count ? skip + 1 : 0;
  const to = Math.min(count, skip + limit);
  return html`<nav class="pager" aria-label="Pages">
    <button onClick=${() => onPage(Math.max(0, skip - limit))} disabled=${skip === 0}>
      Previous
    </button>
    <span>${from}–${to} of ${count}</span>
    <button onClick=${() => onPage(skip + limit)} disabled=${skip + limit > last}>Next</button>
  </nav>`;
}

// A tenant chosen by searching its name (server-side, like the tenants page). The list shows
// the first PICKER_LIMIT matches and says when there are more (the search narrows them).
const PICKER_LIMIT = 50;

export function TenantPicker({ value, onChange, allowAll = false, id = "tenant-picker" }) {
  const [q, setQ] = useState("");
  const [tenants, setTenants] = useState([]);
  const [total, setTotal] = useState(0);
  const [error, setError] = useState(null);
  useEffect(() => {
    const timer = setTimeout(() => {
      api
        .get("/admin/v1/tenants", { q, limit: PICKER_LIMIT })
        .then((page) => {
          setTenants(page.data);
          setTotal(page.count);
          setError(null);
          if (!allowAll && !value && page.data.length) onChange(page.data[0].id);
        })
        .catch(setError);
    }, 200);
    return () => clearTimeout(timer);
  }, [q]);
  return html`<div class="picker">
    <label for=${`${id}-search`}>Find tenant</label>
    <input id=${`${id}-search`} type="search" value=${q} placeholder="name contains…"
      onInput=${(e) => setQ(e.target.value)} />
    <label for=${id}>Tenant</label>
    <select id=${id} value=${value || ""} onChange=${(e) => onChange(Number(e.target.value) || null)}>
      ${allowAll && html`<option value="">All tenants</option>`}
      ${tenants.map((t) => html`<option value=${t.id}>${t.name} (#${t.id})</option>`)}
    </select>
    ${total > tenants.length &&
    html`<small class="picker-more">first ${tenants.length} of ${total}: type to narrow</small>`}
    <${ErrorMessage} error=${error} />
  </div>`;
}

// A small uPlot chart of time series: `data` = [times (s), ...series], `series` = labels.
export function TimeChart({ title, series, data, height = 160, bars = false }) {
  const holder = useRef(null);
  const plot = useRef(null);
  useEffect(() => {
    const width = Math.max(240, holder.current.clientWidth);
    const palette = ["#1d4ed8", "#b45309", "#047857", "#9333ea", "#be123c", "#0e7490"];
    const opts = {
      width,
      height,
      legend: { show: true },
      scales: { x: { time: true } },
      tzDate: (ts) => uPlot.tzDate(new Date(ts * 1000), "Etc/UTC"), // the console speaks UTC
      series: [
        {},
        ...series.map((label, i) => ({
          label,
          stroke: palette[i % palette.length],
          width: 2,
          ...(bars ? { paths: uPlot.paths.bars({ size: [0.6, 40] }), fill: palette[i % palette.length] } : {}),
        })),
      ],
      axes: [{}, { size: 60 }],
    };
    plot.current = new uPlot(opts, data, holder.current);
    const resize = () => plot.current.setSize({ width: Math.max(240, holder.current.clientWidth), height });
    window.addEventListener("resize", resize);
    return () => {
      window.removeEventListener("resize", resize);
      plot.current.destroy();
    };
  }, [series.join("|")]);
  useEffect(() => {
    if (plot.current) plot.current.setData(data);
  }, [data]);
  return html`<figure class="chart">
    <figcaption>${title} <span class="muted">(UTC)</span></figcaption>
    <div ref=${holder} role="img" aria-label=${`${title} chart`}></div>
  </figure>`;
}
