/**
 * Fleet: every agent with its status, drain progress, version, tags, tenants and items in flight,
 * and its CPU, memory and per-GPU use over the last minutes as small charts. The charts are the
 * heartbeats this page has seen (ListAgents every 5 s keeps each agent's latest one): a history of
 * FLEET_WINDOW_MS per agent, kept in memory while the tab is open. Drain (with a deadline),
 * undrain and remove each ask first and call the same OpsService methods aiflowctl calls.
 */
import { useEffect, useState } from "preact/hooks";
import { durationFromMs, durationMs, timestampMs } from "@bufbuild/protobuf/wkt";
import { AgentStatus } from "@aiflow/wire/gen/aiflow/cluster/v1/common_pb.js";
import type { AgentSummary } from "@aiflow/wire/gen/aiflow/cluster/v1/ops_pb.js";
import { messageOf, ops } from "./api.js";
import { notAVersion, parseVersion } from "../../src/util/semver.js";
import { ago, bytes, ConfirmButton, ErrorLine, html, pct, Sparkline, time, usePoll } from "./ui.js";

const FLEET_WINDOW_MS = 5 * 60_000;
/** As often as agents heartbeat by default (--heartbeat-interval 5s): faster would mostly re-read the same beats. */
const POLL_MS = 5_000;
const PAGE = 100;

interface Sample {
  at: number;
  cpu: number;
  mem: number;
  gpus: { util: number; mem: number }[];
}
interface Metrics {
  at?: number;
  cpu?: { utilization?: number };
  memory?: { used?: number; total?: number };
  gpus?: { index?: number; utilization?: number; memory?: { used?: number; total?: number } }[];
}

const history = new Map<string, Sample[]>();

/** Adds each agent's latest heartbeat to its history (once per heartbeat) and drops what is older than the window. */
function remember(agents: readonly AgentSummary[]): void {
  const now = Date.now();
  for (const a of agents) {
    const m = a.metrics as Metrics | undefined;
    if (!m?.at) continue;
    const list = history.get(a.name) ?? [];
    if (list.at(-1)?.at !== m.at) {
      list.push({
        at: m.at,
        cpu: (m.cpu?.utilization ?? 0) / 100,
        mem: m.memory?.total ? (m.memory.used ?? 0) / m.memory.total : 0,
        gpus: (m.gpus ?? []).map((g) => ({ util: (g.utilization ?? 0) / 100, mem: g.memory?.total ? (g.memory.used ?? 0) / g.memory.total : 0 })),
      });
    }
    while (list.length > 0 && list[0]!.at < now - FLEET_WINDOW_MS) list.shift();
    history.set(a.name, list);
  }
}

export const STATUS: Record<number, string> = { [AgentStatus.ACTIVE]: "active", [AgentStatus.DRAINING]: "draining", [AgentStatus.INACTIVE]: "inactive" };

export function Fleet() {
  const [status, setStatus] = useState("");
  const [tag, setTag] = useState("");
  const [version, setVersion] = useState("");
  const [page, setPage] = useState(0);
  const tags = Object.fromEntries(
    tag
      .split(",")
      .map((p) => p.trim())
      .filter((p) => p.includes("="))
      .map((p) => p.split("=", 2) as [string, string]),
  );
  const statuses = status ? [Number(status) as AgentStatus] : [];
  const { data, error, reload } = usePoll(
    async () => {
      const res = await ops.listAgents({ statuses, tags, version });
      remember(res.agents);
      return res.agents;
    },
    POLL_MS,
    [status, tag, version],
  );
  const agents = data ?? [];
  const shown = agents.slice(page * PAGE, (page + 1) * PAGE);
  return html`<section aria-labelledby="fleet-h">
    <h1 id="fleet-h">Fleet</h1>
    <form class="filters" onSubmit=${(e: Event) => e.preventDefault()}>
      <label>Status <select value=${status} onChange=${(e: Event) => setStatus((e.target as HTMLSelectElement).value)}>
        <option value="">any</option>
        ${Object.entries(STATUS).map(([v, n]) => html`<option value=${v}>${n}</option>`)}
      </select></label>
      <label>Tags <${FilterInput} placeholder="gpu=a100,zone=eu" onApply=${setTag} /></label>
      <label>Version <${FilterInput} placeholder="1.4.2" onApply=${setVersion} /></label>
      <span class="count" aria-live="polite">${agents.length} agents</span>
      <${DrainSelected} tags=${tags} onChange=${reload} />
    </form>
    <${ErrorLine} error=${error} />
    <table class="fleet">
      <thead><tr><th scope="col">Agent</th><th scope="col">Status</th><th scope="col">Version</th><th scope="col">Tags</th><th scope="col">Tenants</th><th scope="col">In flight</th><th scope="col">CPU</th><th scope="col">Memory</th><th scope="col">GPUs</th><th scope="col">Seen</th><th scope="col">Actions</th></tr></thead>
      <tbody>${shown.map((a) => html`<${AgentRow} key=${a.name} agent=${a} onChange=${reload} />`)}</tbody>
    </table>
    ${
      agents.length > PAGE &&
      html`<nav class="pager" aria-label="Fleet pages">
      <button type="button" disabled=${page === 0} onClick=${() => setPage(page - 1)}>Previous</button>
      <span>${page * PAGE + 1}–${Math.min((page + 1) * PAGE, agents.length)} of ${agents.length}</span>
      <button type="button" disabled=${(page + 1) * PAGE >= agents.length} onClick=${() => setPage(page + 1)}>Next</button>
    </nav>`
    }
  </section>`;
}

