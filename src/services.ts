/**
 * Every service the daemon serves, with the role that may call it, and the background work beside
 * them. Deny by default: the auth interceptor refuses any service that is not listed here, so adding
 * a service means saying who may call it.
 *
 * This is the composition root: it builds the stores, the queue, the engines, the triggers and the
 * handlers and wires them together, so it sits beside daemon.ts, above every layer it assembles
 * (test/layers.test.ts), and nothing but the daemon imports it.
 */
import type { DescFile, DescService } from "@bufbuild/protobuf";
import type { ConnectRouter } from "@connectrpc/connect";
import { unplaceableTask } from "./fleet/unplaceable-work-sweep.js";
import { pino } from "pino";
import type { DatabasePool } from "slonik";
import { AuditLog } from "./audit.js";
import type { Clock } from "./clock.js";
import type { Config } from "./config.js";
import { PgListener } from "./db/notify.js";
import { PreparedQueries } from "./db/prepared.js";
import { poolUsage } from "./db/admission.js";
import { FleetGauges } from "./observability/fleet-gauges.js";
import type { DaemonMetrics } from "./observability/metrics.js";
import { Readiness } from "./observability/readiness.js";
import type { Tables } from "./db/tables.js";
import { AgentService, file_aiflow_cluster_v1_agent } from "@aiflow/wire/gen/aiflow/cluster/v1/agent_pb.js";
import { file_aiflow_cluster_v1_ops, OpsService } from "@aiflow/wire/gen/aiflow/cluster/v1/ops_pb.js";
import { file_aiflow_cluster_v1_queue, QueueService } from "@aiflow/wire/gen/aiflow/cluster/v1/queue_pb.js";
import { file_aiflow_cluster_v1_runs, RunDirectoryService, TriggerFiringService } from "@aiflow/wire/gen/aiflow/cluster/v1/runs_pb.js";
import { DagOpsService, DagService, file_aiflow_dag_v1_dag } from "@aiflow/wire/gen/aiflow/dag/v1/dag_pb.js";
import { Engines } from "./engines/engines.js";
import { file_aiflow_trigger_v1_trigger, TriggerService } from "@aiflow/wire/gen/aiflow/trigger/v1/trigger_pb.js";
import { TriggerStore } from "./store/triggers.js";
import { cronTask } from "./triggers/cron.js";
import { applyTriggersFile, readTriggersFile } from "./triggers/file.js";
import { TriggerFirer } from "./triggers/firer.js";
import { webhookHandler } from "./triggers/webhook.js";
import { AuthFailures } from "./server/auth-failures.js";
import { triggerServiceImpl } from "./rpc/trigger-service.js";
import { dagOpsServiceImpl, dagServiceImpl } from "./rpc/dag-service.js";
import { graphServiceImpl } from "./rpc/graph-service.js";
import { machineServiceImpl } from "./rpc/machine-service.js";
import { file_aiflow_graph_v1_graph, GraphService } from "@aiflow/wire/gen/aiflow/graph/v1/graph_pb.js";
import { file_aiflow_machine_v1_machine, MachineService } from "@aiflow/wire/gen/aiflow/machine/v1/machine_pb.js";
import { file_grpc_health_v1_health, Health, HealthCheckResponse_ServingStatus } from "@aiflow/wire/gen/grpc/health/v1/health_pb.js";
import { ServerReflection } from "@aiflow/wire/gen/grpc/reflection/v1/reflection_pb.js";
import { ServerReflection as ServerReflectionAlpha } from "@aiflow/wire/gen/grpc/reflection/v1alpha/reflection_pb.js";
import type { Logger } from "./log.js";
import type { Access } from "./server/auth.js";
import { HealthState, healthRoutes } from "./server/health.js";
import { reflectionRoutes } from "./server/reflection.js";
import { AffinityBindingStore } from "./store/affinity-bindings.js";
import { AgentOpsStore, AgentStore } from "./store/agents.js";
import { ConcurrencyKeyStore } from "./store/concurrency-keys.js";
import { RateLimitStore } from "./store/rate-limits.js";
import { TenantShareStore } from "./store/tenant-shares.js";
import { WorkItemStatsStore } from "./store/work-item-stats.js";
import { EngineStore } from "./store/engines.js";
import { EngineRunStore } from "./store/engine-runs.js";
import { DefinitionReads } from "./store/definitions.js";
import { TriggerFiringStore } from "./store/trigger-firings.js";
import { WorkItemStore } from "./store/work-items.js";
import { agentServiceImpl, knownAgentLoader } from "./rpc/agent-service/registration.js";
import { agentWorkImpl } from "./rpc/agent-service/work.js";
import { agentStreamImpl } from "./rpc/agent-service/stream.js";
import { agentReports } from "./rpc/agent-service/reports.js";
import { ANY, Wakeups } from "./queue/wakeups.js";
import { WorkQueue } from "./queue/work-queue.js";
import { queueServiceImpl } from "./rpc/queue-service.js";
import { drainDeadlineTask, opsServiceImpl } from "./rpc/ops-service.js";
import { DirectiveHub } from "./fleet/directives.js";
import { HeartbeatBuffer } from "./fleet/heartbeat-buffer.js";
import { agentLivenessTask, engineLivenessTask } from "./fleet/liveness.js";
import { Maintenance } from "./maintenance.js";
import { firingRetentionTask, runDirectoryServiceImpl, triggerFiringServiceImpl } from "./rpc/runs-service.js";

