/**
 * SIGTERM/SIGINT with `handleSignals`: the first signal drains, a second one exits the process at
 * once with 128 + the signal's number, whatever the drain is waiting for. The unit tests drive
 * onShutdownSignals with stand-ins for the process; the last one signals a real worker process
 * (signal-worker.ts) whose drain cannot finish, since its handler never ends.
 */
import { spawn } from "node:child_process";
import { EventEmitter, once } from "node:events";
import { createInterface } from "node:readline";
import { pino, type Logger } from "pino";
import { afterEach, describe, expect, it } from "vitest";
import { exitCodeFor, onShutdownSignals, type SignalTarget } from "../src/signals.js";
import { FakeDaemon } from "./fake-daemon.js";

interface Line {
  level: number;
  msg: string;
  signal?: string;
  exitCode?: number;
}

/** A process stand-in: signals are emitted by the test, exits are recorded. */
function standIn(): SignalTarget & { emitter: EventEmitter; exits: number[] } {
  const emitter = new EventEmitter();
  const exits: number[] = [];
  return {
    emitter,
    exits,
    on: (s, h) => emitter.on(s, h),
    off: (s, h) => emitter.off(s, h),
    exit: (code) => void exits.push(code),
  };
}

function logLines(): { lines: Line[]; logger: Logger } {
  const lines: Line[] = [];
  return { lines, logger: pino({ level: "info" }, { write: (s: string) => void lines.push(JSON.parse(s) as Line) }) };
}

describe("onShutdownSignals", () => {
  it("drains on the first signal and exits at once with 128 + its number on the second, saying so at warn", () => {
    const target = standIn();
    const { lines, logger } = logLines();
    const drains: string[] = [];
    onShutdownSignals((s) => drains.push(s), logger, target);
    target.emitter.emit("SIGTERM", "SIGTERM");
    expect(drains).toEqual(["SIGTERM"]);
    expect(target.exits).toEqual([]);
    target.emitter.emit("SIGINT", "SIGINT");
    expect(drains).toEqual(["SIGTERM"]);
    expect(target.exits).toEqual([130]);
    expect(lines).toEqual([
      expect.objectContaining({ level: 40, signal: "SIGINT", exitCode: 130, msg: expect.stringContaining("second signal: exiting at once") }),
    ]);
  });

  it("names the exit status as a shell does: 143 for SIGTERM, 130 for SIGINT", () => {
    expect([exitCodeFor("SIGTERM"), exitCodeFor("SIGINT")]).toEqual([143, 130]);
  });

  it("removes its handlers", () => {
    const target = standIn();
    const remove = onShutdownSignals(() => {}, logLines().logger, target);
    expect([target.emitter.listenerCount("SIGTERM"), target.emitter.listenerCount("SIGINT")]).toEqual([1, 1]);
    remove();
    expect([target.emitter.listenerCount("SIGTERM"), target.emitter.listenerCount("SIGINT")]).toEqual([0, 0]);
  });
});

describe("a worker process with handleSignals", () => {
  let fake: FakeDaemon | undefined;
  afterEach(async () => {
    await fake?.close();
  });

  it("exits with 143 on a second SIGTERM while its drain waits for an item that never ends", async () => {
    fake = await new FakeDaemon().start();
    // The stream answers what a drain needs (the withdrawal), so only the item holds the drain.
    fake.stream = () => "withdraws";
    fake.items = [{ id: "w1", leaseToken: "lease-1", engineKind: "k", tenantKey: "t1", payloadJson: "{}" }];
    const worker = spawn(process.execPath, ["--import", "tsx", "agent-sdk/test/signal-worker.ts", fake.address], { stdio: ["ignore", "pipe", "inherit"] });
    const exited = once(worker, "exit") as Promise<[number | null, string | null]>;
    const lines: Line[] = [];
    const waiting = new Set<{ match: RegExp; resolve: () => void }>();
    createInterface({ input: worker.stdout! }).on("line", (text) => {
      const l = JSON.parse(text) as Line;
      lines.push(l);
      for (const w of waiting) if (w.match.test(l.msg)) waiting.delete(w), w.resolve();
    });
    const line = (match: RegExp) =>
      lines.some((l) => match.test(l.msg)) ? Promise.resolve() : new Promise<void>((resolve) => waiting.add({ match, resolve }));
    try {
      // Running the item that never ends: the fake pushed it, its handler says it started.
      await line(/^handler started$/);
      worker.kill("SIGTERM");
      await line(/^draining: claiming nothing more$/);
      worker.kill("SIGTERM");
      expect(await exited).toEqual([143, null]);
      expect(lines.filter((l) => /second signal/.test(l.msg))).toEqual([expect.objectContaining({ level: 40, signal: "SIGTERM", exitCode: 143 })]);
    } finally {
      if (worker.exitCode === null) worker.kill("SIGKILL");
    }
  }, 60_000);
});
