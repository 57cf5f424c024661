/**
 * The chaos run's verdict, taken from the database, with the agents' own records (their JSON-lines
 * files) only as the count of executions to hold the database against.
 *
 * Two kinds of work item share the queue: the producer's plain items (run_id IS NULL, each with an
 * idempotency key chaos-<n>) and the DAG producer's node items (run_id = a DAG run's id, task_id =
 * its aiflow_task attempt row, task_name = the node, or node[i] for a fan-out iteration). Every
 * count below says which it counts: the plain-item invariants count plain items only, and the DAG
 * node items are held to the same per-item checks under counters of their own (dagItems…).
 *
 * The plain items' invariants:
 *   - none lost: one row per enqueued idempotency key, no more, no fewer;
 *   - all done: every row completed; none pending or dispatched (stuck), failed (a dead letter) or cancelled;
 *   - none doubled: no item's completion was accepted twice, and no item ran more often than its
 *     redeliveries and retries allow (1 + redelivery_count + retry_count);
 *   - the final holder ran it: the agent the row names recorded a finished run of the item;
 *   - no live agent marked inactive: every liveness-sweep mark (the daemons' audit stream) fell in a
 *     time when the agent had no live process;
 *   - every agent active at the end.
 * The DAG runs' (every run started with an idempotency key chaos-dag-<n>):
 *   - every run started: one aiflow_run row per key;
 *   - every run ended, completed: none still running, failed or cancelled at the end;
 *   - no node completed twice: no node (or iteration) of a run has more than one completed work
 *     item, nor more than one completed attempt (aiflow_task row);
 *   - no node of a completed run without its one completed work item;
 *   - their node items held to the plain items' per-item checks: none stuck, none accepted twice,
 *     none run more often than its redeliveries allow, each completed one run by its holder.
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
  return readFileSync(file, "utf8")
    .split("\n")
    .flatMap((l) => {
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
      } else if (typeof l.rpcError === "string") r.rpcErrorsByCode[l.rpcError] = (r.rpcErrorsByCode[l.rpcError] ?? 0) + 1;
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

/** Every count is of plain items (run_id IS NULL) unless its name starts with dag. */
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
  /** DAG runs asked of the DAG producer. */
  dagRuns: number;
  /** Of those, runs in the database (by idempotency key). */
  dagRunsStarted: number;
  /** Runs completed. */
  dagRunsEnded: number;
  /** Runs started but not completed at the end (running, failed or cancelled). */
  dagRunsNotEnded: number;
  /** Nodes (a fan-out's iterations each one) of the started runs, as far as the runs got. */
  dagNodes: number;
  /** Nodes with exactly one completed work item. */
  dagNodesCompleted: number;
  /** Nodes with more than one completed work item or more than one completed attempt. */
  dagNodesDoubled: number;
  /** Nodes of completed runs without a completed work item. */
  dagNodesMissing: number;
  /** Node work items (rows with a run_id). */
  dagItems: number;
  dagItemsCompleted: number;
  dagItemsStuck: number;
  /** Node items failed for good or cancelled (their runs fail: counted there). */
  dagItemsFailed: number;
  dagItemsDoubled: number;
  dagItemsOverRun: number;
  dagItemsHolderDidNotRun: number;
  dagRedeliveries: number;
  dagRetries: number;
  dagExecutions: number;
  /** Up to five example ids per broken invariant, for the report. */
  examples: Record<string, string[]>;
}

