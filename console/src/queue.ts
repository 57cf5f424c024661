/**
 * Queue: depth by tenant × engine kind × status, the oldest pending item's age, dispatch and
 * completion rates (charted over the minutes this page has been open), work no active agent serves
 * (its tenant and engine kind) with its oldest item's age, items no agent could ever run with the
 * reason, and the dead letters with their errors, each a click (and a confirmation)
 * from a redrive.
 */
import { durationMs } from "@bufbuild/protobuf/wkt";
import { WorkItemStatus, type WorkItem } from "@aiflow/wire/gen/aiflow/cluster/v1/work_item_pb.js";
import type { QueueStatsResponse } from "@aiflow/wire/gen/aiflow/cluster/v1/ops_pb.js";
import { ops } from "./api.js";
import { ago, ConfirmButton, ErrorLine, html, Sparkline, usePoll } from "./ui.js";

const POLL_MS = 2_000;
const ms = (v: number) => (v < 1000 ? `${v.toFixed(v < 10 ? 1 : 0)} ms` : `${(v / 1000).toFixed(1)} s`);
const WINDOW = 150;
const rates: { dispatched: number[]; completed: number[]; pending: number[]; waitP50: number[]; waitP99: number[] } = {
  dispatched: [],
  completed: [],
  pending: [],
  waitP50: [],
  waitP99: [],
};

function remember(s: QueueStatsResponse): void {
  const push = (list: number[], v: number) => {
    list.push(v);
    if (list.length > WINDOW) list.shift();
  };
  push(rates.dispatched, s.dispatchedPerSecond);
  push(rates.completed, s.completedPerSecond);
  push(rates.pending, Number(s.pending));
  push(rates.waitP50, s.dispatchWaitP50 ? durationMs(s.dispatchWaitP50) : 0);
  push(rates.waitP99, s.dispatchWaitP99 ? durationMs(s.dispatchWaitP99) : 0);
}

export const STATUS_NAME: Record<number, string> = {
  [WorkItemStatus.PENDING]: "pending",
  [WorkItemStatus.DISPATCHED]: "dispatched",
  [WorkItemStatus.COMPLETED]: "completed",
  [WorkItemStatus.FAILED]: "failed",
  [WorkItemStatus.CANCELLED]: "cancelled",
};

