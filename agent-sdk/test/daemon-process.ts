/**
 * `aiflowd serve` in a child process, for tests whose handlers block this process's event loop: a
 * daemon in this process would share the blocked loop and could neither take heartbeats and
 * renewals nor sweep. Sweeps and heartbeat flushes run every 50ms; the test names the rest.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { once } from "node:events";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll } from "vitest";
import { TOKENS } from "../../test/support/daemon.js";
import { databaseUrl } from "../../test/support/database-url.js";
import { freePort } from "../../test/support/free-port.js";

const ROOT = fileURLToPath(new URL("../..", import.meta.url));

export interface ChildDaemonTimings {
  /** As the daemon's flags spell durations: "300ms", "20s". */
  heartbeatInterval: string;
  leaseTtl: string;
}

/** Starts `aiflowd serve` on `schema` and resolves once it serves; `env` adds to this process's environment. */
export async function spawnDaemon(
  schema: string,
  port: number,
  instanceId: string,
  timings: ChildDaemonTimings,
  env: NodeJS.ProcessEnv = {},
): Promise<ChildProcess> {
  const flags = {
    "--listen": `127.0.0.1:${port}`,
    "--database-url": databaseUrl(),
    "--schema": schema,
    "--instance-id": instanceId,
    "--heartbeat-interval": timings.heartbeatInterval,
    "--heartbeat-flush": "50ms",
    "--sweep-interval": "50ms",
    "--lease-ttl": timings.leaseTtl,
    "--log-level": "info",
    // Test files run side by side: no daemon takes the default metrics port.
    "--http-listen": "off",
  };
  const args = [
    "--import",
    "tsx",
    "src/cli/aiflowd.ts",
    "serve",
    ...Object.entries(flags).flat(),
    "--token",
    `agent:${TOKENS.agent}`,
    "--token",
    `engine:${TOKENS.engine}`,
    "--token",
    `runs:${TOKENS.runs}`,
  ];
  const child = spawn(process.execPath, args, { cwd: ROOT, stdio: ["ignore", "pipe", "inherit"], env: { ...process.env, NO_COLOR: "1", ...env } });
  let out = "";
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`aiflowd did not start within 30s:\n${out}`)), 30_000);
    child.stdout!.on("data", (chunk: Buffer) => {
      out += chunk.toString();
      if (out.includes("aiflowd serving gRPC")) {
        clearTimeout(timer);
        resolve();
      }
    });
    child.once("exit", (code) => reject(new Error(`aiflowd exited with ${code}:\n${out}`)));
  });
  child.stdout!.resume();
  return child;
}

/** A child daemon on `schema()` for the file's tests, stopped after them; `address()` is its host:port. */
export function useChildDaemon(schema: () => string, instanceId: string, timings: ChildDaemonTimings): { address(): string } {
  let daemon: ChildProcess | undefined;
  let address: string | undefined;
  beforeAll(async () => {
    const port = await freePort();
    daemon = await spawnDaemon(schema(), port, instanceId, timings);
    address = `127.0.0.1:${port}`;
  });
  afterAll(async () => {
    if (daemon && daemon.exitCode === null) {
      daemon.kill("SIGTERM");
      await once(daemon, "exit");
    }
  });
  return {
    address() {
      if (!address) throw new Error("the child daemon starts in beforeAll");
      return address;
    },
  };
}
