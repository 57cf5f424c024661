// @ts-check
/**
 * The heartbeat thread. It beats on a connection of its own, at the interval the daemon gave, with
 * metrics it measures itself, so the agent stays alive in the daemon's eyes while task code blocks
 * the main thread's event loop; and over the same connection it renews the leases the agent holds
 * (renewals.js), so that such code keeps its item too. Replies and lost leases go to the main
 * thread as messages; when it is busy they queue there, and the beats and renewals go on.
 *
 * The agent spawns it before registering and waits for it to say it is ready (modules loaded, the
 * first metrics sample taken: that can take seconds on a loaded host), so the first beat follows
 * the registration at once.
 *
 * Plain JavaScript because Node loads worker threads itself, whatever runs the agent's TypeScript;
 * it needs no generated code either: the main thread hands over agent.proto as a descriptor set.
 * Its messages are typed in protocol.ts.
 */
import { createFileRegistry, fromBinary, toBinary } from "@bufbuild/protobuf";
import { FileDescriptorSetSchema } from "@bufbuild/protobuf/wkt";
import { ConnectError } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { parentPort, workerData } from "node:worker_threads";
import { MetricsSampler } from "./metrics.js";
import { Renewals, TRANSIENT } from "./renewals.js";
import { TlsMaterial } from "../tls.js";

/** @typedef {import("./protocol.js").ThreadInit} ThreadInit */
/** @typedef {import("./protocol.js").ToThread} ToThread */
/** @typedef {import("./protocol.js").FromThread} FromThread */

const port = parentPort;
if (!port) throw new Error("thread.js runs as a worker thread of the agent");
/** @type {ThreadInit} */
const init = workerData;

const registry = createFileRegistry(fromBinary(FileDescriptorSetSchema, init.descriptorSet));
/** @param {string} name */
function unaryMethod(name) {
  const found = registry.getService("aiflow.cluster.v1.AgentService")?.methods.find((m) => m.name === name);
  if (found?.methodKind !== "unary") throw new Error(`the descriptor set lacks AgentService.${name}`);
  // Checked just above; DescMethod does not narrow by methodKind.
  return /** @type {import("@bufbuild/protobuf").DescMethodUnary} */ (found);
}
const heartbeat = unaryMethod("Heartbeat");
const extendLease = unaryMethod("ExtendLease");

// The agent warns about TLS files that do not read; this thread quietly keeps its last good ones too.
const tls = init.tls ? new TlsMaterial(init.tls.source, { initial: init.tls.initial }) : undefined;
const nodeOptions = tls ? { createConnection: (/** @type {URL} */ authority) => tls.connect(authority) } : undefined;
const transports = init.baseUrls.map((baseUrl) => createGrpcTransport({ baseUrl, nodeOptions }));
// The agent's bearer token travels in this header only: nothing here logs or posts it.
const headers = init.token ? { authorization: `Bearer ${init.token}` } : undefined;
const renewals = new Renewals(
  transports.map((transport, i) => ({
    address: init.baseUrls[i] ?? "",
    async extendLease(leases, timeoutMs) {
      const res = await transport.unary(extendLease, undefined, timeoutMs, headers, { name: init.name, leases });
      // An ExtendLeaseResponse of the descriptor set: its fields under their protobuf-es names.
      return /** @type {{ outcomes: import("./renewals.js").Outcome[] }} */ (/** @type {unknown} */ (res.message)).outcomes;
    },
  })),
  init.rpcTimeoutMs,
  (message) => post(message),
);
const sampler = new MetricsSampler(init.mounts, { override: init.metricsOverride });
let current = 0;
let intervalMs = 0;
const inFlight = new Int32Array(init.inFlight);
/** @type {NodeJS.Timeout | undefined} */
let timer;
/** A beat is in flight; it schedules the next one itself when done. */
let beating = false;

/** @param {FromThread} message */
const post = (message) => port.postMessage(message);

port.on("message", (/** @type {ToThread} */ m) => {
  if (m.type === "start" && intervalMs === 0) {
    intervalMs = m.intervalMs;
    current = m.addressIndex;
    void beat();
  } else if (m.type === "interval" && intervalMs > 0 && m.ms !== intervalMs) {
    intervalMs = m.ms;
    if (beating) return;
    clearTimeout(timer);
    timer = setTimeout(beat, intervalMs);
  } else if (m.type === "renew") renewals.renewEvery(m.ttlMs, m.addressIndex);
  else if (m.type === "hold") renewals.hold(m.leases);
  else if (m.type === "drop") renewals.drop(m.leases);
});

// The first sample finds out whether there is a GPU and sets the CPU baseline.
await sampler.sample();
post({ type: "ready" });

async function beat() {
  beating = true;
  const started = Date.now();
  const transport = /** @type {import("@connectrpc/connect").Transport} */ (transports[current]);
  try {
    const metrics = await sampler.sample();
    // A beat may take as long as an interval, so a slow daemon is not abandoned while it answers.
    const timeoutMs = Math.min(init.rpcTimeoutMs, Math.max(intervalMs, 1_000));
    const res = await transport.unary(heartbeat, undefined, timeoutMs, headers, { name: init.name, metrics, inFlight: Atomics.load(inFlight, 0) });
    post({ type: "reply", bytes: toBinary(heartbeat.output, res.message) });
  } catch (err) {
    const e = ConnectError.from(err);
    post({ type: "failed", code: e.code, message: e.rawMessage, address: init.baseUrls[current] ?? "" });
    if (TRANSIENT.has(e.code)) current = (current + 1) % transports.length;
  }
  beating = false;
  timer = setTimeout(beat, Math.max(0, intervalMs - (Date.now() - started)));
}
