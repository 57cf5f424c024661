/**
 * The chaos run's fault kinds. Each injects its fault and lifts it again (a killed process is
 * replaced, a stopped Postgres started), and resolves once it is lifted; the run then measures the
 * recovery (recovery.ts). A graceful restart that does not finish within its bound is reported.
 */
import type { Fleet, TermOutcome } from "./fleet.js";
import type { ChaosPostgres } from "./postgres.js";
import type { Query } from "./recovery.js";

export const FAULT_KINDS = [
  "agent-kill",
  "agents-kill",
  "daemon-kill",
  "daemons-down",
  "daemon-term",
  "pg-fast",
  "pg-immediate",
  "pg-outage",
  "pg-outage-long",
  "overlap",
] as const;
export type FaultKind = (typeof FAULT_KINDS)[number];

/** What each kind does, for --help (docs/development.md lists the kinds too). */
export const FAULT_HELP: Record<FaultKind, string> = {
  "agent-kill": "kill -9 of one busy agent mid-handler, replaced at once",
  "agents-kill": "kill -9 of half the agents (at least 2) at once, replaced at once",
  "daemon-kill": "kill -9 of one daemon, restarted at once",
  "daemons-down": "kill -9 of every daemon, 3 s down, all restarted",
  "daemon-term": "SIGTERM to one daemon, its exit awaited (15 s bound), started again",
  "pg-fast": "Postgres restart -m fast",
  "pg-immediate": "Postgres restart -m immediate (crash recovery)",
  "pg-outage": "Postgres down 4 s (longer than the 3 s liveness window)",
  "pg-outage-long": "Postgres down 8 s (longer than the 5 s lease)",
  overlap: "kill -9 of one daemon while Postgres is down 4 s, both back together",
};

export const DAEMONS_DOWN_MS = 3000;
export const OUTAGE_MS = 4000;
export const OUTAGE_LONG_MS = 8000;
/** A daemon given SIGTERM (its shutdown grace is 3 s) that has not exited after this is hung. */
export const DAEMON_TERM_BOUND_MS = 15_000;

export interface FaultContext {
  fleet: Fleet;
  postgres: ChaosPostgres;
  random: () => number;
  query: Query;
}

export interface Injected {
  /** What the fault hit: process names, or postgres. */
  target: string;
  /** A daemon-term's SIGTERM: how long the exit took, and whether it hung. */
  term?: TermOutcome;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Agents holding dispatched items first (in a seeded order), then the rest. */
async function agentsByBusy(c: FaultContext): Promise<string[]> {
  const busy = (
    (await c.query<{ name: string }>(
      `SELECT DISTINCT a.name FROM aiflow_work_item w JOIN aiflow_agent a ON w.agent_id IN (a.id, a.name) WHERE w.status = 'dispatched' ORDER BY a.name`,
    )) ?? []
  )
    .map((b) => b.name)
    .filter((n) => c.fleet.agentIndex(n) >= 0);
  const rest = c.fleet.agentNames.filter((n) => !busy.includes(n));
  return [...shuffle(busy, c.random), ...shuffle(rest, c.random)];
}

function shuffle<T>(xs: T[], random: () => number): T[] {
  const a = [...xs];
  for (let i = a.length - 1; i > 0; i--) {
    const j = Math.floor(random() * (i + 1));
    [a[i], a[j]] = [a[j]!, a[i]!];
  }
  return a;
}

const anyDaemon = (c: FaultContext) => Math.floor(c.random() * c.fleet.daemonCount);
const allDaemons = (c: FaultContext) => Array.from({ length: c.fleet.daemonCount }, (_, i) => i);

export const FAULTS: Record<FaultKind, (c: FaultContext) => Promise<Injected>> = {
  "agent-kill": async (c) => {
    const [target] = await agentsByBusy(c);
    await c.fleet.killAgent(c.fleet.agentIndex(target!));
    return { target: target! };
  },
  "agents-kill": async (c) => {
    const n = c.fleet.agentNames.length;
    const count = n >= 2 ? Math.max(2, Math.floor(n / 2)) : 1;
    const targets = (await agentsByBusy(c)).slice(0, count);
    await c.fleet.killAgents(targets.map((t) => c.fleet.agentIndex(t)));
    return { target: targets.join(",") };
  },
  "daemon-kill": async (c) => {
    const i = anyDaemon(c);
    await c.fleet.killDaemon(i);
    return { target: `chaos-daemon-${i}` };
  },
  "daemons-down": async (c) => {
    const all = allDaemons(c);
    await c.fleet.killDaemonsOnly(all);
    await sleep(DAEMONS_DOWN_MS);
    await c.fleet.startDaemons(all);
    return { target: all.map((i) => `chaos-daemon-${i}`).join(",") };
  },
  "daemon-term": async (c) => {
    const i = anyDaemon(c);
    const term = await c.fleet.termDaemon(i, DAEMON_TERM_BOUND_MS);
    return { target: `chaos-daemon-${i}`, term };
  },
  "pg-fast": async (c) => {
    await c.postgres.stop("fast");
    await c.postgres.start();
    return { target: "postgres" };
  },
  "pg-immediate": async (c) => {
    await c.postgres.stop("immediate");
    await c.postgres.start();
    return { target: "postgres" };
  },
  "pg-outage": async (c) => {
    await c.postgres.stop("immediate");
    await sleep(OUTAGE_MS);
    await c.postgres.start();
    return { target: "postgres" };
  },
  "pg-outage-long": async (c) => {
    await c.postgres.stop("immediate");
    await sleep(OUTAGE_LONG_MS);
    await c.postgres.start();
    return { target: "postgres" };
  },
  overlap: async (c) => {
    const i = anyDaemon(c);
    await c.postgres.stop("immediate");
    await c.fleet.killDaemonsOnly([i]);
    await sleep(OUTAGE_MS);
    // The daemon waits for its database at start, so both come back together.
    await Promise.all([c.postgres.start(), c.fleet.startDaemons([i])]);
    return { target: `postgres,chaos-daemon-${i}` };
  },
};
