/**
 * DAG runs in tests: a DagService client with a runs token, definitions written compactly, and a
 * worker loop over a TestAgent that runs each claimed node with a handler (its result completes
 * the item; a thrown error fails it for good) until stopped.
 */
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { durationFromMs } from "@bufbuild/protobuf/wkt";
import { DagService, DefinitionSchema, NodeKind, OnFailure, RunStatus, type NodeSchema, type Run } from "@aiflow/wire/gen/aiflow/dag/v1/dag_pb.js";
import type { WorkItem } from "@aiflow/wire/gen/aiflow/cluster/v1/work_item_pb.js";
import { Connection } from "./kit.js";
import { TOKENS } from "./daemon.js";
import type { TestAgent } from "./queue.js";

export type NodeSpec = Omit<MessageInitShape<typeof NodeSchema>, "$typeName" | "timeout" | "kind" | "onFailure"> & {
  timeoutMs?: number;
  wait?: boolean;
  skip?: boolean;
};

export function definition(nodes: NodeSpec[], opts: { id?: string; runAffinity?: boolean } = {}) {
  return create(DefinitionSchema, {
    id: opts.id ?? "",
    affinity: opts.runAffinity ? 1 : 0,
    nodes: nodes.map(({ timeoutMs, wait, skip, ...n }) => ({
      engineKind: wait ? "" : "dag",
      ...n,
      kind: wait ? NodeKind.WAIT : NodeKind.TASK,
      onFailure: skip ? OnFailure.SKIP : OnFailure.UNSPECIFIED,
      timeout: timeoutMs === undefined ? undefined : durationFromMs(timeoutMs),
    })),
  });
}

export const chain = (n: number): NodeSpec[] =>
  Array.from({ length: n }, (_, i) => ({ name: `n${i}`, dependsOn: i === 0 ? [] : [`n${i - 1}`], payloadJson: `{"step":${i}}` }));

export class DagClient {
  readonly conn: Connection;
  readonly dag;

  constructor(address: string, token: string = TOKENS.runs) {
    this.conn = new Connection(address, { token });
    this.dag = this.conn.client(DagService);
  }

  async start(tenant: string, def: ReturnType<typeof definition>, context: unknown = {}, idempotencyKey = ""): Promise<Run> {
    const res = await this.dag.startRun({
      tenantKey: tenant,
      source: { case: "definition", value: def },
      contextJson: JSON.stringify(context),
      idempotencyKey,
    });
    return res.run!;
  }

  async get(tenant: string, runId: string): Promise<Run> {
    return (await this.dag.getRun({ tenantKey: tenant, runId })).run!;
  }

  /**
   * Waits until the run's status is `status` and returns it (with its attempts). It watches the run (WatchRun) rather
   * than polling GetRun: a big run's every read is every attempt, and polling would load the daemon
   * more than the run does.
   */
  async until(tenant: string, runId: string, status: RunStatus, timeoutMs = 20_000): Promise<Run> {
    const stop = new AbortController();
    const timer = setTimeout(() => stop.abort(), timeoutMs);
    let last: Run | undefined;
    try {
      for await (const m of this.dag.watchRun({ tenantKey: tenant, runId }, { signal: stop.signal })) {
        last = m.run!;
        if (last.status === status) return this.get(tenant, runId);
      }
      throw new Error(`run ${runId} ended ${last ? RunStatus[last.status] : "?"}, not ${RunStatus[status]}`);
    } catch (err) {
      if (stop.signal.aborted)
        throw new Error(`timed out after ${timeoutMs}ms waiting until run ${runId} is ${RunStatus[status]} (now ${last ? RunStatus[last.status] : "?"})`);
      throw err;
    } finally {
      clearTimeout(timer);
    }
  }

  close(): void {
    this.conn.close();
  }
}

export type Handler = (item: WorkItem, payload: unknown) => unknown;

/** Thrown by a handler: the item is failed retryably (a retry while its node's max_retries allow). */
export class RetryableError extends Error {}

/** Claims and completes (or fails for good when the handler throws; retryably for a RetryableError) until stopped; returns every item it ran. */
export function work(agent: TestAgent, handler: Handler, opts: { slots?: number } = {}) {
  const ran: WorkItem[] = [];
  let stopped = false;
  const done = (async () => {
    while (!stopped) {
      const items = await agent.claim(opts.slots ?? 8, 200);
      for (const item of items) {
        ran.push(item);
        let result: unknown;
        try {
          result = handler(item, item.payloadJson ? JSON.parse(item.payloadJson) : null);
        } catch (err) {
          await agent.fail([item], { error: (err as Error).message, retryable: err instanceof RetryableError, retryDelayMs: 0 });
          continue;
        }
        await agent.complete([item], result ?? null);
      }
    }
  })();
  return {
    ran,
    async stop() {
      stopped = true;
      await done;
    },
  };
}