export function Queue() {
  const stats = usePoll(async () => {
    const s = await ops.queueStats({});
    remember(s);
    return s;
  }, POLL_MS);
  const dead = usePoll(async () => (await ops.listItems({ statuses: [WorkItemStatus.FAILED], pageSize: 100 })).items, POLL_MS);
  const s = stats.data;
  const peak = (xs: number[]) => Math.max(1, ...xs);
  const cells = new Map<string, Map<number, bigint>>();
  for (const d of s?.depth ?? []) {
    const key = `${d.tenantKey}\u0000${d.engineKind}`;
    const row = cells.get(key) ?? new Map<number, bigint>();
    row.set(d.status, d.count);
    cells.set(key, row);
  }
  const statuses = [WorkItemStatus.PENDING, WorkItemStatus.DISPATCHED, WorkItemStatus.COMPLETED, WorkItemStatus.FAILED, WorkItemStatus.CANCELLED];
  return html`<section aria-labelledby="queue-h">
    <h1 id="queue-h">Queue</h1>
    <${ErrorLine} error=${stats.error} />
    ${
      s &&
      html`<dl class="figures">
      <div><dt>Pending</dt><dd data-figure="pending">${s.pending.toString()}</dd></div>
      <div><dt>Dispatched</dt><dd>${s.dispatched.toString()}</dd></div>
      <div><dt>Dead letters</dt><dd data-figure="dead">${s.deadLetters.toString()}</dd></div>
      <div><dt>Oldest pending</dt><dd>${s.oldestPendingAge ? ago(durationMs(s.oldestPendingAge)) : "–"}</dd></div>
      <div><dt>Dispatched / s</dt><dd>${s.dispatchedPerSecond.toFixed(1)} <${Sparkline} values=${rates.dispatched} max=${peak(rates.dispatched)} label="dispatches per second over time" percent=${false} /></dd></div>
      <div><dt>Completed / s</dt><dd>${s.completedPerSecond.toFixed(1)} <${Sparkline} values=${rates.completed} max=${peak(rates.completed)} label="completions per second over time" percent=${false} /></dd></div>
      <div><dt>Dispatch wait p50</dt><dd>${s.dispatchWaitP50 ? ms(durationMs(s.dispatchWaitP50)) : "–"} <${Sparkline} values=${rates.waitP50} max=${peak(rates.waitP99)} label="median dispatch wait over time" percent=${false} /></dd></div>
      <div><dt>Dispatch wait p99</dt><dd>${s.dispatchWaitP99 ? ms(durationMs(s.dispatchWaitP99)) : "–"} <${Sparkline} values=${rates.waitP99} max=${peak(rates.waitP99)} label="99th percentile dispatch wait over time" percent=${false} /></dd></div>
      <div><dt>Pending over time</dt><dd><${Sparkline} values=${rates.pending} max=${peak(rates.pending)} label="pending items over time" percent=${false} /></dd></div>
    </dl>`
    }
    <h2>Depth</h2>
    <table>
      <thead><tr><th scope="col">Tenant</th><th scope="col">Engine kind</th>${statuses.map((st) => html`<th scope="col">${STATUS_NAME[st]}</th>`)}</tr></thead>
      <tbody>${[...cells].map(([key, row]) => {
        const [tenant, kind] = key.split("\u0000");
        return html`<tr><th scope="row">${tenant}</th><td>${kind}</td>${statuses.map((st) => html`<td>${(row.get(st) ?? 0n).toString()}</td>`)}</tr>`;
      })}</tbody>
    </table>
    ${
      (s?.unserved.length ?? 0) > 0 &&
      html`<h2 id="unserved-h">Unserved</h2>
      <p>No active agent serves these tenants and engine kinds: their items wait until one registers or is undrained.</p>
      <table aria-labelledby="unserved-h" data-table="unserved">
        <thead><tr><th scope="col">Tenant</th><th scope="col">Engine kind</th><th scope="col">Items</th><th scope="col">Oldest</th><th scope="col">Agents not active</th></tr></thead>
        <tbody>${s!.unserved.map(
          (u) =>
            html`<tr><th scope="row">${u.tenantKey}</th><td>${u.engineKind}</td><td>${u.count.toString()}</td><td>${u.oldestAge ? ago(durationMs(u.oldestAge)) : "–"}</td><td>${u.agentsNotActive > 0 ? `${u.agentsNotActive} (draining or inactive)` : "none registered"}</td></tr>`,
        )}</tbody>
      </table>`
    }
    ${
      (s?.unplaceable.length ?? 0) > 0 &&
      html`<h2>Unplaceable</h2>
      <table>
        <thead><tr><th scope="col">Tenant</th><th scope="col">Engine kind</th><th scope="col">Items</th><th scope="col">Why</th><th scope="col">Oldest</th></tr></thead>
        <tbody>${s!.unplaceable.map((u) => html`<tr><th scope="row">${u.tenantKey}</th><td>${u.engineKind}</td><td>${u.count.toString()}</td><td>${u.reason}</td><td>${u.oldestAge ? ago(durationMs(u.oldestAge)) : "–"}</td></tr>`)}</tbody>
      </table>`
    }
    <h2>Dead letters</h2>
    <${ErrorLine} error=${dead.error} />
    <${DeadLetters} items=${dead.data ?? []} onChange=${() => (dead.reload(), stats.reload())} />
  </section>`;
}

function DeadLetters({ items, onChange }: { items: readonly WorkItem[]; onChange: () => void }) {
  if (items.length === 0) return html`<p>No dead letters.</p>`;
  return html`<table class="dead">
    <thead><tr><th scope="col">Item</th><th scope="col">Tenant</th><th scope="col">Engine kind</th><th scope="col">Run</th><th scope="col">Retries</th><th scope="col">Error</th><th scope="col">Actions</th></tr></thead>
    <tbody>${items.map(
      (i) => html`<tr data-item=${i.id}>
        <th scope="row"><a href=${`#/items/${encodeURIComponent(i.id)}`}>${i.id}</a></th>
        <td>${i.tenantKey}</td>
        <td>${i.engineKind}</td>
        <td>${i.runId ? html`<a href=${`#/runs/${encodeURIComponent(i.tenantKey)}/${encodeURIComponent(i.runId)}`}>${i.runId}</a>` : "–"}</td>
        <td>${i.retryCount} of ${i.maxRetries}</td>
        <td class="message">${i.error}</td>
        <td><${ConfirmButton} label="Redrive" title=${`Redrive ${i.id}`} onConfirm=${() => ops.redriveItems({ tenantKey: i.tenantKey, ids: [i.id] }).then(onChange)}>
          <p>The item goes back to pending with a fresh retry budget.</p>
        <//></td>
      </tr>`,
    )}</tbody>
  </table>`;
}
