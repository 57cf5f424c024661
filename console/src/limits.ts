/**
 * Bindings and limits: affinity bindings (unbind, rebind to a named agent), concurrency keys with
 * their limits and what they hold (set an operator's limit), tenants' fair-share weights (set or
 * clear one) and rate limits with each limited key's next slot. Each change asks first and calls
 * the OpsService method aiflowctl calls.
 */
import { useState } from "preact/hooks";
import { durationFromMs, durationMs, timestampMs } from "@bufbuild/protobuf/wkt";
import type { Binding, ConcurrencyKey, Tenant } from "@aiflow/wire/gen/aiflow/cluster/v1/ops_pb.js";
import { ops } from "./api.js";
import { ConfirmButton, ErrorLine, html, time, usePoll } from "./ui.js";

const POLL_MS = 5_000;

export function Limits() {
  const bindings = usePoll(async () => (await ops.listBindings({ pageSize: 200 })).bindings, POLL_MS);
  const keys = usePoll(async () => (await ops.listConcurrencyKeys({ pageSize: 200 })).keys, POLL_MS);
  const tenants = usePoll(async () => (await ops.listTenants({})).tenants, POLL_MS);
  const rates = usePoll(() => ops.listRateLimits({ pageSize: 200 }), POLL_MS);
  return html`<section aria-labelledby="limits-h">
    <h1 id="limits-h">Bindings and limits</h1>
    <h2>Affinity bindings</h2>
    <${ErrorLine} error=${bindings.error} />
    <table>
      <thead><tr><th scope="col">Key</th><th scope="col">Agent</th><th scope="col">Since</th><th scope="col">Actions</th></tr></thead>
      <tbody>${(bindings.data ?? []).map((b) => html`<${BindingRow} binding=${b} onChange=${bindings.reload} />`)}</tbody>
    </table>
    <h2>Concurrency keys</h2>
    <${ErrorLine} error=${keys.error} />
    <table>
      <thead><tr><th scope="col">Tenant</th><th scope="col">Key</th><th scope="col">Limit</th><th scope="col">Source</th><th scope="col">In flight</th><th scope="col">Pending</th><th scope="col">Actions</th></tr></thead>
      <tbody>${(keys.data ?? []).map((k) => html`<${KeyRow} k=${k} onChange=${keys.reload} />`)}</tbody>
    </table>
    <h2>Tenants</h2>
    <${ErrorLine} error=${tenants.error} />
    <table>
      <thead><tr><th scope="col">Tenant</th><th scope="col">Weight</th><th scope="col">Source</th><th scope="col">Pending</th><th scope="col">Dispatched</th><th scope="col">Actions</th></tr></thead>
      <tbody>${(tenants.data ?? []).map((t) => html`<${TenantRow} t=${t} onChange=${tenants.reload} />`)}</tbody>
    </table>
    <h2>Rate limits</h2>
    <${ErrorLine} error=${rates.error} />
    <table>
      <thead><tr><th scope="col">Tenant</th><th scope="col">Key</th><th scope="col">Limit</th><th scope="col">Next slot</th><th scope="col">Actions</th></tr></thead>
      <tbody>
        ${(rates.data?.rules ?? []).map(
          (
            r,
          ) => html`<tr><th scope="row">${r.tenantKey}</th><td>${r.key}${r.prefix ? "*" : ""}</td><td>${r.count} per ${r.interval ? durationMs(r.interval) / 1000 : "?"} s (burst ${r.burst})</td><td>–</td>
            <td><${ConfirmButton} label="Clear" title=${`Clear the rate limit of ${r.key}${r.prefix ? "*" : ""}`} onConfirm=${() => ops.setRateLimit({ tenantKey: r.tenantKey, key: r.key, prefix: r.prefix, clear: true }).then(rates.reload)}>
              <p>Items of the key stop waiting for slots from the next claim on.</p>
            <//></td></tr>`,
        )}
        ${(rates.data?.keys ?? []).map((k) => html`<tr><th scope="row">${k.tenantKey}</th><td>${k.key}</td><td>${k.limit ? `${k.limit.count} per ${k.limit.interval ? durationMs(k.limit.interval) / 1000 : "?"} s` : "–"}</td><td>${time(k.nextSlotAt ? timestampMs(k.nextSlotAt) : undefined)}</td><td></td></tr>`)}
      </tbody>
    </table>
    <${SetRateLimit} onChange=${rates.reload} />
  </section>`;
}

/** An operator's rate limit on a key or a key prefix: count per interval, with a burst. */
function SetRateLimit({ onChange }: { onChange: () => void }) {
  const [tenant, setTenant] = useState("");
  const [key, setKey] = useState("");
  const [count, setCount] = useState("10");
  const [seconds, setSeconds] = useState("1");
  const [burst, setBurst] = useState("1");
  const [prefix, setPrefix] = useState(false);
  const field = (label: string, value: string, set: (v: string) => void, type = "text") =>
    html`<label>${label} <input type=${type} value=${value} onInput=${(e: Event) => set((e.target as HTMLInputElement).value)} /></label>`;
  return html`<${ConfirmButton}
    label="Set a rate limit…"
    title="Set a rate limit"
    confirm="Set it"
    onConfirm=${() =>
      ops
        .setRateLimit({
          tenantKey: tenant.trim(),
          key: key.trim(),
          prefix,
          count: Number(count),
          interval: durationFromMs(Math.round(Number(seconds) * 1000)),
          burst: Number(burst),
        })
        .then(onChange)}
  >
    ${field("Tenant", tenant, setTenant)} ${field("Key", key, setKey)}
    <label><input type="checkbox" checked=${prefix} onChange=${(e: Event) => setPrefix((e.target as HTMLInputElement).checked)} /> Every key starting with it</label>
    ${field("Dispatches", count, setCount, "number")} ${field("Per seconds", seconds, setSeconds, "number")} ${field("Burst", burst, setBurst, "number")}
  <//>`;
}

