/**
 * The DAG section of `npm run bench` (`dag`, one of the default sections): what a DAG node costs
 * next to a plain item, in one run, on a database and daemons of its own, with the same SDK agent
 * processes (the drain's: --agents × --slots, serving the bench kind) running all three parts:
 *
 *  - plain: --dag-items items added by batch Enqueue and drained as the drain section drains
 *    (parked, released in one statement, first claim to last completion);
 *  - chain: --dag-chains runs of a 10-node chain, all started at once (StartRun, 16 calls in flight);
 *  - fan-out: --dag-fanouts runs of split → a fan-out over split's --dag-width-element result → join;
 *  - graph: --dag-chains graph runs (GraphService) of one node looping to itself 10 times, the
 *    graph engine's chain: its steps next to the DAG chain's nodes.
 *
 * A part's span is the database's: its first run's start to its last run's end. Its CPU is the
 * whole machine's and, apart, the daemons', the agents' and the daemons' Postgres backends' (their
 * sum is "own": what other load on a shared host does not reach). A node's CPU ÷ a plain item's is
 * the node overhead, against the item's drain alone and against its drain with its share of the
 * batch Enqueue (an advance enqueues each node). Hand-offs are read back from the database: a chain
 * node's predecessor's item completing (aiflow_task.endtime, from the item's completed_at) to the
 * node queued (its starttime, the advance's clock) and to its item dispatched (dispatched_at).
 */
import { create } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { DagService, DefinitionSchema, NodeKind, type Definition } from "@aiflow/wire/gen/aiflow/dag/v1/dag_pb.js";
import { GraphService, NodeKind as GraphNodeKind } from "@aiflow/wire/gen/aiflow/graph/v1/graph_pb.js";
import { freePort, KIND, openOwnDatabase, startDaemonProc, TENANT, TOKENS, type DaemonProc, type Database } from "./env.js";
import { backendCpuMeter, pollUntil, sql } from "./pg.js";
import { cpuMeter, type Child } from "./proc.js";
import { drainOurs, enqueueRate, stopAgents, type Options } from "./sections.js";
import { ratio, round, summarize } from "./stats.js";

type Figures = Record<string, number | string>;
type Emit = (name: string, figures: Figures) => void;

const CHAIN_LENGTH = 10;
const STARTS_IN_FLIGHT = 16;
/** Runs the agents and daemons take first, uncounted, so that the counted ones run on warm code. */
const WARMUP_CHAINS = 20;
const WARMUP_WIDTH = 200;
const headers = { authorization: `Bearer ${TOKENS.runs}` };

const task = (name: string, dependsOn: string[], payloadJson: string, fanOut = "") => ({
  name,
  kind: NodeKind.TASK,
  engineKind: KIND,
  payloadJson,
  dependsOn,
  fanOut,
});

const chainDefinition = (id: string): Definition =>
  create(DefinitionSchema, { id, nodes: Array.from({ length: CHAIN_LENGTH }, (_, i) => task(`n${i}`, i === 0 ? [] : [`n${i - 1}`], "{}")) });

/** split's result is {"items": [0 .. width-1]} (bench/child-agent.ts); fan runs once per element. */
const fanOutDefinition = (id: string, width: number): Definition =>
  create(DefinitionSchema, {
    id,
    nodes: [
      task("split", [], JSON.stringify({ split: width })),
      task("fan", ["split"], `{"x":"{{ item }}"}`, "context.split.items"),
      task("join", ["fan"], "{}"),
    ],
  });

/** Where the section runs: its database (its own where the role may create one), daemons and their /metrics. */
interface Place {
  db: Database;
  daemons: DaemonProc[];
  metricsUrls: string[];
  /** The daemons' Postgres backends can be told from anyone else's (a database of its own). */
  ownDatabase: boolean;
}

const table = (p: Place, name: string) => `"${p.db.schema}".aiflow_${name}`;

