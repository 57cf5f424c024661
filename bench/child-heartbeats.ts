/**
 * Child process: N simulated agents that register, then each heartbeat once a second (spread evenly)
 * for the given duration, over a few HTTP/2 connections. An agent the daemon answers INACTIVE (it
 * missed heartbeats: on a slow host, the first ones registered wait for all the others) registers
 * again, as the SDK does; otherwise every beat of it would read its status from the database and
 * be counted as heartbeat cost. Prints {"ready":true} once registered and {"beats":N,
 * "reregistered":N} at the end.
 */
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { AgentService } from "@aiflow/wire/gen/aiflow/cluster/v1/agent_pb.js";
import { AgentStatus } from "@aiflow/wire/gen/aiflow/cluster/v1/common_pb.js";
import { nowMs } from "./clock.js";
import { exitWith } from "./child-exit.js";

const [address, token, countRaw, durationRaw] = process.argv.slice(2);
const count = Number(countRaw);
const durationMs = Number(durationRaw);
const headers = { authorization: `Bearer ${token}` };
const clients = Array.from({ length: 4 }, () => createClient(AgentService, createGrpcTransport({ baseUrl: `http://${address}` })));
const names = Array.from({ length: count }, (_, i) => `bench-hb-${i}`);
const register = (i: number) =>
  clients[i % clients.length]!.register({ name: names[i]!, metadata: { slots: 1, tenants: ["bench"], engineKinds: ["bench"] } }, { headers });
for (let i = 0; i < names.length; i += 100) await Promise.all(names.slice(i, i + 100).map((_, j) => register(i + j)));
console.log(JSON.stringify({ ready: true }));

const metrics = {
  cpuUtilization: 12.5,
  memoryUsedBytes: 1n << 30n,
  memoryTotalBytes: 8n << 30n,
  disks: [{ mount: "/", freeBytes: 10n << 30n, totalBytes: 100n << 30n }],
  gpus: [],
};
let beats = 0;
let reregistered = 0;
const registering = new Set<number>();
const start = nowMs();
const pending: Promise<unknown>[] = [];
for (let second = 0; second * 1000 < durationMs; second++) {
  for (let i = 0; i < count; i++) {
    const at = start + second * 1000 + (i * 1000) / count;
    const wait = at - nowMs();
    if (wait > 1) await new Promise((r) => setTimeout(r, wait));
    pending.push(
      clients[i % clients.length]!.heartbeat({ name: names[i]!, metrics, inFlight: 0 }, { headers }).then((r) => {
        beats++;
        if (r.status !== AgentStatus.INACTIVE || registering.has(i)) return;
        registering.add(i);
        reregistered++;
        // Caught here: the final allSettled may already have taken the list without it.
        pending.push(
          register(i).then(
            () => registering.delete(i),
            () => registering.delete(i),
          ),
        );
      }),
    );
  }
}
await Promise.allSettled(pending);
exitWith({ beats, reregistered });
