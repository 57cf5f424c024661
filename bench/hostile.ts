/**
 * Exhaustion probes against a real daemon process, one per finding of issue 27 ("hostile callers").
 * Each probe starts its own daemon (the tree given by --tree, default this one) against
 * DATABASE_URL, runs bounded in count and time on loopback, and prints one JSON line: the daemon's
 * RSS before and at its peak, Health/Check latency during the probe on a connection opened before it
 * (`held`) and on a new connection per check (`fresh`, as a load balancer's probe does), and what
 * the probe itself saw.
 *   DATABASE_URL=postgres://… npx tsx bench/hostile.ts [--tree DIR] [--only NAME,…] [--label before]
 * The daemon runs with its defaults; only the listen address, database, schema and tokens are given,
 * so a tree from before the limits existed runs the same command line.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { once } from "node:events";
import { readFileSync } from "node:fs";
import http2 from "node:http2";
import net from "node:net";
import { performance } from "node:perf_hooks";
import { resolve } from "node:path";
import { create, toBinary } from "@bufbuild/protobuf";
import { EnqueueRequestSchema } from "@aiflow/wire/gen/aiflow/cluster/v1/queue_pb.js";
import { sql } from "./pg.js";

const args = process.argv.slice(2);
const arg = (name: string) => {
  const i = args.indexOf(name);
  return i >= 0 ? args[i + 1] : undefined;
};
const TREE = resolve(arg("--tree") ?? ".");
const LABEL = arg("--label") ?? TREE;
const ONLY = arg("--only")?.split(",");
const DATABASE_URL = process.env.DATABASE_URL;
if (!DATABASE_URL) throw new Error("set DATABASE_URL");
const ENGINE = "hostile-engine-token";
const HEALTH_CHECK = "/grpc.health.v1.Health/Check";

// ---- the daemon under test -------------------------------------------------------------------

interface Daemon {
  proc: ChildProcess;
  port: number;
  rssMb(): number;
}

async function freePort(): Promise<number> {
  const s = net.createServer().listen(0, "127.0.0.1");
  await once(s, "listening");
  const port = (s.address() as net.AddressInfo).port;
  s.close();
  return port;
}

async function startDaemon(schema: string): Promise<Daemon> {
  const port = await freePort();
  const proc = spawn(
    process.execPath,
    [
      "--import",
      "tsx",
      "src/cli/aiflowd.ts",
      "serve",
      "--listen",
      `127.0.0.1:${port}`,
      "--http-listen",
      "off",
      "--database-url",
      DATABASE_URL!,
      "--schema",
      schema,
      "--token",
      `engine:${ENGINE}`,
      "--log-level",
      "warn",
    ],
    { cwd: TREE, stdio: ["ignore", "pipe", "inherit"], env: { ...process.env, NODE_ENV: "production" } },
  );
  let warnings = 0;
  proc.stdout!.on("data", (b: Buffer) => (warnings += b.toString().split("\n").filter(Boolean).length));
  const deadline = performance.now() + 60_000;
  for (;;) {
    if (proc.exitCode !== null) throw new Error(`daemon exited ${proc.exitCode}`);
    if (performance.now() > deadline) throw new Error("daemon did not start");
    if ((await check(port, 1000)).ok) break;
    await new Promise((r) => setTimeout(r, 200));
  }
  return {
    proc,
    port,
    rssMb: () => {
      try {
        const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${proc.pid}/status`, "utf8"));
        return m ? Math.round(Number(m[1]) / 1024) : 0;
      } catch {
        return 0;
      }
    },
  };
}

async function stopDaemon(d: Daemon): Promise<void> {
  d.proc.kill("SIGTERM");
  const t = setTimeout(() => d.proc.kill("SIGKILL"), 15_000);
  if (d.proc.exitCode === null) await once(d.proc, "exit");
  clearTimeout(t);
}

// ---- Health/Check, timed ---------------------------------------------------------------------

const grpcFrame = (bytes: Uint8Array) => {
  const b = Buffer.alloc(5 + bytes.byteLength);
  b.writeUInt32BE(bytes.byteLength, 1);
  b.set(bytes, 5);
  return b;
};

function checkOn(session: http2.ClientHttp2Session, timeoutMs: number): Promise<{ ok: boolean; ms: number }> {
  const t0 = performance.now();
  return new Promise((done) => {
    let settled = false;
    const finish = (ok: boolean) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      done({ ok, ms: performance.now() - t0 });
    };
    const timer = setTimeout(() => {
      finish(false);
      req.close();
    }, timeoutMs);
    let req: http2.ClientHttp2Stream;
    try {
      req = session.request({ ":method": "POST", ":path": HEALTH_CHECK, "content-type": "application/grpc", te: "trailers" });
    } catch {
      finish(false);
      return;
    }
    let status: string | undefined;
    req.on("response", (h) => (status = (h["grpc-status"] as string | undefined) ?? status));
    req.on("trailers", (h) => (status = h["grpc-status"] as string));
    req.on("error", () => finish(false));
    req.on("close", () => finish(status === "0"));
    req.resume();
    req.end(grpcFrame(new Uint8Array()));
  });
}

async function check(port: number, timeoutMs: number): Promise<{ ok: boolean; ms: number }> {
  const t0 = performance.now();
  const s = http2.connect(`http://127.0.0.1:${port}`);
  s.on("error", () => {});
  const r = await checkOn(s, timeoutMs);
  s.destroy();
  return { ok: r.ok, ms: performance.now() - t0 };
}

/** Samples RSS and health every 250 ms until stopped. */
function monitor(d: Daemon) {
  const held = http2.connect(`http://127.0.0.1:${d.port}`);
  held.on("error", () => {});
  const before = d.rssMb();
  let peak = before;
  const fresh: { ok: boolean; ms: number }[] = [];
  const kept: { ok: boolean; ms: number }[] = [];
  let running = true;
  const rss = setInterval(() => (peak = Math.max(peak, d.rssMb())), 100);
  const loop = (async () => {
    while (running) {
      const [a, b] = await Promise.all([check(d.port, 5000), held.destroyed ? Promise.resolve({ ok: false, ms: 0 }) : checkOn(held, 5000)]);
      fresh.push(a);
      kept.push(b);
      await new Promise((r) => setTimeout(r, 250));
    }
  })();
  const summary = (xs: { ok: boolean; ms: number }[]) => {
    const ok = xs
      .filter((x) => x.ok)
      .map((x) => x.ms)
      .sort((p, q) => p - q);
    const q = (f: number) => (ok.length ? Math.round(ok[Math.min(ok.length - 1, Math.floor(f * ok.length))]! * 10) / 10 : null);
    return { checks: xs.length, failed: xs.length - ok.length, p50Ms: q(0.5), maxMs: ok.length ? Math.round(ok[ok.length - 1]! * 10) / 10 : null };
  };
  return {
    async stop() {
      running = false;
      await loop;
      clearInterval(rss);
      held.destroy();
      return { rssBeforeMb: before, rssPeakMb: peak, healthFresh: summary(fresh), healthHeld: summary(kept) };
    },
  };
}