export async function dagSection(db: Database, o: Options, emit: Emit, progress: (msg: string) => void): Promise<void> {
  const own = await openOwnDatabase(db);
  const where: Database = own ?? {
    ...db,
    schema: `${db.schema}_dag`,
    close: async () => void (await sql(db.url, `DROP SCHEMA IF EXISTS "${db.schema}_dag" CASCADE`)),
  };
  const place: Place = { db: where, daemons: [], metricsUrls: [], ownDatabase: own !== undefined };
  let agents: Child[] | undefined;
  try {
    for (let i = 0; i < o.daemons; i++) {
      const port = await freePort();
      place.metricsUrls.push(`http://127.0.0.1:${port}/metrics`);
      place.daemons.push(await startDaemonProc(where, 500 + i, { AIFLOW_HTTP_LISTEN: `127.0.0.1:${port}` }));
    }
    progress(`dag: plain baseline, ${o.dagItems} items by ${o.agents} agents × ${o.slots} slots`);
    const plain = await plainItems(place, o);
    agents = plain.agents;
    emit("dag_plain", { ...plain.figures, own_database: place.ownDatabase ? 1 : 0 });

    const warm = { chains: Math.min(WARMUP_CHAINS, o.dagChains), width: Math.min(WARMUP_WIDTH, o.dagWidth) };
    progress(`dag: warm-up, ${warm.chains} chains and a fan-out of ${warm.width}`);
    await runPhase(place, agents, [
      { def: chainDefinition("bench-warmup-chain"), runs: warm.chains },
      { def: fanOutDefinition("bench-warmup-fanout", warm.width), runs: 1 },
    ]);

    progress(`dag: ${o.dagChains} runs of a ${CHAIN_LENGTH}-node chain at once`);
    const chainDef = chainDefinition("bench-chain");
    const chainCpu = await runPhase(place, agents, [{ def: chainDef, runs: o.dagChains }]);
    const chain: Figures = { ...(await runFigures(place, chainDef.id)), ...(await chainHandoffs(place, chainDef.id)) };
    const chainPerNode = perNode(chainCpu, Number(chain.nodes));
    emit("dag_chain", { ...chain, ...chainPerNode, ...chainCpu.steps });

    progress(`dag: ${o.dagFanOuts} runs of a ${o.dagWidth}-way fan-out at once`);
    const fanDef = fanOutDefinition("bench-fanout", o.dagWidth);
    const fanCpu = await runPhase(place, agents, [{ def: fanDef, runs: o.dagFanOuts }]);
    const fan: Figures = { width: o.dagWidth, ...(await runFigures(place, fanDef.id)), ...(await fanOutHandoffs(place, fanDef.id)) };
    const fanPerNode = perNode(fanCpu, Number(fan.nodes));
    emit("dag_fanout", { ...fan, ...fanPerNode, ...fanCpu.steps });

    progress(`dag: ${o.dagChains} graph runs of ${CHAIN_LENGTH} steps at once`);
    const graphCpu = await graphPhase(place, agents, o.dagChains);
    const graph: Figures = await graphFigures(place);
    const graphPerStep = perNode(graphCpu, Number(graph.steps));
    emit("graph_chain", { ...graph, ...Object.fromEntries(Object.entries(graphPerStep).map(([k, v]) => [k.replace(/_per_node$/, "_per_step"), v])) });

    const p = plain.figures;
    const drainOnly = Number(p.machine_cpu_us_per_item);
    const withEnqueue = drainOnly + Number(p.enqueue_machine_cpu_us_per_item);
    const ownPlain = Number(p.own_cpu_us_per_item);
    emit("dag_ratio", {
      plain_items_per_s: Number(p.items_per_s),
      chain_nodes_per_s: Number(chain.nodes_per_s),
      fanout_nodes_per_s: Number(fan.nodes_per_s),
      chain_nodes_per_s_over_plain: ratio(Number(chain.nodes_per_s), Number(p.items_per_s)),
      fanout_nodes_per_s_over_plain: ratio(Number(fan.nodes_per_s), Number(p.items_per_s)),
      plain_cpu_us_per_item: drainOnly,
      plain_with_enqueue_cpu_us_per_item: round(withEnqueue, 1),
      chain_cpu_us_per_node: Number(chainPerNode.machine_cpu_us_per_node),
      fanout_cpu_us_per_node: Number(fanPerNode.machine_cpu_us_per_node),
      chain_node_over_plain: ratio(Number(chainPerNode.machine_cpu_us_per_node), drainOnly),
      fanout_node_over_plain: ratio(Number(fanPerNode.machine_cpu_us_per_node), drainOnly),
      graph_steps_per_s: Number(graph.steps_per_s),
      graph_steps_per_s_over_chain_nodes: ratio(Number(graph.steps_per_s), Number(chain.nodes_per_s)),
      graph_step_over_chain_node: ratio(Number(graphPerStep.machine_cpu_us_per_node), Number(chainPerNode.machine_cpu_us_per_node)),
      chain_node_over_plain_with_enqueue: ratio(Number(chainPerNode.machine_cpu_us_per_node), withEnqueue),
      fanout_node_over_plain_with_enqueue: ratio(Number(fanPerNode.machine_cpu_us_per_node), withEnqueue),
      ...(Number.isFinite(ownPlain)
        ? {
            plain_own_cpu_us_per_item: ownPlain,
            chain_own_node_over_plain: ratio(Number(chainPerNode.own_cpu_us_per_node), ownPlain),
            fanout_own_node_over_plain: ratio(Number(fanPerNode.own_cpu_us_per_node), ownPlain),
          }
        : {}),
    });
  } finally {
    if (agents) await stopAgents(agents);
    await Promise.all(place.daemons.map((d) => d.child.stop()));
    await where.close();
  }
}