function BindingRow({ binding: b, onChange }: { binding: Binding; onChange: () => void }) {
  const [agent, setAgent] = useState("");
  return html`<tr>
    <th scope="row">${b.affinityKey}</th><td>${b.agentId}</td><td>${time(b.createdOn ? timestampMs(b.createdOn) : undefined)}</td>
    <td class="actions">
      <${ConfirmButton} label="Unbind" title=${`Unbind ${b.affinityKey}`} onConfirm=${() => ops.unbind({ affinityKey: b.affinityKey }).then(onChange)}>
        <p>The key's next claim binds it anew. Refused while items of the key are dispatched.</p>
      <//>
      <${ConfirmButton} label="Rebind" title=${`Rebind ${b.affinityKey}`} onConfirm=${() => ops.rebind({ affinityKey: b.affinityKey, agentId: agent.trim() }).then(onChange)}>
        <label>To agent <input value=${agent} onInput=${(e: Event) => setAgent((e.target as HTMLInputElement).value)} /></label>
      <//>
    </td>
  </tr>`;
}

function KeyRow({ k, onChange }: { k: ConcurrencyKey; onChange: () => void }) {
  const [limit, setLimit] = useState(String(k.limit || ""));
  return html`<tr>
    <th scope="row">${k.tenantKey}</th><td>${k.key}</td><td>${k.limit || "none"}</td><td>${k.limitSource || "–"}</td><td>${k.inFlight}</td><td>${k.pending.toString()}</td>
    <td><${ConfirmButton} label="Set limit" title=${`Limit ${k.key}`} onConfirm=${() => ops.setConcurrencyLimit({ tenantKey: k.tenantKey, key: k.key, maxInFlight: Number(limit) || 0 }).then(onChange)}>
      <label>Items in flight at most (0 clears the operator's limit) <input type="number" min="0" value=${limit} onInput=${(e: Event) => setLimit((e.target as HTMLInputElement).value)} /></label>
    <//></td>
  </tr>`;
}

function TenantRow({ t, onChange }: { t: Tenant; onChange: () => void }) {
  const [weight, setWeight] = useState(String(t.weight));
  return html`<tr>
    <th scope="row">${t.tenantKey}</th><td>${t.weight}</td><td>${t.weightSource}</td><td>${t.pending.toString()}</td><td>${t.dispatched.toString()}</td>
    <td class="actions">
      <${ConfirmButton} label="Set weight" title=${`Weight of ${t.tenantKey}`} onConfirm=${() => ops.setTenantWeight({ tenantKey: t.tenantKey, weight: Number(weight) }).then(onChange)}>
        <label>Fair-share weight <input type="number" min="0.01" step="any" value=${weight} onInput=${(e: Event) => setWeight((e.target as HTMLInputElement).value)} /></label>
      <//>
      <${ConfirmButton} label="Clear weight" title=${`Clear the operator's weight of ${t.tenantKey}`} onConfirm=${() => ops.setTenantWeight({ tenantKey: t.tenantKey, clear: true }).then(onChange)}>
        <p>The configured weight (or 1) applies again.</p>
      <//>
    </td>
  </tr>`;
}