/**
 * A filter's text field. What is typed is the field's own state, applied (and read by the next
 * poll) on change: Enter or leaving the field. Bound to the applied filter instead, each poll's
 * re-render would put back the old text while a person types.
 */
function FilterInput({ placeholder, onApply }: { placeholder: string; onApply: (v: string) => void }) {
  const [draft, setDraft] = useState("");
  return html`<input value=${draft} placeholder=${placeholder} onInput=${(e: Event) => setDraft((e.target as HTMLInputElement).value)} onChange=${() => onApply(draft)} />`;
}

function AgentRow({ agent: a, onChange }: { agent: AgentSummary; onChange: () => void }) {
  const samples = history.get(a.name) ?? [];
  const m = a.metrics as Metrics | undefined;
  const gpuCount = samples.at(-1)?.gpus.length ?? 0;
  const meta = a.metadata;
  return html`<tr data-agent=${a.name}>
    <th scope="row">${a.name}</th>
    <td><span class=${`status ${STATUS[a.status] ?? ""}`}>${STATUS[a.status] ?? "?"}</span>${a.drain && html`<${Drain} agent=${a} />`}</td>
    <td>${a.agentVersion || "–"}</td>
    <td>${Object.entries(meta?.tags ?? {}).map(([k, v]) => html`<span class="tag">${k}=${v}</span>`)}</td>
    <td>${(meta?.tenants ?? []).join(", ")}</td>
    <td>${a.inFlight}</td>
    <td><${Sparkline} values=${samples.map((s) => s.cpu)} label=${`${a.name} CPU ${pct(samples.at(-1)?.cpu ?? 0)}`} /></td>
    <td><${Sparkline} values=${samples.map((s) => s.mem)} label=${`${a.name} memory ${pct(samples.at(-1)?.mem ?? 0)}`} />
      ${m?.memory?.total ? html`<span class="sub">${bytes(m.memory.used ?? 0)} of ${bytes(m.memory.total)}</span>` : null}</td>
    <td class="gpus">${Array.from(
      { length: gpuCount },
      (_, i) => html`<div class="gpu">
      <span class="sub">GPU ${i}</span>
      <${Sparkline} values=${samples.map((s) => s.gpus[i]?.util ?? 0)} label=${`${a.name} GPU ${i} utilisation`} />
      <${Sparkline} values=${samples.map((s) => s.gpus[i]?.mem ?? 0)} label=${`${a.name} GPU ${i} memory`} />
    </div>`,
    )}</td>
    <td>${a.lastSeenAge ? ago(durationMs(a.lastSeenAge)) : "–"}</td>
    <td class="actions"><${AgentActions} agent=${a} onChange=${onChange} /></td>
  </tr>`;
}

function Drain({ agent: a }: { agent: AgentSummary }) {
  const d = a.drain!;
  return html`<div class="drain" data-drain=${d.complete ? "done" : "running"}>
    ${d.complete ? "drained" : `${d.inFlightNow} of ${d.inFlightAtStart} left`}
    ${d.deadline ? html`<span class="sub">deadline ${time(timestampMs(d.deadline))}</span>` : null}
    ${d.releasedAtDeadline > 0 ? html`<span class="sub">${d.releasedAtDeadline} given back at the deadline</span>` : null}
  </div>`;
}

function AgentActions({ agent: a, onChange }: { agent: AgentSummary; onChange: () => void }) {
  const [minutes, setMinutes] = useState("10");
  const [reason, setReason] = useState("");
  const [force, setForce] = useState(false);
  const done = () => onChange();
  return html`${
    a.status === AgentStatus.ACTIVE &&
    html`<${ConfirmButton}
      label="Drain"
      title=${`Drain ${a.name}`}
      onConfirm=${() => ops.drainAgent({ name: a.name, reason, deadline: Number(minutes) > 0 ? durationFromMs(Number(minutes) * 60_000) : undefined }).then(done)}
    >
      <p>${a.name} takes no new work and finishes what it holds; at the deadline what it still holds goes back to the queue without spending a retry.</p>
      <label>Deadline in minutes (0: none) <input type="number" min="0" value=${minutes} onInput=${(e: Event) => setMinutes((e.target as HTMLInputElement).value)} /></label>
      <label>Reason <input value=${reason} onInput=${(e: Event) => setReason((e.target as HTMLInputElement).value)} /></label>
    <//>`
  }
  ${
    a.status === AgentStatus.DRAINING &&
    html`<${ConfirmButton} label="Undrain" title=${`Undrain ${a.name}`} onConfirm=${() => ops.undrainAgent({ name: a.name }).then(done)}>
    <p>${a.name} goes back to active and claims work again.</p>
  <//>`
  }
  <${ConfirmButton} label="Remove" danger title=${`Remove ${a.name}`} onConfirm=${() => ops.removeAgent({ name: a.name, force }).then(done)}>
    <p>Removes ${a.name} from the registry. It is refused while the agent holds work, unless forced (its work then goes back to the queue).</p>
    <label><input type="checkbox" checked=${force} onChange=${(e: Event) => setForce((e.target as HTMLInputElement).checked)} /> Force</label>
  <//>`;
}