/**
 * The plain baseline: its batch Enqueue metered (daemons and their backends: no agent runs yet),
 * then drained by fresh agents, which stay up for the DAG parts.
 */
async function plainItems(p: Place, o: Options): Promise<{ figures: Figures; agents: Child[] }> {
  const daemonPids = p.daemons.map((d) => d.child.pid);
  const meter = cpuMeter({ daemons: daemonPids });
  const pg = await postgresMeter(p);
  const enq = await enqueueRate(p.daemons, o.dagItems);
  const cpu = meter();
  const pgMs = await pg();
  const n = o.dagItems;
  const us = (ms: number) => round((ms * 1000) / n, 1);
  const enqueue: Figures = {
    enqueue_items_per_s: enq.items_per_s!,
    ...(cpu.machineMs === null ? {} : { enqueue_machine_cpu_us_per_item: us(cpu.machineMs) }),
    enqueue_daemons_cpu_us_per_item: us(cpu.groupMs.daemons!),
    ...(pgMs === null ? {} : { enqueue_postgres_cpu_us_per_item: us(pgMs) }),
  };
  const drain = await drainOurs(p.db, p.daemons, { ...o, items: n }, "plain", async () => {
    const stop = await postgresMeter(p);
    return async () => ({ postgres: await stop() });
  });
  const f = drain.figures;
  const own: Figures =
    f.postgres_cpu_us_per_item === undefined || enqueue.enqueue_postgres_cpu_us_per_item === undefined
      ? {}
      : {
          // The item's whole life in our processes: its share of the Enqueue, and its drain.
          own_cpu_us_per_item: round(
            Number(enqueue.enqueue_daemons_cpu_us_per_item) +
              Number(enqueue.enqueue_postgres_cpu_us_per_item) +
              Number(f.daemon_cpu_us_per_item) +
              Number(f.agents_cpu_us_per_item) +
              Number(f.postgres_cpu_us_per_item),
            1,
          ),
        };
  return { figures: { ...f, ...enqueue, ...own }, agents: drain.agents };
}

/** The daemons' backends' CPU (ms), or null where they cannot be told apart (no database of its own). */
async function postgresMeter(p: Place): Promise<() => Promise<number | null>> {
  if (!p.ownDatabase) return async () => null;
  return backendCpuMeter(p.db.url);
}

interface PhaseCpu {
  machineMs: number | null;
  daemonsMs: number;
  agentsMs: number;
  postgresMs: number | null;
  /** The daemons' advances in the window (their /metrics). */
  steps: Figures;
}

/** Makes `n` start calls, STARTS_IN_FLIGHT at a time; `start(i)` makes the i-th. */
async function startAll(n: number, start: (i: number) => Promise<unknown>): Promise<void> {
  let next = 0;
  await Promise.all(
    Array.from({ length: Math.min(STARTS_IN_FLIGHT, n) }, async () => {
      while (next < n) await start(next++);
    }),
  );
}

