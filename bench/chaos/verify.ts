/**
 * The chaos run's verdict, taken from the database, with the agents' own records (their JSON-lines
 * files) only as the count of executions to hold the database against. The invariants:
 *   - none lost: one row per enqueued idempotency key, no more, no fewer;
 *   - all done: every row completed; none pending or dispatched (stuck), failed (a dead letter) or cancelled;
 *   - none doubled: no item's completion was accepted twice, and no item ran more often than its
 *     redeliveries and retries allow (1 + redelivery_count + retry_count);
 *   - the final holder ran it: the agent the row names recorded a finished run of the item;
 *   - no live agent marked inactive: every liveness-sweep mark (the daemons' audit stream) fell in a
 *     time when the agent had no live process;
 *   - every agent active at the end.
 * and, from the run itself (broken()'s RunChecks):
 *   - every fault recovered: after it was lifted, an item completed within the recovery timeout
 *     (unless nothing was left to do);
 *   - no result refused: an agent that finished a run never heard "lease lost" for it (a killed
 *     agent reports nothing, so it cannot be refused: any refusal is a live agent's lost work);
 *   - no INTERNAL answer on the agents' main connection or the producer's;
 *   - no process hung on SIGTERM: every agent at the end, and every daemon of a graceful restart,
 *     exited within its bound;
 *   - no process died on its own.
 */
import { existsSync, readFileSync } from "node:fs";
import pg from "pg";

export interface AgentRecords {
  /** Finished handler runs per item, by agent name. */
  runs: Map<string, string[]>;
  /** Accepted completions per item. */
  accepted: Map<string, number>;
  /** Completions refused because the lease had been lost (a zombie's result): items with a finished run and a lease-lost outcome in one process. */
  refusedZombie: number;
  /** The items of those refusals (up to five), for the report. */
  refusedIds: string[];
  /** Every outcome the agents were told, by kind (completed, lease-lost, unreported, …). */
  outcomes: Record<string, number>;
  rpcErrorsByCode: Record<string, number>;
}

function jsonLines(file: string): Record<string, unknown>[] {
  if (!existsSync(file)) return [];
  // A kill -9 can cut the last line short; it is the one line that may not parse.
  return readFileSync(file, "utf8").split("\n").flatMap((l) => {
    try {
      return l ? [JSON.parse(l) as Record<string, unknown>] : [];
    } catch {
      return [];
    }
  });
}

export function readAgentRecords(files: readonly string[]): AgentRecords {
  const r: AgentRecords = { runs: new Map(), accepted: new Map(), refusedZombie: 0, refusedIds: [], outcomes: {}, rpcErrorsByCode: {} };
  for (const file of files) {
    const agent = /(chaos-agent-\d+)\.g\d+\.jsonl$/.exec(file)![1]!;
    const ranHere = new Set<string>();
    for (const l of jsonLines(file)) {
      if (typeof l.outcome === "string") r.outcomes[l.outcome] = (r.outcomes[l.outcome] ?? 0) + 1;
      if (typeof l.run === "string") {
        ranHere.add(l.run);
        r.runs.set(l.run, [...(r.runs.get(l.run) ?? []), agent]);
      } else if (l.outcome === "completed") r.accepted.set(l.id as string, (r.accepted.get(l.id as string) ?? 0) + 1);
      else if (l.outcome === "lease-lost" && ranHere.has(l.id as string)) {
        r.refusedZombie++;
        if (r.refusedIds.length < 5) r.refusedIds.push(`${l.id as string}@${agent}`);
      }
      else if (typeof l.rpcError === "string") r.rpcErrorsByCode[l.rpcError] = (r.rpcErrorsByCode[l.rpcError] ?? 0) + 1;
    }
  }
  return r;
}

export interface LivenessMark {
  agent: string;
  atMs: number;
}

/** The liveness sweep's inactive marks from the daemons' audit files, named by agent. */
export function readLivenessMarks(files: readonly string[], namesById: ReadonlyMap<string, string>): LivenessMark[] {
  return files.flatMap((f) =>
    jsonLines(f)
      .filter((l) => l.stream === "audit" && l.by === "liveness-sweep" && l.table === "agent")
      .flatMap((l) => (l.ids as string[]).map((id) => ({ agent: namesById.get(id) ?? id, atMs: Date.parse(l.at as string) }))),
  );
}

export interface Verdict {
  enqueued: number;
  rows: number;
  lost: number;
  completed: number;
  stuck: number;
  deadLetters: number;
  cancelled: number;
  doubled: number;
  overRun: number;
  holderDidNotRun: number;
  inactiveMarkedLive: number;
  agentsNotActiveAtEnd: string[];
  redeliveries: number;
  retries: number;
  executions: number;
  /** Up to five example ids per broken invariant, for the report. */
  examples: Record<string, string[]>;
}