export interface ServiceDeps {
  config: Config;
  log: Logger;
  clock: Clock;
  pool: DatabasePool;
  tables: Tables;
  databaseUrl: string;
  /** Aborted when shutdown begins; long-polls and streams return early. */
  draining: AbortSignal;
  /** Where the services, sweeps and loops report for /metrics. */
  metrics: DaemonMetrics;
}

/** A loop the daemon runs beside the server (sweeps, flushers, listeners). */
export interface Background {
  stop(): Promise<void>;
}

export interface Services {
  routes: (router: ConnectRouter) => void;
  access: ReadonlyMap<string, Access>;
  background: Background[];
  /** Runs the sweeps and flushes now (tests drive these with a fake clock). */
  maintenance: { runOnce(): Promise<void>; flushHeartbeats(): Promise<void> };
  /** Called first on shutdown: health reports NOT_SERVING and watchers end. */
  onShutdown(): void;
  /** What /readyz answers. */
  readiness: Readiness;
  /** Serves POST /hooks/<tenant>/<trigger> on the HTTP port. */
  webhooks: ReturnType<typeof webhookHandler>;
}

/** Routes for one or more services, and the role that may call them. */
interface Mounted {
  services: DescService[];
  access: Access;
  mount: (router: ConnectRouter) => void;
}

/**
 * Builds and starts every service. What it started is stopped again when a later step throws (a
 * triggers file that does not check, the database gone mid-start): a daemon that cannot start must
 * exit, and loops left running kept the process alive, logging, for ever.
 */
export async function buildServices(deps: ServiceDeps): Promise<Services> {
  const started: Background[] = [];
  try {
    return await startServices(deps, (b) => started.push(b));
  } catch (err) {
    for (const b of started.reverse()) await b.stop().catch((e: unknown) => deps.log.error({ err: e }, "error while stopping what a failed start had started"));
    throw err;
  }
}