/**
 * Starts each part's runs of its definition (STARTS_IN_FLIGHT calls at a time, over the daemons in
 * turn) and waits until all have ended; the CPU of the machine and of each group meanwhile.
 */
async function runPhase(p: Place, agents: Child[], parts: { def: Definition; runs: number }[]): Promise<PhaseCpu> {
  // Fresh statistics and no dead rows left for autovacuum to clean up in the middle of the part.
  // The earlier parts' finished items stay: analysed empty, the queue's table is planned as a
  // tiny one (scanned whole by statements that run per node), which it is not in a queue that
  // has been running; the figures read only this part's runs.
  for (const t of ["work_item", "run", "task", "engine_event", "checkpoint"]) await sql(p.db.url, `VACUUM (ANALYZE) ${table(p, t)}`);
  const clients = p.daemons.map((d) => createClient(DagService, createGrpcTransport({ baseUrl: d.url })));
  const before = await advances(p);
  const meter = cpuMeter({ daemons: p.daemons.map((d) => d.child.pid), agents: agents.map((a) => a.pid) });
  const pg = await postgresMeter(p);
  const starts = parts.flatMap(({ def, runs }) => Array.from({ length: runs }, () => def));
  await startAll(starts.length, (i) =>
    clients[i % clients.length]!.startRun({ tenantKey: TENANT, source: { case: "definition", value: starts[i]! }, contextJson: "{}" }, { headers }),
  );
  // The definition ids are this file's constants, so they may stand in the statement's text.
  const ids = parts.map(({ def }) => `'${def.id}'`).join(", ");
  await pollUntil<{ live: string; n: string }>(
    p.db.url,
    `SELECT count(*) FILTER (WHERE endtime IS NULL) AS live, count(*) AS n FROM ${table(p, "run")} WHERE definitionid IN (${ids})`,
    (r) => Number(r.live) === 0 && Number(r.n) >= starts.length,
    600_000,
    `${starts.length} runs of ${ids}`,
  );
  const cpu = meter();
  const postgresMs = await pg();
  const after = await advances(p);
  const steps = after.count - before.count;
  return {
    machineMs: cpu.machineMs,
    daemonsMs: cpu.groupMs.daemons!,
    agentsMs: cpu.groupMs.agents!,
    postgresMs,
    steps: {
      advances: steps,
      advance_mean_ms: steps > 0 ? round(((after.seconds - before.seconds) * 1000) / steps, 2) : Number.NaN,
      events_per_advance: steps > 0 ? round((after.events - before.events) / steps, 1) : Number.NaN,
    },
  };
}

/** `runs` graph runs of a node looping CHAIN_LENGTH times, started at once; the CPU meanwhile. */
async function graphPhase(p: Place, agents: Child[], runs: number): Promise<PhaseCpu> {
  for (const t of ["work_item", "graph_run", "engine_event"]) await sql(p.db.url, `VACUUM (ANALYZE) ${table(p, t)}`);
  const clients = p.daemons.map((d) => createClient(GraphService, createGrpcTransport({ baseUrl: d.url })));
  const meter = cpuMeter({ daemons: p.daemons.map((d) => d.child.pid), agents: agents.map((a) => a.pid) });
  const pg = await postgresMeter(p);
  const definition = {
    id: "bench-graph",
    start: "step",
    nodes: [
      { name: "step", kind: GraphNodeKind.TASK, engineKind: KIND, payloadJson: "{}" },
      { name: "done", kind: GraphNodeKind.END },
    ],
    edges: [
      { from: "step", to: "done", when: `steps >= ${CHAIN_LENGTH}` },
      { from: "step", to: "step" },
    ],
  };
  await startAll(runs, (i) => clients[i % clients.length]!.startRun({ tenantKey: TENANT, source: { case: "definition", value: definition } }, { headers }));
  await pollUntil<{ live: string; n: string }>(
    p.db.url,
    `SELECT count(*) FILTER (WHERE status = 'running') AS live, count(*) AS n FROM ${table(p, "graph_run")}`,
    (r) => Number(r.live) === 0 && Number(r.n) >= runs,
    600_000,
    `${runs} graph runs`,
  );
  const cpu = meter();
  return { machineMs: cpu.machineMs, daemonsMs: cpu.groupMs.daemons!, agentsMs: cpu.groupMs.agents!, postgresMs: await pg(), steps: {} };
}

