/**
 * What a bad row, a database error or an unreachable database at start-up must not cost: other
 * agents' heartbeats, a secret in the log, or a start-up that gives up at once.
 */
import net from "node:net";
import { beforeAll, describe, expect, it } from "vitest";
import { sql } from "slonik";
import { FakeClock } from "../src/clock.js";
import { defaultConfig } from "../src/config.js";
import { startDaemon, type Daemon } from "../src/daemon.js";
import { createLogger } from "../src/log.js";
import { VERSION } from "../src/util/package-version.js";
import { DirectiveHub } from "../src/fleet/directives.js";
import { HeartbeatBuffer } from "../src/fleet/heartbeat-buffer.js";
import { AgentStore } from "../src/store/agents.js";
import { agentClient, captureLog, ok, registerRequest } from "./support/agents.js";
import { testTokens } from "./support/daemon.js";
import { databaseUrl } from "./support/database-url.js";
import { createTestDb, type TestDb } from "./support/db.js";
import { freePort } from "./support/free-port.js";
import { useTestDaemon } from "./support/kit.js";

const clock = new FakeClock(Date.UTC(2026, 3, 1));
const fx = useTestDaemon({ label: "hfault", clock });
let db: TestDb;
let daemon: Daemon;
beforeAll(() => void ({ db, daemon } = fx));

describe("a heartbeat the database refuses", () => {
  it("is dropped and logged alone; every other agent's beat in the same flush is written", async () => {
    const client = agentClient(daemon.address);
    try {
      for (const name of ["hb-a", "hb-b", "hb-c"]) await ok(client, "register", registerRequest(name));
    } finally {
      client.close();
    }
    const captured = captureLog("info");
    const buffer = new HeartbeatBuffer(
      new AgentStore(daemon.pool, daemon.tables),
      new DirectiveHub(daemon.pool, daemon.tables.channel("directive"), clock, captured.log, 10_000),
      captured.log,
    );
    const at = clock.nowMs() + 1_000;
    buffer.add({ name: "hb-a", metrics: { inFlight: 1 }, at });
    // The RPC refuses this at the edge; here it stands for any row the database refuses (jsonb cannot hold \u0000).
    buffer.add({ name: "hb-b", metrics: { disks: [{ mount: "/x\u0000" }] }, at });
    buffer.add({ name: "hb-c", metrics: { inFlight: 3 }, at });
    await buffer.flush();
    expect(buffer.size).toBe(0);
    const rows = await db.raw<{ name: string; metrics: { inFlight?: number } | null }>(
      `SELECT name, metrics FROM "${db.schema}".aiflow_agent WHERE name LIKE 'hb-%' ORDER BY name`,
    );
    expect(rows.map((r) => [r.name, r.metrics?.inFlight ?? null])).toEqual([
      ["hb-a", 1],
      ["hb-b", null],
      ["hb-c", 3],
    ]);
    const refused = captured.lines().filter((l) => l.msg === "the database refused this agent's heartbeat; dropped it");
    expect(refused.map((l) => l.agent)).toEqual(["hb-b"]);
  });
});

describe("database errors in the log", () => {
  it("keep the SQLSTATE and where Postgres raised it, never the statement's values", async () => {
    const lines: string[] = [];
    const log = createLogger({ level: "info", destination: { write: (s: string) => void lines.push(s) } });
    const secret = "sk-live-0123456789abcdef";
    const bad = `{"api_key":"${secret}", broken`;
    // pg's own error (the prepared statements' path) quotes the value in its context; slonik's carries its bound values.
    const pgErr = await db.raw("SELECT $1::jsonb", [bad]).then(
      () => new Error("the statement succeeded"),
      (e: unknown) => e,
    );
    expect(JSON.stringify((pgErr as { where?: string }).where)).toContain(secret);
    const slonikErr = await daemon.pool.query(sql.unsafe`SELECT ${bad}::jsonb`).then(
      () => new Error("the statement succeeded"),
      (e: unknown) => e,
    );
    log.error({ err: pgErr }, "unexpected error in handler");
    log.error({ err: slonikErr }, "unexpected error in handler");
    log.error({ err: new Error("wrapped", { cause: pgErr }) }, "unexpected error in handler");
    for (const line of lines) {
      expect(line).not.toContain(secret);
      expect(line).not.toContain("api_key");
    }
    const parsed = JSON.parse(lines[0]!) as { err: { code?: string; routine?: string } };
    expect(parsed.err.code).toBe("22P02");
    expect(parsed.err.routine).toBeTruthy();
    const wrapped = JSON.parse(lines[2]!) as { err: { message: string; cause: { code?: string } } };
    expect([wrapped.err.message, wrapped.err.cause.code]).toEqual(["wrapped", "22P02"]);
  });
});

describe("an unreachable database at start-up", () => {
  it("is retried until it answers, within --db-connect-timeout", async () => {
    const port = await freePort();
    const target = new URL(databaseUrl());
    const via = new URL(databaseUrl());
    via.hostname = "127.0.0.1";
    via.port = String(port);
    const captured = captureLog("info");
    let proxy: net.Server | undefined;
    let opened = false;
    const retried = new Promise<void>((resolve) => {
      const tick = setInterval(() => {
        if (captured.lines().some((l) => l.msg === "database unreachable, retrying")) {
          clearInterval(tick);
          resolve();
        }
      }, 20);
    });
    // Nothing listens on the port until the daemon has been refused once and said it will retry.
    void retried.then(() => {
      proxy = net.createServer((down) => {
        const up = net.connect(Number(target.port || 5432), target.hostname);
        down.pipe(up).pipe(down);
        const end = () => (down.destroy(), up.destroy());
        down.on("error", end).on("close", end);
        up.on("error", end).on("close", end);
      });
      proxy.listen(port, "127.0.0.1", () => (opened = true));
    });
    const schemaDb = await createTestDb({ label: "hstart", migrate: false });
    const started = await startDaemon(
      defaultConfig({
        databaseUrl: via.toString(),
        schema: schemaDb.schema,
        listen: { host: "127.0.0.1", port: 0 },
        tokens: testTokens(),
        dbConnectTimeout: 60_000,
        shutdownGrace: 1_000,
      }),
      { log: captured.log, clock },
    );
    try {
      expect(opened).toBe(true);
      expect(captured.lines().some((l) => l.msg === "database reachable")).toBe(true);
      // The daemon says which version is serving.
      expect(captured.lines().find((l) => l.msg === "aiflowd serving gRPC")?.version).toBe(VERSION);
    } finally {
      await started.stop();
      await new Promise<void>((r) => (proxy ? proxy.close(() => r()) : r()));
      await schemaDb.drop();
    }
  });
});