// ---- a raw HTTP/2 client: the frames a hostile peer writes, unchecked ------------------------

const PREFACE = Buffer.from("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
const frameOf = (type: number, flags: number, stream: number, payload: Buffer = Buffer.alloc(0)) => {
  const h = Buffer.alloc(9);
  h.writeUIntBE(payload.length, 0, 3);
  h[3] = type;
  h[4] = flags;
  h.writeUInt32BE(stream, 5);
  return Buffer.concat([h, payload]);
};
/** HPACK literal fields without indexing (every name and value under 127 bytes). */
const hpack = (fields: [string, string][]) =>
  Buffer.concat(fields.flatMap(([n, v]) => [Buffer.from([0, n.length]), Buffer.from(n), Buffer.from([v.length]), Buffer.from(v)]));

interface Raw {
  socket: net.Socket;
  closed: boolean;
  rstReceived: number;
  goaway: boolean;
}

/** Connects, sends the preface and SETTINGS, and acknowledges the server's SETTINGS and PINGs. */
function rawConnect(port: number): Promise<Raw> {
  return new Promise((resolveRaw) => {
    const socket = net.connect(port, "127.0.0.1");
    const raw: Raw = { socket, closed: false, rstReceived: 0, goaway: false };
    let buf: Buffer = Buffer.alloc(0);
    socket.on("error", () => {});
    socket.on("close", () => {
      raw.closed = true;
      resolveRaw(raw);
    });
    socket.on("connect", () => {
      socket.write(Buffer.concat([PREFACE, frameOf(4, 0, 0)]));
      resolveRaw(raw);
    });
    socket.on("data", (d: Buffer) => {
      buf = buf.length ? Buffer.concat([buf, d]) : d;
      while (buf.length >= 9) {
        const len = buf.readUIntBE(0, 3);
        if (buf.length < 9 + len) break;
        const type = buf[3]!;
        const flags = buf[4]!;
        if (type === 4 && !(flags & 1)) socket.write(frameOf(4, 1, 0));
        if (type === 6 && !(flags & 1)) socket.write(frameOf(6, 1, 0, buf.subarray(9, 9 + len)));
        if (type === 3) raw.rstReceived++;
        if (type === 7) raw.goaway = true;
        buf = buf.subarray(9 + len);
      }
    });
  });
}

const grpcHeaders = (path: string, token?: string): [string, string][] => [
  [":method", "POST"],
  [":scheme", "http"],
  [":path", path],
  [":authority", "127.0.0.1"],
  ["content-type", "application/grpc"],
  ["te", "trailers"],
  ...(token ? ([["authorization", `Bearer ${token}`]] as [string, string][]) : []),
];

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

// ---- the probes ------------------------------------------------------------------------------

type Probe = (d: Daemon) => Promise<Record<string, unknown>>;

/** 16 connections, each opening header-only streams (never ending them) as fast as it can write. */
const streams: Probe = async (d) => {
  const perConnection = 5000;
  const conns = await Promise.all(Array.from({ length: 16 }, () => rawConnect(d.port)));
  const block = hpack(grpcHeaders("/aiflow.cluster.v1.QueueService/GetItem", ENGINE));
  for (const c of conns) {
    const frames: Buffer[] = [];
    for (let i = 0; i < perConnection; i++) frames.push(frameOf(1, 4, 1 + 2 * i, block));
    c.socket.write(Buffer.concat(frames));
  }
  await sleep(8000);
  const out = {
    sent: 16 * perConnection,
    refusedByServer: conns.reduce((n, c) => n + c.rstReceived, 0),
    connectionsClosed: conns.filter((c) => c.closed).length,
  };
  for (const c of conns) c.socket.destroy();
  return out;
};

/**
 * 24,000 idle connections, each having sent its preface: more than the daemon's fd limit here
 * (20,000), opened from two child processes since the probe has that limit too.
 */
const connections: Probe = async (d) => {
  const children = [0, 1].map(() =>
    spawn(process.execPath, ["--import", "tsx", import.meta.filename, "--connect-child", String(d.port), "12000"], { stdio: ["ignore", "pipe", "inherit"] }),
  );
  const reports = await Promise.all(
    children.map(async (c) => {
      let out = "";
      c.stdout!.on("data", (b: Buffer) => (out += b.toString()));
      await once(c, "exit");
      return JSON.parse(out) as { connected: number; openAfter5s: number };
    }),
  );
  return { attempted: 24_000, connected: reports.reduce((n, r) => n + r.connected, 0), openAfter5s: reports.reduce((n, r) => n + r.openAfter5s, 0) };
};

/** The child of `connections`: opens N raw connections, waits 5 s, reports, exits. */
async function connectChild(port: number, n: number): Promise<void> {
  const conns: Raw[] = [];
  for (let i = 0; i < n; i += 500) conns.push(...(await Promise.all(Array.from({ length: Math.min(500, n - i) }, () => rawConnect(port)))));
  const connected = conns.filter((c) => !c.closed).length;
  await sleep(5000);
  process.stdout.write(JSON.stringify({ connected, openAfter5s: conns.filter((c) => !c.closed).length }));
  process.exit(0);
}

/** 50 connections each opening and at once resetting 3,000 streams; then they stay connected. */
const rapidReset: Probe = async (d) => {
  const conns = await Promise.all(Array.from({ length: 50 }, () => rawConnect(d.port)));
  const block = hpack(grpcHeaders("/aiflow.cluster.v1.QueueService/GetItem", ENGINE));
  const cancel = Buffer.alloc(4);
  cancel.writeUInt32BE(8);
  for (let round = 0; round < 30; round++) {
    for (const c of conns) {
      if (c.closed) continue;
      const frames: Buffer[] = [];
      for (let i = 0; i < 100; i++) {
        const id = 1 + 2 * (round * 100 + i);
        frames.push(frameOf(1, 4, id, block), frameOf(3, 0, id, cancel));
      }
      c.socket.write(Buffer.concat(frames));
    }
    await sleep(50);
  }
  await sleep(10_000);
  const out = {
    connections: conns.length,
    resetsSent: 50 * 3000,
    stillOpenAfter10s: conns.filter((c) => !c.closed).length,
    goawayReceived: conns.filter((c) => c.goaway).length,
  };
  for (const c of conns) c.socket.destroy();
  return out;
};

/** 20 workers, each sending unauthenticated 3 MB Connect-JSON Enqueues of nested arrays, one after another, for 15 s. */
const nestedJson: Probe = async (d) => {
  const depth = 1_500_000;
  const body = Buffer.from(`{"tenantKey":"default","items":[{"payloadJson":"x"}],"x":${"[".repeat(depth)}${"]".repeat(depth)}}`);
  const statuses: Record<string, number> = {};
  const count = (k: string) => (statuses[k] = (statuses[k] ?? 0) + 1);
  // Twenty 3 MB writes at once are more than a Node client's default session memory (10 MB).
  const open = () => http2.connect(`http://127.0.0.1:${d.port}`, { maxSessionMemory: 1000 }).on("error", () => {});
  let s = open();
  const until = performance.now() + 15_000;
  const one = () =>
    new Promise<void>((done) => {
      if (s.destroyed || s.closed) s = open();
      const req = s.request({
        ":method": "POST",
        ":path": "/aiflow.cluster.v1.QueueService/Enqueue",
        "content-type": "application/json",
        "content-length": String(body.length),
      });
      let status = "no response";
      req.on("response", (h) => (status = String(h[":status"])));
      req.on("error", () => {});
      req.on("close", () => {
        count(status);
        done();
      });
      req.resume();
      req.end(body);
    });
  await Promise.all(
    Array.from({ length: 20 }, async () => {
      while (performance.now() < until) await one();
    }),
  );
  s.destroy();
  return { workers: 20, bodyBytes: body.length, httpStatuses: statuses };
};

/** 200 clients (a connection each), each enqueuing two items of 1 MB payload at once. */
const bigEnqueues: Probe = async (d) => {
  const payload = JSON.stringify("p".repeat(1_000_000 - 2));
  const msg = grpcFrame(
    toBinary(
      EnqueueRequestSchema,
      create(EnqueueRequestSchema, {
        tenantKey: "default",
        items: [0, 1].map((i) => ({ engineKind: "bench", runId: "r", taskId: `t${i}`, taskName: "n", payloadJson: payload })),
      }),
    ),
  );
  const codes: Record<string, number> = {};
  const sessions = Array.from({ length: 200 }, () => {
    const s = http2.connect(`http://127.0.0.1:${d.port}`);
    s.on("error", () => {});
    return s;
  });
  await Promise.all(
    sessions.map(
      (s) =>
        new Promise<void>((done) => {
          const req = s.request({
            ":method": "POST",
            ":path": "/aiflow.cluster.v1.QueueService/Enqueue",
            "content-type": "application/grpc",
            te: "trailers",
            authorization: `Bearer ${ENGINE}`,
          });
          let status = "none";
          req.on("response", (h) => (status = (h["grpc-status"] as string | undefined) ?? status));
          req.on("trailers", (h) => (status = h["grpc-status"] as string));
          req.on("error", () => {});
          req.on("close", () => {
            codes[status] = (codes[status] ?? 0) + 1;
            done();
          });
          req.resume();
          req.end(msg);
        }),
    ),
  );
  for (const s of sessions) s.destroy();
  return { clients: 200, requestBytes: msg.length, grpcStatuses: codes };
};

/** 5,000 unauthenticated Health.Watch streams over 50 connections, held for 5 s. */
const healthWatches: Probe = async (d) => {
  const sessions = Array.from({ length: 50 }, () => {
    const s = http2.connect(`http://127.0.0.1:${d.port}`);
    s.on("error", () => {});
    return s;
  });
  let open = 0;
  let ended = 0;
  for (const s of sessions)
    for (let i = 0; i < 100; i++) {
      const req = s.request({ ":method": "POST", ":path": "/grpc.health.v1.Health/Watch", "content-type": "application/grpc", te: "trailers" });
      let refused = false;
      req.on("response", (h) => {
        if (h["grpc-status"] !== undefined) refused = true;
        else open++;
      });
      req.on("error", () => {});
      req.on("close", () => {
        if (!refused) open--;
        ended++;
      });
      req.resume();
      req.end(grpcFrame(new Uint8Array()));
    }
  await sleep(5000);
  const out = { watches: 5000, openAfter5s: open, endedOrRefused: ended };
  for (const s of sessions) s.destroy();
  return out;
};

const PROBES: Record<string, Probe> = { streams, connections, rapidReset, nestedJson, bigEnqueues, healthWatches };

if (arg("--connect-child")) await connectChild(Number(arg("--connect-child")), Number(args[args.indexOf("--connect-child") + 2]));

for (const [name, probe] of Object.entries(PROBES)) {
  if (ONLY && !ONLY.includes(name)) continue;
  const schema = `hostile_${name.toLowerCase()}`;
  const d = await startDaemon(schema);
  await sleep(1000);
  const m = monitor(d);
  const t0 = performance.now();
  let result: Record<string, unknown>;
  try {
    result = await Promise.race([probe(d), sleep(60_000).then(() => ({ error: "probe timed out" }))]);
  } catch (err) {
    result = { error: String(err) };
  }
  const seconds = Math.round((performance.now() - t0) / 100) / 10;
  const metrics = await m.stop();
  console.log(JSON.stringify({ label: LABEL, probe: name, seconds, ...metrics, ...result }));
  await stopDaemon(d);
  // Each probe's daemon migrates a schema of its own; nothing of it outlives the probe.
  await sql(DATABASE_URL!, `DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
}
