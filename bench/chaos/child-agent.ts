/**
 * Child process of the chaos run: one SDK agent given every daemon's address (the SDK fails over).
 * Its handler sleeps a short random time, honouring the abort signal, and then records the run.
 *
 * It writes its testimony to a JSON-lines file that survives a kill -9, because each line is
 * appended synchronously before the handler returns:
 *   {"run":ID,"attempt":A,"redeliveries":R,"pid":P}   a handler run that finished (its result was offered)
 *   {"outcome":KIND,"id":ID}                          what the SDK said became of it (completed, lease-lost, …)
 *   {"rpcError":CODE,"method":M}                      an error answer on the agent's main connection
 * The parent counts executions and refused (zombie) completions from these lines, and compares
 * them with the database; nothing here is trusted for the invariants themselves.
 *
 *   tsx bench/chaos/child-agent.ts ADDRESSES(comma) TOKEN NAME TENANT KIND SLOTS MIN_MS MAX_MS RECORD_FILE LOG_FILE [MODE]
 *
 * MODE is `stream` (the default, as the SDK's: work over the agent stream) or `unary` (`stream: false`:
 * unary claims and the directive stream); the SDK's transport is left at its default either way.
 */
import { appendFileSync } from "node:fs";
import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";
import { pino } from "pino";
import { createAgent } from "../../agent-sdk/src/index.js";

const [addresses, token, name, tenant, kind, slotsRaw, minRaw, maxRaw, recordFile, logFile, mode = "stream"] = process.argv.slice(2);
if (mode !== "stream" && mode !== "unary") throw new Error(`child-agent: MODE is stream or unary, not '${mode}'`);
const minMs = Number(minRaw);
const maxMs = Number(maxRaw);
const record = (line: object) => appendFileSync(recordFile!, `${JSON.stringify(line)}\n`);

const errors: Interceptor = (next) => async (req) => {
  try {
    return await next(req);
  } catch (err) {
    const e = ConnectError.from(err);
    // An aborted call is the SDK cancelling its own long-poll (a stop, a failover), not an answer.
    // A connection torn down under a call (a reset, a dying daemon) is UNAVAILABLE by the SDK's own
    // mapping (agent-sdk/src/link.ts), so an INTERNAL here is counted as one: the run fails on it.
    if (e.code !== Code.Canceled) record({ rpcError: Code[e.code], method: req.method.localName });
    throw err;
  }
};

/** Resolves after ms, or rejects with the signal's reason once it aborts (the lease is gone). */
function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal.aborted) return reject(signal.reason);
    const timer = setTimeout(resolve, ms);
    signal.addEventListener("abort", () => (clearTimeout(timer), reject(signal.reason)), { once: true });
  });
}

const agent = createAgent({
  addresses: addresses!.split(","),
  token,
  name: name!,
  tenants: [tenant!],
  engineKinds: [kind!],
  slots: Number(slotsRaw),
  logger: pino({ level: "info" }, pino.destination({ dest: logFile!, sync: false })),
  interceptors: [errors],
  // Failover and reconnects should follow a restarted daemon within about a second.
  reconnect: { initialDelayMs: 100, maxDelayMs: 1000 },
  keepalive: { intervalMs: 2000, timeoutMs: 2000 },
  rpcTimeoutMs: 5000,
  stream: mode === "stream",
  handlers: {
    [kind!]: async (item, ctx) => {
      await sleep(minMs + Math.random() * (maxMs - minMs), ctx.signal);
      record({ run: item.id, attempt: item.attempt, redeliveries: item.redeliveries, pid: process.pid });
      return null;
    },
  },
});
agent.on("itemFinished", (item, outcome) => record({ outcome: outcome.kind, id: item.id }));
await agent.start();
process.once("SIGTERM", async () => {
  await agent.stop();
  process.exit(0);
});
console.log(JSON.stringify({ ready: true, name }));
