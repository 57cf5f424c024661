/**
 * The daemon each queue-*.test.ts file runs on: the work queue's rules end to end on one daemon over
 * real HTTP/2 and a real Postgres, with a fake clock. The sweeps and heartbeat flushes never run on
 * their timers: a test runs them after moving the clock. Backoff has no jitter: the delay after the
 * n-th retry is exactly min(cap, base × 2^n). Claims may wait far longer than a test may run, so a
 * waiting claim that answers with work was woken, not timed out.
 *
 * Every test uses tenants and agents of its own, so tests do not see each other's work.
 */
import { beforeAll } from "vitest";
import { FakeClock } from "../../src/clock.js";
import type { Daemon } from "../../src/daemon.js";
import { WorkItemStore } from "../../src/store/work-items.js";
import type { TestDb } from "./db.js";
import { useTestDaemon, type Closers } from "./kit.js";
import { Producer, TestAgent, type AgentSpec } from "./queue.js";

export const BASE = 1_000;
export const CAP = 5_000;
export const LEASE = 30_000;
/** heartbeatInterval 5 s × livenessIntervals 3. */
export const LIVENESS = 15_000;
/** The longest a claim may wait here: past any test's timeout. */
export const CLAIM_MAX_WAIT = 600_000;

export interface QueueDaemon {
  readonly clock: FakeClock;
  readonly db: TestDb;
  readonly daemon: Daemon;
  /** A producer with the engine token. */
  readonly p: Producer;
  readonly closers: Closers;
  /** A registered agent (engine kind dag unless told), closed after the file's tests. */
  agent(name: string, spec: Partial<AgentSpec> & { tenants: string[] }): Promise<TestAgent>;
  /** Agents that are alive beat, and the beats are written, so the next liveness sweep spares them. */
  keepAlive(agents: readonly TestAgent[]): Promise<void>;
  /** The queue's store on the file's schema, with the daemon's backoff. */
  store(): WorkItemStore;
}

export function useQueueDaemon(label: string): QueueDaemon {
  const clock = new FakeClock(Date.UTC(2026, 3, 1));
  const fx = useTestDaemon({
    label,
    clock,
    config: {
      instanceId: "queue-sem",
      sweepInterval: 3_600_000,
      heartbeatFlush: 3_600_000,
      heartbeatInterval: 5_000,
      livenessIntervals: 3,
      leaseTtl: LEASE,
      backoffBase: BASE,
      backoffCap: CAP,
      backoffJitter: "none",
      payloadMaxBytes: 2048,
      claimMaxItems: 5,
      claimMaxWait: CLAIM_MAX_WAIT,
    },
  });
  let p: Producer | undefined;
  beforeAll(() => {
    p = fx.closers.add(new Producer(fx.address));
  });
  return {
    clock,
    get db() {
      return fx.db;
    },
    get daemon() {
      return fx.daemon;
    },
    get p() {
      if (!p) throw new Error("the producer is made in beforeAll");
      return p;
    },
    closers: fx.closers,
    agent: async (name, spec) => fx.closers.add(await TestAgent.register(fx.address, name, { engineKinds: ["dag"], ...spec })),
    keepAlive: async (agents) => {
      await Promise.all(agents.map((a) => a.heartbeat()));
      await fx.daemon.maintenance.flushHeartbeats();
    },
    store: () => new WorkItemStore(fx.db.pool, fx.db.tables, { baseMs: BASE, capMs: CAP, jitter: false }),
  };
}

export const ids = (items: readonly { id: string }[]) => items.map((i) => i.id);
export const oks = (outcomes: readonly { ok: boolean }[]) => outcomes.map((o) => o.ok);
