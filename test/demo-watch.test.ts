/**
 * The demo's watch of a DAG run (demo/dag.ts) against a real daemon: the run it returns carries
 * every node's attempts, which the demo's ATTEMPTS (RUN) column counts. Issue 52 item 12: it watched
 * without with_attempts, so the column read 0 for every node.
 */
import { describe, expect, it } from "vitest";
import { RunStatus } from "@aiflow/wire/gen/aiflow/dag/v1/dag_pb.js";
import { watch } from "../demo/dag.js";
import { DagClient, definition } from "./support/dag.js";
import { useTestDaemon } from "./support/kit.js";

const fx = useTestDaemon({ label: "demowatch", config: { instanceId: "demo-watch", sweepInterval: 3_600_000, heartbeatInterval: 3_600_000 } });

describe("the demo's watch", () => {
  it("returns the ended run with each node's attempts", async () => {
    const client = fx.closers.add(new DagClient(fx.address));
    // Two task nodes no agent serves: the first becomes a work item (its attempt 1), the second waits on it.
    const run = await client.start(
      "t",
      definition([
        { name: "a", engineKind: "nobody" },
        { name: "b", engineKind: "nobody", dependsOn: ["a"] },
      ]),
    );
    await client.dag.cancelRun({ tenantKey: "t", runId: run.id, reason: "enough" });
    const said: string[] = [];
    const ended = await watch(client.dag, "t", run.id, (m) => said.push(m));
    expect(ended.status).toBe(RunStatus.CANCELLED);
    expect(ended.nodes.map((n) => [n.name, n.attempts.length])).toEqual([
      ["a", 1],
      ["b", 0],
    ]);
    expect(said.length).toBeGreaterThan(0);
  });
});