export async function verify(
  url: string,
  enqueued: number,
  dag: { runs: number; key: (n: number) => string },
  agents: readonly string[],
  records: AgentRecords,
  auditFiles: readonly string[],
  gaps: ReadonlyMap<string, [number, number | undefined][]>,
  observedUntilMs: number,
): Promise<{ verdict: Verdict; marks: LivenessMark[] }> {
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  try {
    type ItemRow = {
      id: string;
      status: string;
      holder: string | null;
      redelivery_count: number;
      retry_count: number | null;
      idempotency_key: string | null;
      run_id: string | null;
      task_id: string | null;
      task_name: string | null;
    };
    // Every row, plain (run_id IS NULL) and DAG node items (run_id set) apart below.
    const all = (
      await c.query<ItemRow>(
        `SELECT w.id, w.status, a.name AS holder, w.redelivery_count, w.retry_count, w.idempotency_key, w.run_id, w.task_id, w.task_name
           FROM aiflow_work_item w LEFT JOIN aiflow_agent a ON w.agent_id IN (a.id, a.name)`,
      )
    ).rows;
    const items = all.filter((i) => i.run_id === null);
    const dagItems = all.filter((i) => i.run_id !== null);
    const agentRows = (await c.query<{ id: string; name: string; status: string | null }>(`SELECT id, name, status FROM aiflow_agent`)).rows;
    const examples: Record<string, string[]> = {};
    const note = (what: string, id: string) => {
      const list = (examples[what] ??= []);
      if (list.length < 5) list.push(id);
    };
    const keys = new Set(items.map((i) => i.idempotency_key));
    const lost = Array.from({ length: enqueued }, (_, n) => `chaos-${n}`).filter((k) => !keys.has(k));
    for (const k of lost) note("lost", k);
    /** The per-item checks against the agents' records, for one kind of item (`prefix` names its examples). */
    const perItem = (rows: readonly ItemRow[], prefix: string) => {
      const n = { doubled: 0, overRun: 0, holderDidNotRun: 0 };
      const key = (what: string) => (prefix ? `${prefix}${what[0]!.toUpperCase()}${what.slice(1)}` : what);
      for (const i of rows) {
        if (i.status === "pending" || i.status === "dispatched") note(key("stuck"), i.id);
        if (i.status === "failed") note(key("deadLetters"), i.id);
        const ran = records.runs.get(i.id) ?? [];
        if ((records.accepted.get(i.id) ?? 0) > 1) n.doubled++, note(key("doubled"), i.id);
        if (ran.length > 1 + i.redelivery_count + (i.retry_count ?? 0)) n.overRun++, note(key("overRun"), i.id);
        if (i.status === "completed" && (i.holder === null || !ran.includes(i.holder))) n.holderDidNotRun++, note(key("holderDidNotRun"), i.id);
      }
      return n;
    };
    const plain = perItem(items, "");
    const dagPer = perItem(dagItems, "dagItems");
    const namesById = new Map(agentRows.map((a) => [a.id, a.name]));
    const marks = readLivenessMarks(auditFiles, namesById).filter((m) => m.atMs < observedUntilMs);
    const live = marks.filter((m) => !(gaps.get(m.agent) ?? []).some(([from, to]) => m.atMs >= from && m.atMs <= (to ?? Infinity)));
    for (const m of live) note("inactiveMarkedLive", `${m.agent}@${new Date(m.atMs).toISOString()}`);
    const count = (rows: readonly ItemRow[], ...s: string[]) => rows.filter((i) => s.includes(i.status)).length;
    const executions = (rows: readonly ItemRow[]) => rows.reduce((s, i) => s + (records.runs.get(i.id)?.length ?? 0), 0);

    // The DAG runs: found by their idempotency keys; each node's completed items and attempts counted from the database.
    const dagKeys = Array.from({ length: dag.runs }, (_, n) => dag.key(n));
    const runs = (
      await c.query<{
        id: string;
        key: string;
        status: string;
        nodes: Record<string, { s: string; n?: number }>;
        plan: { name: string; fanOut: string | null }[];
      }>(
        `SELECT id, metadata ->> 'idempotencyKey' AS key, states -> -1 ->> 'state' AS status, metadata -> 'nodes' AS nodes, metadata -> 'plan' -> 'nodes' AS plan
           FROM aiflow_run WHERE runtype = 'dag' AND metadata ->> 'idempotencyKey' = ANY($1)`,
        [dagKeys],
      )
    ).rows;
    // Completed work items and completed attempts per node (task_name / aiflow_task.name: node, or node[i]).
    const completedItems = new Map<string, number>();
    for (const i of dagItems)
      if (i.status === "completed") completedItems.set(`${i.run_id}/${i.task_name}`, (completedItems.get(`${i.run_id}/${i.task_name}`) ?? 0) + 1);
    const completedAttempts = new Map(
      (
        await c.query<{ node: string; n: string }>(
          `SELECT runid || '/' || name AS node, count(*) AS n FROM aiflow_task WHERE runid = ANY($1) AND states -> -1 ->> 'state' = 'completed' GROUP BY 1`,
          [runs.map((r) => r.id)],
        )
      ).rows.map((r) => [r.node, Number(r.n)]),
    );
    let dagNodes = 0;
    let dagNodesCompleted = 0;
    let dagNodesDoubled = 0;
    let dagNodesMissing = 0;
    for (const r of runs) {
      if (r.status !== "completed") note("dagRunsNotEnded", `${r.key}=${r.id} (${r.status})`);
      // A node's names: itself, or a fan-out's iterations once it knows how many (n).
      const names = r.plan.flatMap((p) => (p.fanOut ? Array.from({ length: r.nodes[p.name]?.n ?? 0 }, (_, i) => `${p.name}[${i}]`) : [p.name]));
      for (const name of names) {
        const node = `${r.id}/${name}`;
        const itemsDone = completedItems.get(node) ?? 0;
        dagNodes++;
        if (itemsDone === 1) dagNodesCompleted++;
        if (itemsDone > 1 || (completedAttempts.get(node) ?? 0) > 1)
          dagNodesDoubled++, note("dagNodesDoubled", `${r.key}/${name}: ${itemsDone} items, ${completedAttempts.get(node) ?? 0} attempts completed`);
        if (r.status === "completed" && itemsDone === 0) dagNodesMissing++, note("dagNodesMissing", `${r.key}/${name}`);
      }
    }
    const startedKeys = new Set(runs.map((r) => r.key));
    for (const k of dagKeys.filter((k) => !startedKeys.has(k))) note("dagRunsNotStarted", k);
    const dagRunsEnded = runs.filter((r) => r.status === "completed").length;
    return {
      marks,
      verdict: {
        enqueued,
        rows: items.length,
        lost: lost.length + Math.max(0, items.length - keys.size),
        completed: count(items, "completed"),
        stuck: count(items, "pending", "dispatched"),
        deadLetters: count(items, "failed"),
        cancelled: count(items, "cancelled"),
        doubled: plain.doubled,
        overRun: plain.overRun,
        holderDidNotRun: plain.holderDidNotRun,
        inactiveMarkedLive: live.length,
        agentsNotActiveAtEnd: agents.filter((n) => agentRows.find((a) => a.name === n)?.status !== "active"),
        redeliveries: items.reduce((s, i) => s + i.redelivery_count, 0),
        retries: items.reduce((s, i) => s + (i.retry_count ?? 0), 0),
        executions: executions(items),
        dagRuns: dag.runs,
        dagRunsStarted: runs.length,
        dagRunsEnded,
        dagRunsNotEnded: runs.length - dagRunsEnded,
        dagNodes,
        dagNodesCompleted,
        dagNodesDoubled,
        dagNodesMissing,
        dagItems: dagItems.length,
        dagItemsCompleted: count(dagItems, "completed"),
        dagItemsStuck: count(dagItems, "pending", "dispatched"),
        dagItemsFailed: count(dagItems, "failed", "cancelled"),
        dagItemsDoubled: dagPer.doubled,
        dagItemsOverRun: dagPer.overRun,
        dagItemsHolderDidNotRun: dagPer.holderDidNotRun,
        dagRedeliveries: dagItems.reduce((s, i) => s + i.redelivery_count, 0),
        dagRetries: dagItems.reduce((s, i) => s + (i.retry_count ?? 0), 0),
        dagExecutions: executions(dagItems),
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
  /** INTERNAL answers on the agents' main connection and the producers'. */
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
  if (v.dagRunsStarted !== v.dagRuns) b.push(`DAG runs not started: ${v.dagRuns - v.dagRunsStarted} of ${v.dagRuns}`);
  if (v.dagRunsNotEnded > 0) b.push(`DAG runs not ended: ${v.dagRunsNotEnded}`);
  if (v.dagNodesDoubled > 0) b.push(`DAG nodes completed twice: ${v.dagNodesDoubled}`);
  if (v.dagNodesMissing > 0) b.push(`DAG nodes of completed runs with no completed item: ${v.dagNodesMissing}`);
  if (v.dagItemsStuck > 0) b.push(`DAG node items stuck ${v.dagItemsStuck}`);
  if (v.dagItemsDoubled > 0) b.push(`DAG node items doubled ${v.dagItemsDoubled}`);
  if (v.dagItemsOverRun > 0) b.push(`DAG node items ran more often than redeliveries allow ${v.dagItemsOverRun}`);
  if (v.dagItemsHolderDidNotRun > 0) b.push(`DAG node items completed by a holder with no recorded run ${v.dagItemsHolderDidNotRun}`);
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
