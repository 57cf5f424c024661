/**
 * Items and runs: an item by id with what the queue knows of it (status, attempts, lease holder,
 * agent, error, result), the items of a run, and a DAG run as a graph of its nodes — laid out in
 * layers by dependency, each node with its state, the agent of its latest attempt and its times —
 * with every attempt listed below. Runs are read with DagOpsService (any run of a tenant).
 */
import { useState } from "preact/hooks";
import { timestampMs } from "@bufbuild/protobuf/wkt";
import { WorkItemStatus, type WorkItem } from "@aiflow/wire/gen/aiflow/cluster/v1/work_item_pb.js";
import { AttemptStatus, NodeStatus, RunStatus, type NodeState, type Run } from "@aiflow/wire/gen/aiflow/dag/v1/dag_pb.js";
import { dagOps, ops } from "./api.js";
import { ConfirmButton, ErrorLine, html, time, usePoll } from "./ui.js";
import { STATUS_NAME } from "./queue.js";

const NODE: Record<number, string> = {
  [NodeStatus.PENDING]: "pending",
  [NodeStatus.RUNNING]: "running",
  [NodeStatus.WAITING]: "waiting",
  [NodeStatus.COMPLETED]: "completed",
  [NodeStatus.FAILED]: "failed",
  [NodeStatus.SKIPPED]: "skipped",
  [NodeStatus.CANCELLED]: "cancelled",
};
const ATTEMPT: Record<number, string> = {
  [AttemptStatus.QUEUED]: "queued",
  [AttemptStatus.RUNNING]: "running",
  [AttemptStatus.WAITING]: "waiting",
  [AttemptStatus.COMPLETED]: "completed",
  [AttemptStatus.FAILED]: "failed",
  [AttemptStatus.CANCELLED]: "cancelled",
};
const RUN: Record<number, string> = {
  [RunStatus.RUNNING]: "running",
  [RunStatus.COMPLETED]: "completed",
  [RunStatus.FAILED]: "failed",
  [RunStatus.CANCELLED]: "cancelled",
};
const nsTime = (ns: bigint | undefined) => (ns === undefined ? undefined : Number(ns / 1_000_000n));