/** The graph runs from the database: how many reached their end node, steps a second, and each step's hand-off from the last one's item completing to its own item queued. */
async function graphFigures(p: Place): Promise<Figures> {
  const [r] = await sql<{ runs: string; completed: string; steps: string; span_ms: string }>(
    p.db.url,
    `SELECT count(*) AS runs, count(*) FILTER (WHERE status = 'completed') AS completed, sum(steps) AS steps,
            extract(epoch FROM max(updatedon) - min(createdon)) * 1000 AS span_ms FROM ${table(p, "graph_run")}`,
  );
  const handoffs = await sql<{ ms: string }>(
    p.db.url,
    `SELECT (extract(epoch FROM b.createdon) * 1e3 - a.completed_at / 1e6) AS ms
       FROM ${table(p, "work_item")} a JOIN ${table(p, "work_item")} b
         ON b.run_id = a.run_id AND b.task_id = 'graph:' || (substr(a.task_id, 7)::int + 1)
      WHERE a.task_id LIKE 'graph:%'`,
  );
  const h = summarize(handoffs.map((x) => Number(x.ms)));
  const seconds = Number(r!.span_ms) / 1000;
  return {
    runs: Number(r!.runs),
    completed: Number(r!.completed),
    steps: Number(r!.steps),
    seconds: round(seconds, 3),
    steps_per_s: round(Number(r!.steps) / seconds, 0),
    handoff_queued_p50_ms: round(h.p50, 2),
    handoff_queued_p99_ms: round(h.p99, 2),
  };
}

/** The daemons' advances so far: how many, their transactions' seconds in all, and the events they applied. */
async function advances(p: Place): Promise<{ count: number; seconds: number; events: number }> {
  const out = { count: 0, seconds: 0, events: 0 };
  for (const url of p.metricsUrls) {
    const text = await (await fetch(url)).text();
    const value = (re: RegExp) => Number(re.exec(text)?.[1] ?? 0);
    out.count += value(/^aiflow_engine_step_seconds_count\{engine="dag",kind="advance"\} (\S+)$/m);
    out.seconds += value(/^aiflow_engine_step_seconds_sum\{engine="dag",kind="advance"\} (\S+)$/m);
    out.events += value(/^aiflow_engine_events_total\{engine="dag"\} (\S+)$/m);
  }
  return out;
}

function perNode(cpu: PhaseCpu, nodes: number): Figures {
  const us = (ms: number) => round((ms * 1000) / nodes, 1);
  return {
    ...(cpu.machineMs === null ? {} : { machine_cpu_us_per_node: us(cpu.machineMs) }),
    daemons_cpu_us_per_node: us(cpu.daemonsMs),
    agents_cpu_us_per_node: us(cpu.agentsMs),
    ...(cpu.postgresMs === null
      ? {}
      : { postgres_cpu_us_per_node: us(cpu.postgresMs), own_cpu_us_per_node: us(cpu.daemonsMs + cpu.agentsMs + cpu.postgresMs) }),
  };
}

const ms = (ns: bigint) => Number(ns) / 1e6;

