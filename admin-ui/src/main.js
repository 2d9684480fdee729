// The console: sign-in, then one page per hash route (#/dashboard, #/tenants, ...).

import { render } from "../vendor/preact-htm.standalone.js";
import { api, setUnauthorizedHandler, token } from "./api.js";
import { AdaptersPage } from "./pages/adapters.js";
import { AuditPage } from "./pages/audit.js";
import { DashboardPage } from "./pages/dashboard.js";
import { KeysPage } from "./pages/keys.js";
import { TenantsPage } from "./pages/tenants.js";
import { UsagePage } from "./pages/usage.js";
import { ErrorMessage, html, useAction, useEffect, useState } from "./ui.js";

const PAGES = [
  { route: "dashboard", title: "Dashboard", component: DashboardPage },
  { route: "tenants", title: "Tenants", component: TenantsPage },
  { route: "keys", title: "API keys", component: KeysPage },
  { route: "adapters", title: "Adapters", component: AdaptersPage },
  { route: "usage", title: "Usage", component: UsagePage },
  { route: "audit", title: "Audit", component: AuditPage },
];

function currentRoute() {
  const route = window.location.hash.replace(/^#\/?/, "").split("?")[0];
  return PAGES.some((p) => p.route === route) ? route : "dashboard";
}

function SignIn({ reason, onSignedIn }) {
  const [value, setValue] = useState("");
  const [run, busy, error] = useAction();
  const submit = async (event) => {
    event.preventDefault();
    token.set(value.trim());
    const ok = await run(() => api.get("/admin/v1/engine"));
    if (ok) onSignedIn();
    else token.clear();
  };
  return html`<main class="signin">
    <h1>Loraplex admin</h1>
    <form onSubmit=${submit}>
      <p>Sign in with an admin token (<code>loraplex admin token</code> prints one). It is kept
        in this browser tab only and sent with each request, never in a URL.</p>
      ${reason && html`<div class="notice" role="status">${reason}</div>`}
      <label for="admin-token">Admin token</label>
      <input id="admin-token" type="password" autocomplete="off" required value=${value}
        onInput=${(e) => setValue(e.target.value)} />
      <${ErrorMessage} error=${error} />
      <button type="submit" class="primary" disabled=${busy || !value.trim()}>Sign in</button>
    </form>
  </main>`;
}

function App() {
  const [signedIn, setSignedIn] = useState(Boolean(token.get()));
  const [reason, setReason] = useState(null);
  const [route, setRoute] = useState(currentRoute());
  useEffect(() => {
    const changed = () => setRoute(currentRoute());
    window.addEventListener("hashchange", changed);
    setUnauthorizedHandler((message) => {
      token.clear();
      setReason(`Signed out: ${message}`);
      setSignedIn(false);
    });
    return () => window.removeEventListener("hashchange", changed);
  }, []);
  useEffect(() => {
    const page = PAGES.find((p) => p.route === route);
    document.title = `${page.title} · Loraplex admin`;
  }, [route]);
  if (!signedIn) return html`<${SignIn} reason=${reason} onSignedIn=${() => setSignedIn(true)} />`;
  const signOut = () => {
    token.clear();
    setReason("Signed out.");
    setSignedIn(false);
  };
  const page = PAGES.find((p) => p.route === route);
  const Page = page.component;
  return html`<div class="layout">
    <a class="skip" href="#content">Skip to content</a>
    <header class="top">
      <span class="brand">Loraplex admin</span>
      <nav aria-label="Main">
        <ul>
          ${PAGES.map(
            (p) => html`<li><a href=${`#/${p.route}`}
              aria-current=${p.route === route ? "page" : undefined}>${p.title}</a></li>`,
          )}
        </ul>
      </nav>
      <button class="signout" onClick=${signOut}>Sign out</button>
    </header>
    <main id="content" tabindex="-1">
      <h1>${page.title}</h1>
      <${Page} key=${route} />
    </main>
  </div>`;
}

const root = document.getElementById("app");
root.textContent = ""; // the boot message
render(html`<${App} />`, root);