/** The search forms; `route` is the hash's path after #/ (items/ID, runs/TENANT/ID, or list/RUN/KEY). */
export function ItemsAndRuns({ route }: { route: string[] }) {
  const [kind, a, b] = route;
  const [id, setId] = useState(kind === "items" ? (a ?? "") : "");
  const [tenant, setTenant] = useState(kind === "runs" ? (a ?? "") : "");
  const [runId, setRunId] = useState(kind === "runs" ? (b ?? "") : "");
  const [listRun, setListRun] = useState(kind === "list" ? (a ?? "") : "");
  const [key, setKey] = useState(kind === "list" ? (b ?? "") : "");
  return html`<section aria-labelledby="items-h">
    <h1 id="items-h">Items and runs</h1>
    <div class="searches">
      <form onSubmit=${(e: Event) => (e.preventDefault(), (location.hash = `#/items/${encodeURIComponent(id.trim())}`))}>
        <label>Item id <input name="item" value=${id} onInput=${(e: Event) => setId((e.target as HTMLInputElement).value)} /></label>
        <button type="submit">Find item</button>
      </form>
      <form onSubmit=${(e: Event) => (e.preventDefault(), (location.hash = `#/runs/${encodeURIComponent(tenant.trim())}/${encodeURIComponent(runId.trim())}`))}>
        <label>Tenant <input name="tenant" value=${tenant} onInput=${(e: Event) => setTenant((e.target as HTMLInputElement).value)} /></label>
        <label>Run id <input name="run" value=${runId} onInput=${(e: Event) => setRunId((e.target as HTMLInputElement).value)} /></label>
        <button type="submit">Open run</button>
      </form>
      <form onSubmit=${(e: Event) => (e.preventDefault(), (location.hash = `#/list/${encodeURIComponent(listRun.trim())}/${encodeURIComponent(key.trim())}`))}>
        <label>Items of run <input name="list-run" value=${listRun} onInput=${(e: Event) => setListRun((e.target as HTMLInputElement).value)} /></label>
        <label>or with idempotency key <input name="key" value=${key} onInput=${(e: Event) => setKey((e.target as HTMLInputElement).value)} /></label>
        <button type="submit">List items</button>
      </form>
    </div>
    ${kind === "items" && a && html`<${ItemView} id=${a} />`}
    ${kind === "runs" && a && b && html`<${RunView} tenant=${a} runId=${b} />`}
    ${kind === "list" && (a || b) && html`<${ItemList} runId=${a ?? ""} idempotencyKey=${b ?? ""} />`}
  </section>`;
}

function ItemView({ id }: { id: string }) {
  const { data, error } = usePoll(() => ops.getItem({ id }), 2_000, [id]);
  const i = data?.item;
  return html`<${ErrorLine} error=${error} />${i && html`<${ItemDetail} item=${i} />`}`;
}

/** Items of a run, or with an idempotency key, across the tenants the token reaches (first 200). */
function ItemList({ runId, idempotencyKey }: { runId: string; idempotencyKey: string }) {
  const { data, error } = usePoll(async () => (await ops.listItems({ runId, idempotencyKey, pageSize: 200 })).items, 5_000, [runId, idempotencyKey]);
  return html`<${ErrorLine} error=${error} />
    ${
      data &&
      (data.length === 0
        ? html`<p>No items.</p>`
        : html`<table class="items">
          <thead><tr><th scope="col">Item</th><th scope="col">Tenant</th><th scope="col">Engine kind</th><th scope="col">Status</th><th scope="col">Agent</th><th scope="col">Error</th></tr></thead>
          <tbody>${data.map(
            (
              i,
            ) => html`<tr data-item=${i.id}><th scope="row"><a href=${`#/items/${encodeURIComponent(i.id)}`}>${i.id}</a></th><td>${i.tenantKey}</td><td>${i.engineKind}</td>
              <td>${STATUS_NAME[i.status]}</td><td>${i.agentId || "–"}</td><td class="message">${i.error}</td></tr>`,
          )}</tbody>
        </table>`)
    }`;
}

function ItemDetail({ item: i }: { item: WorkItem }) {
  const rows: [string, unknown][] = [
    ["Status", STATUS_NAME[i.status]],
    ["Tenant", i.tenantKey],
    ["Engine kind", i.engineKind],
    ["Run", i.runId ? html`<a href=${`#/runs/${encodeURIComponent(i.tenantKey)}/${encodeURIComponent(i.runId)}`}>${i.runId}</a>` : "–"],
    ["Node", i.taskName || "–"],
    ["Agent", i.agentId || "–"],
    ["Lease holder", i.leasedBy || "–"],
    ["Dispatched", time(nsTime(i.dispatchedAtNs || undefined))],
    ["Completed", time(nsTime(i.completedAtNs || undefined))],
    ["Retries", `${i.retryCount} of ${i.maxRetries}`],
    ["Redeliveries", `${i.redeliveryCount} of ${i.maxRedeliveries}`],
    ["Created", time(i.createdOn ? timestampMs(i.createdOn) : undefined)],
    ["Error", i.error || "–"],
    ["Result", i.resultJson || "–"],
    ["Payload", i.payloadJson || "–"],
  ];
  const live = i.status === WorkItemStatus.PENDING || i.status === WorkItemStatus.DISPATCHED;
  return html`<dl class="detail">${rows.map(([k, v]) => html`<div><dt>${k}</dt><dd>${v}</dd></div>`)}</dl>
    <p class="actions">
      ${
        live &&
        html`<${ConfirmButton} label="Cancel item" danger title=${`Cancel ${i.id}`} onConfirm=${() => ops.cancelItems({ tenantKey: i.tenantKey, ids: [i.id], reason: "cancelled from the console" })}>
        <p>The item will not run (again); an agent holding it is told to stop, and its late completion is refused.</p>
      <//>`
      }
      ${
        i.status === WorkItemStatus.FAILED &&
        html`<${ConfirmButton} label="Redrive" title=${`Redrive ${i.id}`} onConfirm=${() => ops.redriveItems({ tenantKey: i.tenantKey, ids: [i.id] })}>
        <p>The item goes back to pending with a fresh retry budget.</p>
      <//>`
      }
    </p>`;
}

function RunView({ tenant, runId }: { tenant: string; runId: string }) {
  const run = usePoll(async () => (await dagOps.getRun({ tenantKey: tenant, runId })).run!, 2_000, [tenant, runId]);
  const r = run.data;
  return html`<${ErrorLine} error=${run.error} />
    ${
      r &&
      html`<h2>Run ${r.id} <span class=${`status ${RUN[r.status]}`} data-run-status=${RUN[r.status]}>${RUN[r.status]}</span></h2>
      <p>Definition ${r.definitionId}, started by ${r.createdBy} at ${time(nsTime(r.startTime))}${r.reason ? html`; ${r.reason}` : null}</p>
      <${Graph} run=${r} />
      <h3>Attempts</h3>
      <table>
        <thead><tr><th scope="col">Attempt</th><th scope="col">Status</th><th scope="col">Agent</th><th scope="col">Started</th><th scope="col">Ended</th><th scope="col">Item</th><th scope="col">Error</th></tr></thead>
        <tbody>${r.nodes.flatMap((n) =>
          n.attempts.map(
            (
              t,
            ) => html`<tr><th scope="row">${t.name} #${t.attempt}</th><td>${ATTEMPT[t.status]}</td><td>${t.worker || "–"}</td><td>${time(nsTime(t.startTime))}</td><td>${time(nsTime(t.endTime))}</td>
              <td>${t.workItemId ? html`<a href=${`#/items/${encodeURIComponent(t.workItemId)}`}>${t.workItemId}</a>` : "–"}</td><td class="message">${t.error}</td></tr>`,
          ),
        )}</tbody>
      </table>`
    }`;
}