async function startServices(deps: ServiceDeps, started: (b: Background) => void): Promise<Services> {
  const { config, log, clock, pool, tables, metrics } = deps;
  const audit = new AuditLog(config.auditLog ? pino({ name: "aiflowd.audit" }, pino.destination({ dest: config.auditLog, sync: false, mkdir: true })) : log);
  const listener = new PgListener(deps.databaseUrl, log.child({ component: "listen" }));
  await listener.start();
  started(listener);
  listener.onReconnect(() => metrics.listenReconnected());

  const agents = new AgentStore(pool, tables);
  const engines = new EngineStore(pool, tables);
  const hub = new DirectiveHub(pool, tables.channel("directive"), clock, log, 2 * config.heartbeatInterval);
  await hub.start(listener);

  const hot = new PreparedQueries(deps.databaseUrl, config.dbPoolSize);
  started({ stop: () => hot.end() });
  const backoff = { baseMs: config.backoffBase, capMs: config.backoffCap, jitter: config.backoffJitter === "full" };
  const sharing = { weights: config.tenantWeights, credit: config.fairShareCredit, agingMs: config.priorityAging };
  const workItems = new WorkItemStore(pool, tables, backoff, hot, sharing);
  const work = new Wakeups(pool, tables.channel("work"), config.instanceId, config.notifyWindow, log);
  // Completions come in a stream while agents work, and only Wait calls on other daemons need to hear
  // of them: a longer window turns a NOTIFY per few ms (each a statement, and a signal to every
  // listening connection) into a few per second. This daemon's own Wait calls wake at once.
  const done = new Wakeups(pool, tables.channel("done"), config.instanceId, config.doneNotifyWindow, log);
  await work.start(listener);
  started(work);
  await done.start(listener);
  started(done);
  const heartbeats = new HeartbeatBuffer(
    agents,
    hub,
    log,
    (rows, seconds) => metrics.heartbeatFlush(rows, seconds),
    () => work.ring([ANY]),
  );
  heartbeats.start(config.heartbeatFlush);
  started(heartbeats);
  const queue = new WorkQueue(workItems, hub, work, done, clock, config, log.child({ component: "queue" }), metrics);
  const onAgentGone = (name: string) => queue.agentGone(name);
  const known = knownAgentLoader(agents, hub);

  const maintenance = new Maintenance(clock, log.child({ component: "maintenance" }));
  // Engine liveness first: it writes this instance's buffered heartbeats before the agent sweep judges them.
  maintenance.add(engineLivenessTask({ config, engines, heartbeats, log }));
  maintenance.add(agentLivenessTask({ config, agents, hub, audit, heartbeats, log, onAgentGone }));
  maintenance.add(queue.expiryTask(heartbeats));
  maintenance.add(queue.dueTask());
  maintenance.add(queue.strandedTask());
  const agentOps = new AgentOpsStore(pool, tables);
  maintenance.add(
    drainDeadlineTask(queue, agentOps, (fn) =>
      pool.transaction((tx) => fn(new WorkItemStore(tx, tables, backoff, undefined, sharing), new AgentOpsStore(tx, tables))),
    ),
  );
  const bindings = new AffinityBindingStore(pool, tables);
  maintenance.add({ name: "affinity-cleanup", run: (now) => bindings.cleanup(now, config.affinityIdle) });
  maintenance.add({ name: "directive-prune", run: async () => hub.prune() });
  const runEngines = new Engines({
    pool,
    tables,
    config,
    clock,
    log: log.child({ component: "engines" }),
    queue,
    listener,
    audit,
    itemsOn: (tx) => new WorkItemStore(tx, tables, backoff, undefined, sharing),
    metrics,
  });
  await runEngines.start();
  started(runEngines);
  maintenance.add(runEngines.task());
  const runs = new EngineRunStore(pool, tables);
  const firings = new TriggerFiringStore(pool, tables);
  const triggers = new TriggerStore(pool, tables);
  const definitions = new DefinitionReads(pool, tables);
  if (config.triggersFile) await applyTriggersFile(triggers, readTriggersFile(config.triggersFile), clock.nowMs());
  const firer = new TriggerFirer({ pool, tables, engines: runEngines, clock, log: log.child({ component: "triggers" }), metrics });
  maintenance.add(cronTask({ pool, tables, firer, log: log.child({ component: "cron" }), catchUpMs: config.cronCatchUp }));
  maintenance.add(firingRetentionTask({ config, firings, deliveries: triggers, log }));
  await maintenance.runOnce();
  maintenance.start(config.sweepInterval);
  started(maintenance);

  const itemStats = new WorkItemStatsStore(pool, tables);
  maintenance.add(unplaceableTask({ config, agents, stats: itemStats, store: workItems, log, onFailed: () => done.ring(["*"]) }));
  new FleetGauges(
    metrics.registry,
    { queue: (now) => itemStats.gauges(now), fleet: (limit) => agentOps.gauges(limit) },
    { clock, refreshMs: config.metricsRefresh, maxAgents: config.metricsMaxAgents, log: log.child({ component: "metrics" }), labels: metrics.labels },
  );
  metrics.watchPools({ main: () => poolUsage(pool) ?? { inUse: 0, idle: 0, waiting: 0 }, hot: () => hot.usage() });

  // The agent's unary work RPCs and its stream share one scope cache and one set of report rules.
  const reports = agentReports(queue, (name) => agents.workScope(name));
  const health = new HealthState();
  const files: DescFile[] = [
    file_grpc_health_v1_health,
    file_aiflow_cluster_v1_agent,
    file_aiflow_cluster_v1_queue,
    file_aiflow_cluster_v1_ops,
    file_aiflow_cluster_v1_runs,
    file_aiflow_dag_v1_dag,
    file_aiflow_graph_v1_graph,
    file_aiflow_machine_v1_machine,
    file_aiflow_trigger_v1_trigger,
  ];
  const mounted: Mounted[] = [
    { services: [Health], access: "public", mount: healthRoutes(health) },
    // Reflection describes the API, so any valid token may read it, but not an anonymous caller.
    { services: [ServerReflection, ServerReflectionAlpha], access: "any", mount: reflectionRoutes(files) },
    {
      services: [AgentService],
      access: "agent",
      mount: (r) =>
        r.service(AgentService, {
          ...agentServiceImpl({ config, clock, agents, hub, heartbeats, audit, draining: deps.draining, onAgentGone }),
          ...agentWorkImpl({ queue, reports, known, draining: deps.draining }),
          ...agentStreamImpl({ queue, reports, known, heartbeats, draining: deps.draining }),
        }),
    },
    { services: [QueueService], access: "engine", mount: (r) => r.service(QueueService, queueServiceImpl(queue, agents, deps.draining)) },
    {
      services: [OpsService],
      access: "ops",
      mount: (r) =>
        r.service(
          OpsService,
          opsServiceImpl({
            queue,
            agentOps,
            stats: itemStats,
            audit,
            bindings,
            concurrencyKeys: new ConcurrencyKeyStore(pool, tables),
            tenantShares: new TenantShareStore(pool, tables),
            rateLimits: new RateLimitStore(pool, tables),
            agents,
          }),
        ),
    },
    {
      services: [RunDirectoryService, TriggerFiringService],
      access: "engine",
      mount: (r) => {
        r.service(RunDirectoryService, runDirectoryServiceImpl({ config, clock, runs, firings }));
        r.service(TriggerFiringService, triggerFiringServiceImpl({ config, clock, runs, firings }));
      },
    },
    {
      services: [DagService],
      access: "runs",
      mount: (r) => r.service(DagService, dagServiceImpl({ engine: runEngines.dag, definitions, config, draining: deps.draining })),
    },
    { services: [DagOpsService], access: "ops", mount: (r) => r.service(DagOpsService, dagOpsServiceImpl(runEngines.dag)) },
    {
      services: [GraphService],
      access: "runs",
      mount: (r) => r.service(GraphService, graphServiceImpl({ engine: runEngines.graphs, definitions, config, draining: deps.draining })),
    },
    {
      services: [MachineService],
      access: "runs",
      mount: (r) => r.service(MachineService, machineServiceImpl({ engine: runEngines.machines, definitions, config, draining: deps.draining })),
    },
    { services: [TriggerService], access: "runs", mount: (r) => r.service(TriggerService, triggerServiceImpl({ triggers, definitions, clock })) },
  ];
  for (const s of mounted.flatMap((m) => m.services)) health.set(s.typeName, HealthCheckResponse_ServingStatus.SERVING);

  return {
    routes: (router) => {
      for (const m of mounted) m.mount(router);
    },
    access: new Map(mounted.flatMap((m) => m.services.map((s) => [s.typeName, m.access] as const))),
    background: [
      maintenance,
      runEngines,
      heartbeats,
      work,
      done,
      { stop: () => engines.markStopped(config.instanceId, clock.nowMs()) },
      listener,
      { stop: () => hot.end() },
    ],
    maintenance: { runOnce: () => maintenance.runOnce(), flushHeartbeats: () => heartbeats.flush() },
    onShutdown: () => health.shutdown(),
    webhooks: webhookHandler({
      triggers,
      firer,
      clock,
      log: log.child({ component: "webhooks" }),
      maxBytes: config.webhookMaxBytes,
      metrics,
      guesses: new AuthFailures(clock, config.authFailureLimit, config.authFailureWindow),
    }),
    readiness: new Readiness({ pool, tables, clock, draining: deps.draining, listening: () => listener.connected, log: log.child({ component: "readiness" }) }),
  };
}
