/**
 * The shell: sign-in, navigation, and the view the hash names (#/fleet, #/queue, #/items/ID,
 * #/runs/TENANT/ID, #/list/RUN/KEY, #/limits). Signing in checks the token with a call the daemon authorises like
 * any other (ListAgents needs role ops); the page keeps it for this tab only, and signs out when
 * the daemon refuses it later.
 */
import { useEffect, useState } from "preact/hooks";
import { messageOf, ops, token, whenSignedOut } from "./api.js";
import { Fleet } from "./fleet.js";
import { Limits } from "./limits.js";
import { Queue } from "./queue.js";
import { ItemsAndRuns } from "./runs.js";
import { html } from "./ui.js";

const VIEWS = [
  ["fleet", "Fleet"],
  ["queue", "Queue"],
  ["items", "Items and runs"],
  ["limits", "Bindings and limits"],
] as const;

const routeOf = () => location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);

export function App() {
  const [signedIn, setSignedIn] = useState(token.get() !== null);
  const [route, setRoute] = useState(routeOf());
  const [notice, setNotice] = useState<string | undefined>(undefined);
  useEffect(() => {
    const onHash = () => setRoute(routeOf());
    addEventListener("hashchange", onHash);
    whenSignedOut(() => {
      token.clear();
      setNotice("The daemon no longer accepts this token: sign in again.");
      setSignedIn(false);
    });
    return () => removeEventListener("hashchange", onHash);
  }, []);
  if (!signedIn) return html`<${SignIn} notice=${notice} onSignedIn=${() => (setNotice(undefined), setSignedIn(true))} />`;
  const view = route[0] === "runs" || route[0] === "list" ? "items" : route[0] || "fleet";
  return html`<div class="shell">
    <header>
      <span class="brand">aiflowd</span>
      <nav aria-label="Views">
        <ul>${VIEWS.map(([id, label]) => html`<li><a href=${`#/${id}`} aria-current=${view === id ? "page" : undefined}>${label}</a></li>`)}</ul>
      </nav>
      <button type="button" onClick=${() => (token.clear(), setSignedIn(false))}>Sign out</button>
    </header>
    <main>
      ${view === "fleet" && html`<${Fleet} />`}
      ${view === "queue" && html`<${Queue} />`}
      ${view === "items" && html`<${ItemsAndRuns} route=${route} />`}
      ${view === "limits" && html`<${Limits} />`}
    </main>
  </div>`;
}

function SignIn({ notice, onSignedIn }: { notice: string | undefined; onSignedIn: () => void }) {
  const [value, setValue] = useState("");
  const [error, setError] = useState<string | undefined>(undefined);
  const [busy, setBusy] = useState(false);
  /** With a token, or ("" ) with none: the client certificate the browser presented names the caller. */
  const signIn = async (t: string) => {
    setBusy(true);
    setError(undefined);
    token.set(t);
    try {
      await ops.listAgents({ statuses: [] });
      onSignedIn();
    } catch (err) {
      token.clear();
      setError(messageOf(err));
    } finally {
      setBusy(false);
    }
  };
  const submit = (e: Event) => (e.preventDefault(), void signIn(value.trim()));
  return html`<main class="signin">
    <form onSubmit=${submit} aria-labelledby="signin-h">
      <h1 id="signin-h">aiflowd console</h1>
      ${notice && html`<p role="status">${notice}</p>`}
      <label for="token">Ops token</label>
      <input id="token" name="token" type="password" autocomplete="off" value=${value} onInput=${(e: Event) => setValue((e.target as HTMLInputElement).value)} />
      <p class="hint">A token of role ops (aiflowd token new ops). It is kept for this tab only and sent with each call; nothing is stored in a cookie.</p>
      ${error && html`<p class="error" role="alert">${error}</p>`}
      <button type="submit" class="primary" disabled=${busy}>Sign in</button>
      ${
        location.protocol === "https:" &&
        html`<button type="button" disabled=${busy} onClick=${() => signIn("")}>Sign in with my client certificate</button>
        <p class="hint">Under mutual TLS, a certificate of role ops (spiffe://…/ops/NAME) that this browser presented names you instead of a token.</p>`
      }
    </form>
  </main>`;
}