/**
 * A rolling deploy's drain: every agent with the filter's tags and a version below the one given.
 * The dialog lists the agents it would drain (a dry run of the same selector, read when it opens and
 * again as the version is typed) before anyone confirms, and the agents left alone because their
 * version is not a version. The drain itself uses the selector again, so its outcome says how many
 * it drained then.
 */
function DrainSelected({ tags, onChange }: { tags: Record<string, string>; onChange: () => void }) {
  const [below, setBelow] = useState("");
  const [minutes, setMinutes] = useState("10");
  const [drained, setDrained] = useState<string | undefined>(undefined);
  const [opened, setOpened] = useState(0);
  const tagText = Object.entries(tags)
    .map(([k, v]) => `${k}=${v}`)
    .join(", ");
  const drain = async () => {
    if (below.trim() === "" && tagText === "")
      throw new Error("give a version to drain below, or filter by tags first: a drain of the whole fleet is one agent at a time");
    const res = await ops.drainAgent({
      selector: { tags, versionBelow: below.trim() },
      deadline: Number(minutes) > 0 ? durationFromMs(Number(minutes) * 60_000) : undefined,
      reason: below.trim() ? `rolling deploy: below ${below.trim()}` : "rolling deploy",
    });
    setDrained(`${res.agents.length} agents draining`);
    onChange();
  };
  return html`<${ConfirmButton} label="Drain matching…" title="Drain matching agents" confirm="Drain them" onConfirm=${drain} onOpen=${() => setOpened((n) => n + 1)}>
      <p>Drains every agent ${tagText ? `tagged ${tagText}` : ""}${tagText && below ? " and " : ""}${below ? `of a version below ${below}` : ""}${!tagText && !below ? "that matches (give a version or filter by tags)" : ""}.</p>
      <label>Version below <input value=${below} placeholder="1.10.0" onInput=${(e: Event) => setBelow((e.target as HTMLInputElement).value)} /></label>
      <label>Deadline in minutes (0: none) <input type="number" min="0" value=${minutes} onInput=${(e: Event) => setMinutes((e.target as HTMLInputElement).value)} /></label>
      ${opened > 0 && html`<${DrainPreview} tags=${tags} tagText=${tagText} below=${below.trim()} opened=${opened} />`}
    <//>
    <span role="status" class="outcome">${drained ?? ""}</span>`;
}

type Preview = { agents: AgentSummary[]; skipped: string[] } | { error: string } | undefined;

/** The agents a selector drain would hit now: DrainAgent with dry_run, which changes nothing. */
function DrainPreview({ tags, tagText, below, opened }: { tags: Record<string, string>; tagText: string; below: string; opened: number }) {
  const [preview, setPreview] = useState<Preview>(undefined);
  useEffect(() => {
    if (!tagText && !below) return setPreview(undefined);
    // Half-typed versions (`1.`) are answered here, in the daemon's words, not by a refused call each.
    if (below && !parseVersion(below)) return setPreview({ error: notAVersion(below) });
    // Answers can come back out of order while the version is typed: only the latest one is shown.
    let current = true;
    setPreview(undefined);
    ops.drainAgent({ selector: { tags, versionBelow: below }, dryRun: true }).then(
      (res) => current && setPreview({ agents: res.agents, skipped: res.versionNotComparable }),
      (err: unknown) => current && setPreview({ error: messageOf(err) }),
    );
    return () => {
      current = false;
    };
  }, [tagText, below, opened]);
  if (!tagText && !below) return null;
  if (!preview) return html`<p class="drain-preview" aria-live="polite">Finding the agents it would drain…</p>`;
  if ("error" in preview) return html`<p class="drain-preview error" aria-live="polite">${preview.error}</p>`;
  return html`<div class="drain-preview" aria-live="polite">
    <p>${preview.agents.length === 0 ? "No agent matches now: it would drain none." : `It would drain ${preview.agents.length} agent${preview.agents.length === 1 ? "" : "s"}:`}</p>
    ${
      preview.agents.length > 0 &&
      html`<ul aria-label="Agents it would drain">
      ${preview.agents.map((a) => html`<li data-preview-agent=${a.name}>${a.name} <span class="sub">${a.agentVersion || "no version"}, ${STATUS[a.status] ?? "?"}, ${a.inFlight} in flight</span></li>`)}
    </ul>`
    }
    ${preview.skipped.length > 0 && html`<p class="sub">Left alone, their version is not a version: ${preview.skipped.join(", ")}</p>`}
  </div>`;
}
