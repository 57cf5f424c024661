/**
 * A DAG run's JSON names its run id `runId`, as a graph run's and a machine's do (issue 52 item 12:
 * it was `id` alone, so one script could not read the run id of every engine's run the same way).
 * `id` stays, the same value, for the clients that read it.
 */
import { toJson } from "@bufbuild/protobuf";
import { describe, expect, it } from "vitest";
import { GetRunResponseSchema, ListRunsResponseSchema, StartRunResponseSchema } from "@aiflow/wire/gen/aiflow/dag/v1/dag_pb.js";
import { DagClient, definition } from "./support/dag.js";
import { useTestDaemon } from "./support/kit.js";

const fx = useTestDaemon({ label: "dagjson", config: { instanceId: "dag-json", sweepInterval: 3_600_000, heartbeatInterval: 3_600_000 } });

describe("a DAG run's JSON", () => {
  it("carries runId, equal to id, from StartRun, GetRun, ListRuns and WatchRun", async () => {
    const client = fx.closers.add(new DagClient(fx.address));
    const started = await client.dag.startRun({
      tenantKey: "t",
      source: { case: "definition", value: definition([{ name: "w", wait: true, event: "go" }]) },
      contextJson: "{}",
    });
    const id = started.run!.id;
    expect(id).not.toBe("");
    const json = [
      (toJson(StartRunResponseSchema, started) as { run: Record<string, unknown> }).run,
      (toJson(GetRunResponseSchema, await client.dag.getRun({ tenantKey: "t", runId: id })) as { run: Record<string, unknown> }).run,
      (toJson(ListRunsResponseSchema, await client.dag.listRuns({ tenantKey: "t" })) as { runs: Record<string, unknown>[] }).runs[0]!,
    ];
    for (const run of json) expect([run.id, run.runId]).toEqual([id, id]);
    const stop = new AbortController();
    for await (const m of client.dag.watchRun({ tenantKey: "t", runId: id }, { signal: stop.signal })) {
      expect([m.run!.id, m.run!.runId]).toEqual([id, id]);
      stop.abort();
      break;
    }
  });
});