export async function verify(
  url: string,
  enqueued: number,
  agents: readonly string[],
  records: AgentRecords,
  auditFiles: readonly string[],
  gaps: ReadonlyMap<string, [number, number | undefined][]>,
  observedUntilMs: number,
): Promise<{ verdict: Verdict; marks: LivenessMark[] }> {
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  try {
    const items = (
      await c.query<{ id: string; status: string; holder: string | null; redelivery_count: number; retry_count: number | null; idempotency_key: string | null }>(
        `SELECT w.id, w.status, a.name AS holder, w.redelivery_count, w.retry_count, w.idempotency_key
           FROM aiflow_work_item w LEFT JOIN aiflow_agent a ON w.agent_id IN (a.id, a.name)`,
      )
    ).rows;
    const agentRows = (await c.query<{ id: string; name: string; status: string | null }>(`SELECT id, name, status FROM aiflow_agent`)).rows;
    const examples: Record<string, string[]> = {};
    const note = (what: string, id: string) => {
      const list = (examples[what] ??= []);
      if (list.length < 5) list.push(id);
    };
    const keys = new Set(items.map((i) => i.idempotency_key));
    const lost = Array.from({ length: enqueued }, (_, n) => `chaos-${n}`).filter((k) => !keys.has(k));
    for (const k of lost) note("lost", k);
    let doubled = 0;
    let overRun = 0;
    let holderDidNotRun = 0;
    for (const i of items) {
      if (i.status === "pending" || i.status === "dispatched") note("stuck", i.id);
      if (i.status === "failed") note("deadLetters", i.id);
      const ran = records.runs.get(i.id) ?? [];
      if ((records.accepted.get(i.id) ?? 0) > 1) (doubled++, note("doubled", i.id));
      if (ran.length > 1 + i.redelivery_count + (i.retry_count ?? 0)) (overRun++, note("overRun", i.id));
      if (i.status === "completed" && (i.holder === null || !ran.includes(i.holder))) (holderDidNotRun++, note("holderDidNotRun", i.id));
    }
    const namesById = new Map(agentRows.map((a) => [a.id, a.name]));
    const marks = readLivenessMarks(auditFiles, namesById).filter((m) => m.atMs < observedUntilMs);
    const live = marks.filter((m) => !(gaps.get(m.agent) ?? []).some(([from, to]) => m.atMs >= from && m.atMs <= (to ?? Infinity)));
    for (const m of live) note("inactiveMarkedLive", `${m.agent}@${new Date(m.atMs).toISOString()}`);
    const count = (s: string) => items.filter((i) => i.status === s).length;
    return {
      marks,
      verdict: {
        enqueued,
        rows: items.length,
        lost: lost.length + Math.max(0, items.length - keys.size),
        completed: count("completed"),
        stuck: count("pending") + count("dispatched"),
        deadLetters: count("failed"),
        cancelled: count("cancelled"),
        doubled,
        overRun,
        holderDidNotRun,
        inactiveMarkedLive: live.length,
        agentsNotActiveAtEnd: agents.filter((n) => agentRows.find((a) => a.name === n)?.status !== "active"),
        redeliveries: items.reduce((s, i) => s + i.redelivery_count, 0),
        retries: items.reduce((s, i) => s + (i.retry_count ?? 0), 0),
        executions: [...records.runs.values()].reduce((s, r) => s + r.length, 0),
        examples,
      },
    };
  } finally {
    await c.end();
  }
}

/** What the run itself saw, beside the database: its faults' recoveries, the agents' answers, its processes' exits. */
export interface RunChecks {
  crashes: number;
  /** Finished runs whose result was refused (records.refusedZombie). */
  refused: number;
  /** INTERNAL answers on the agents' main connection and the producer's. */
  internal: number;
  /** Faults after which nothing completed within the recovery timeout while work was open. */
  unrecovered: { kind: string; at: string; open: number }[];
  recoveryTimeoutMs: number;
  /** Processes that did not exit within their bound on SIGTERM (agents at the end, daemons of a daemon-term). */
  hung: { process: string; at: string; boundMs: number }[];
}

/** The invariants that must hold for the run to pass. */
export function broken(v: Verdict, x: RunChecks): string[] {
  const b: string[] = [];
  if (v.lost > 0 || v.rows !== v.enqueued) b.push(`lost ${v.lost} (rows ${v.rows} for ${v.enqueued} enqueued)`);
  if (v.stuck > 0) b.push(`stuck ${v.stuck}`);
  if (v.deadLetters > 0) b.push(`dead letters ${v.deadLetters}`);
  if (v.cancelled > 0) b.push(`cancelled ${v.cancelled}`);
  if (v.doubled > 0) b.push(`doubled ${v.doubled}`);
  if (v.overRun > 0) b.push(`ran more often than redeliveries allow ${v.overRun}`);
  if (v.holderDidNotRun > 0) b.push(`completed by a holder with no recorded run ${v.holderDidNotRun}`);
  if (v.inactiveMarkedLive > 0) b.push(`live agents marked inactive ${v.inactiveMarkedLive}`);
  if (v.agentsNotActiveAtEnd.length > 0) b.push(`agents not active at the end: ${v.agentsNotActiveAtEnd.join(", ")}`);
  for (const u of x.unrecovered) b.push(`fault ${u.kind} at ${u.at}: no completion within ${x.recoveryTimeoutMs / 1000} s (${u.open} items open)`);
  if (x.refused > 0) b.push(`results refused (lease lost) ${x.refused}`);
  if (x.internal > 0) b.push(`INTERNAL answers ${x.internal}`);
  const agentsHung = x.hung.filter((h) => h.process.startsWith("chaos-agent-"));
  const daemonsHung = x.hung.filter((h) => !h.process.startsWith("chaos-agent-"));
  if (agentsHung.length > 0) b.push(`agents hung on SIGTERM: ${agentsHung.map((h) => `${h.process} (over ${h.boundMs / 1000} s)`).join(", ")}`);
  if (daemonsHung.length > 0) b.push(`daemons hung on SIGTERM: ${daemonsHung.map((h) => `${h.process} at ${h.at} (over ${h.boundMs / 1000} s)`).join(", ")}`);
  if (x.crashes > 0) b.push(`processes that died on their own ${x.crashes}`);
  return b;
}