/** Nodes in layers by longest dependency path, edges from each dependency; SVG, with a text list beside it for screen readers. */
function Graph({ run }: { run: Run }) {
  const layer = new Map<string, number>();
  const byName = new Map(run.nodes.map((n) => [n.name, n]));
  const depth = (n: NodeState, seen = new Set<string>()): number => {
    const known = layer.get(n.name);
    if (known !== undefined) return known;
    if (seen.has(n.name)) return 0;
    seen.add(n.name);
    const d = n.dependsOn.reduce((m, dep) => Math.max(m, byName.has(dep) ? depth(byName.get(dep)!, seen) + 1 : 0), 0);
    layer.set(n.name, d);
    return d;
  };
  for (const n of run.nodes) depth(n);
  const columns: NodeState[][] = [];
  for (const n of run.nodes) (columns[layer.get(n.name)!] ??= []).push(n);
  const W = 180,
    H = 56,
    GX = 60,
    GY = 16;
  const pos = new Map<string, { x: number; y: number }>();
  for (const [c, col] of columns.entries()) for (const [r, n] of col.entries()) pos.set(n.name, { x: c * (W + GX) + 8, y: r * (H + GY) + 8 });
  const width = columns.length * (W + GX) + 16;
  const height = Math.max(...columns.map((c) => c.length)) * (H + GY) + 16;
  return html`<figure class="graph">
    <svg width=${width} height=${height} viewBox=${`0 0 ${width} ${height}`} role="img" aria-label=${`graph of run ${run.id}: ${run.nodes.length} nodes`}>
      ${run.nodes.flatMap((n) =>
        n.dependsOn
          .filter((d) => pos.has(d))
          .map((d) => {
            const a = pos.get(d)!,
              b = pos.get(n.name)!;
            return html`<path class="edge" d=${`M${a.x + W},${a.y + H / 2} C${a.x + W + GX / 2},${a.y + H / 2} ${b.x - GX / 2},${b.y + H / 2} ${b.x},${b.y + H / 2}`} />`;
          }),
      )}
      ${run.nodes.map((n) => {
        const p = pos.get(n.name)!;
        const last = n.attempts.at(-1);
        return html`<g class=${`node ${NODE[n.status]}`} data-node=${n.name} data-status=${NODE[n.status]} transform=${`translate(${p.x},${p.y})`}>
          <rect width=${W} height=${H} rx="6" />
          <text x="8" y="18" class="name">${n.name}</text>
          <text x="8" y="34">${NODE[n.status]}${n.iterations > 0 ? ` ${n.iterationsDone}/${n.iterations}` : ""}</text>
          <text x="8" y="49" class="sub">${last?.worker || ""}</text>
        </g>`;
      })}
    </svg>
    <figcaption>
      <ul class="node-list">${run.nodes.map((n) => html`<li>${n.name}: ${NODE[n.status]}${n.dependsOn.length ? `, after ${n.dependsOn.join(", ")}` : ""}${n.attempts.at(-1)?.worker ? `, on ${n.attempts.at(-1)!.worker}` : ""}</li>`)}</ul>
    </figcaption>
  </figure>`;
}
