/**
 * The HTTP/2 floor: the CPU that a bare Node HTTP/2 unary exchange costs its server and its client,
 * at the steady section's rate, on this machine, in this run. The steady section's daemon and
 * producer make one such exchange per item (an Enqueue), so their CPU per item reads against it:
 * what is above the floor is aiflowd's (and connect's, and Postgres's) own, what is under it any
 * Node gRPC process on this machine pays.
 */
import { cpuMeter, startChild } from "./proc.js";
import { round } from "./stats.js";

export async function http2Floor(o: { rate: number; durationMs: number; warmupMs: number }): Promise<Record<string, number>> {
  const server = startChild("bench/child-h2-floor.ts", ["server"], { ready: (l) => l.includes('"ready"') });
  try {
    const { port } = JSON.parse(await server.ready) as { port: number };
    const client = startChild("bench/child-h2-floor.ts", ["client", String(port), String(o.rate), String(o.warmupMs + o.durationMs)], {
      ready: (l) => l.includes('"ready"'),
    });
    await client.ready;
    const done = new Promise<void>((resolve) => client.onLine((l) => l.includes('"sent"') && resolve()));
    // Counted after the warm-up (the processes' code compiled, the connection's windows open) and
    // for a whole second less than the run, so that the window lies inside the steady sending.
    await new Promise((r) => setTimeout(r, o.warmupMs));
    const meter = cpuMeter({ server: [server.pid], client: [client.pid] });
    await new Promise((r) => setTimeout(r, Math.max(500, o.durationMs - 1000)));
    const { wallMs, groupMs } = meter();
    await done;
    await client.exited;
    const calls = (o.rate * wallMs) / 1000;
    return {
      rate: o.rate,
      seconds: round(wallMs / 1000, 1),
      server_us_per_call: round((groupMs.server! * 1000) / calls, 0),
      client_us_per_call: round((groupMs.client! * 1000) / calls, 0),
    };
  } finally {
    await server.stop();
  }
}

/** The steady section's daemon and producer CPU per item (one Enqueue each), from their shares of a core. */
export function perItem(latency: Record<string, number | string>, rate: number): Record<string, number> {
  const us = (pct: unknown) => round((Number(pct) * 10_000) / rate, 0);
  return { daemons_us_per_item: us(latency.daemons_cpu_pct), producer_us_per_call: us(latency.producer_cpu_pct) };
}