/** A part's runs from the database: how many completed, its span, its rates, and each run's duration. */
async function runFigures(p: Place, definitionId: string): Promise<Figures> {
  const runs = await sql<{ starttime: string; endtime: string; state: string; nodes: string }>(
    p.db.url,
    `SELECT r.starttime, r.endtime, r.states -> -1 ->> 'state' AS state, (SELECT count(*) FROM ${table(p, "task")} t WHERE t.runid = r.id) AS nodes
       FROM ${table(p, "run")} r WHERE r.definitionid = $1`,
    [definitionId],
  );
  const starts = runs.map((r) => BigInt(r.starttime));
  const ends = runs.map((r) => BigInt(r.endtime));
  const spanMs = ms(ends.reduce((a, b) => (b > a ? b : a)) - starts.reduce((a, b) => (b < a ? b : a)));
  const nodes = runs.reduce((s, r) => s + Number(r.nodes), 0);
  const durations = summarize(runs.map((r) => ms(BigInt(r.endtime) - BigInt(r.starttime))));
  return {
    runs: runs.length,
    completed: runs.filter((r) => r.state === "completed").length,
    nodes,
    seconds: round(spanMs / 1000, 3),
    runs_per_s: round(runs.length / (spanMs / 1000), 1),
    nodes_per_s: round(nodes / (spanMs / 1000), 0),
    run_p50_ms: round(durations.p50, 1),
    run_p99_ms: round(durations.p99, 1),
    run_max_ms: round(durations.max, 1),
  };
}

interface Attempt {
  runid: string;
  name: string;
  starttime: string;
  endtime: string;
  dispatched_at: string;
}

const attempts = (p: Place, definitionId: string) =>
  sql<Attempt>(
    p.db.url,
    `SELECT t.runid, t.name, t.starttime, t.endtime, w.dispatched_at
       FROM ${table(p, "task")} t JOIN ${table(p, "run")} r ON r.id = t.runid
       JOIN ${table(p, "work_item")} w ON w.task_id = t.id AND w.run_id = t.runid
      WHERE r.definitionid = $1`,
    [definitionId],
  );

const byRun = (rows: Attempt[]) => {
  const runs = new Map<string, Map<string, Attempt>>();
  for (const r of rows) {
    let m = runs.get(r.runid);
    if (!m) runs.set(r.runid, (m = new Map()));
    m.set(r.name, r);
  }
  return runs;
};

/**
 * Each chain node after the first: from its predecessor's item completing to the node queued
 * (the advance) and to its item dispatched to an agent (the advance and the queue's dispatch).
 */
async function chainHandoffs(p: Place, definitionId: string): Promise<Figures> {
  const queued: number[] = [];
  const dispatched: number[] = [];
  for (const nodes of byRun(await attempts(p, definitionId)).values())
    for (let i = 1; i < CHAIN_LENGTH; i++) {
      const prev = nodes.get(`n${i - 1}`);
      const cur = nodes.get(`n${i}`);
      if (!prev || !cur) continue;
      queued.push(ms(BigInt(cur.starttime) - BigInt(prev.endtime)));
      dispatched.push(ms(BigInt(cur.dispatched_at) - BigInt(prev.endtime)));
    }
  const q = summarize(queued);
  const d = summarize(dispatched);
  return {
    handoffs: q.count,
    queued_p50_ms: round(q.p50, 2),
    queued_p99_ms: round(q.p99, 2),
    dispatched_p50_ms: round(d.p50, 2),
    dispatched_p99_ms: round(d.p99, 2),
  };
}

/**
 * Each fan-out run's hand-offs (means over the runs): split's item completing to the first
 * iteration dispatched; the first iteration dispatched to the last one completed; the last one
 * completed to join dispatched.
 */
async function fanOutHandoffs(p: Place, definitionId: string): Promise<Figures> {
  const toFan: number[] = [];
  const spread: number[] = [];
  const toJoin: number[] = [];
  for (const nodes of byRun(await attempts(p, definitionId)).values()) {
    const split = nodes.get("split");
    const join = nodes.get("join");
    const its = [...nodes.values()].filter((a) => a.name.startsWith("fan["));
    if (!split || !join || its.length === 0) continue;
    const firstOut = its.map((a) => BigInt(a.dispatched_at)).reduce((a, b) => (b < a ? b : a));
    const lastDone = its.map((a) => BigInt(a.endtime)).reduce((a, b) => (b > a ? b : a));
    toFan.push(ms(firstOut - BigInt(split.endtime)));
    spread.push(ms(lastDone - firstOut));
    toJoin.push(ms(BigInt(join.dispatched_at) - lastDone));
  }
  const mean = (xs: number[]) => round(summarize(xs).mean, 2);
  return { split_to_fan_ms: mean(toFan), fan_ms: mean(spread), fan_to_join_ms: mean(toJoin) };
}
