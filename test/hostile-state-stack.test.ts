/**
 * Definitions and tokens built to exhaust the daemon's stack or a column's range (issue 51, item
 * 11), over real RPCs: a dependency cycle as long as the node cap allows, payload templates nested
 * thousands deep on every engine, and a page token whose priority int4 cannot hold. Each is bad input
 * and must be INVALID_ARGUMENT saying what to change, never INTERNAL (a RangeError or a database
 * error escaping as a bug).
 */
import { beforeAll, describe, expect, it } from "vitest";
import { Code } from "@connectrpc/connect";
import { NodeKind } from "@aiflow/wire/gen/aiflow/graph/v1/graph_pb.js";
import { OpsService } from "@aiflow/wire/gen/aiflow/cluster/v1/ops_pb.js";
import type { Daemon } from "../src/daemon.js";
import { MAX_JSON_DEPTH } from "../src/domain/json-text.js";
import { TOKENS } from "./support/daemon.js";
import { refusal, Session, useTestDaemon } from "./support/kit.js";
import { DagClient, definition } from "./support/dag.js";
import { GraphClient, MachineClient } from "./support/native.js";
import { Producer } from "./support/queue.js";

const fx = useTestDaemon({ label: "hstack" });
let D: Daemon;
let dags: DagClient;
let graphs: GraphClient;
let machines: MachineClient;
let p: Producer;

beforeAll(() => {
  D = fx.daemon;
  dags = fx.closers.add(new DagClient(D.address));
  graphs = fx.closers.add(new GraphClient(D.address));
  machines = fx.closers.add(new MachineClient(D.address));
  p = fx.closers.add(new Producer(D.address));
});

/** A template `{"a":{"a":…{"x":"{{ context.x }}"}…}}` nested `depth` objects deep. */
const deepTemplate = (depth: number) => `${'{"a":'.repeat(depth)}{"x":"{{ context.x }}"}${"}".repeat(depth)}`;

describe("a dependency cycle through every node", () => {
  it("of 9,999 nodes is INVALID_ARGUMENT naming the cycle, on StartRun and PutDefinition", async () => {
    const n = 9_999;
    const nodes = Array.from({ length: n }, (_, i) => ({ name: `n${i}`, dependsOn: [`n${(i + 1) % n}`] }));
    const start = await refusal(dags.start("t", definition(nodes)));
    expect(start.code).toBe(Code.InvalidArgument);
    // Named by its ends and its length: the whole ring would be some 70 kB of message.
    expect(start.rawMessage).toBe("node 'n0': is on a cycle: n0 -> n1 -> n2 -> n3 -> n4 -> n5 -> … (9989 more) … -> n9995 -> n9996 -> n9997 -> n9998 -> n0");
    const put = await refusal(dags.dag.putDefinition({ tenantKey: "t", definition: definition(nodes, { id: "ring" }) }));
    expect(put.code).toBe(Code.InvalidArgument);
  });
});

describe("a payload template nested thousands deep", () => {
  it(`is INVALID_ARGUMENT past ${MAX_JSON_DEPTH} levels on a DAG node, a graph node and a machine action; at the limit it is taken`, async () => {
    for (const depth of [3_000, 100_000]) {
      const dag = await refusal(dags.start("t", definition([{ name: "deep", payloadJson: deepTemplate(depth) }])));
      expect(dag.code).toBe(Code.InvalidArgument);
      expect(dag.rawMessage).toContain("node 'deep'.payload_json");
      expect(dag.rawMessage).toContain(`nested more than ${MAX_JSON_DEPTH}`);
      const graph = await refusal(
        graphs.start("t", {
          id: "g",
          start: "deep",
          nodes: [
            { name: "deep", kind: NodeKind.TASK, engineKind: "g", payloadJson: deepTemplate(depth) },
            { name: "end", kind: NodeKind.END },
          ],
          edges: [{ from: "deep", to: "end" }],
        }),
      );
      expect(graph.code).toBe(Code.InvalidArgument);
      expect(graph.rawMessage).toContain("node 'deep'.payload_json");
      const machine = await refusal(
        machines.start("t", {
          id: "m",
          initial: "a",
          states: [
            { name: "a", transitions: [{ event: "go", to: "b", action: { engineKind: "m", payloadJson: deepTemplate(depth) } }] },
            { name: "b", terminal: true },
          ],
        }),
      );
      expect(machine.code).toBe(Code.InvalidArgument);
      expect(machine.rawMessage).toContain("transitions[0].action.payload_json");
    }
    // The template's own object is one level more than its wrappers.
    const ok = await dags.start("t", definition([{ name: "deep", payloadJson: deepTemplate(MAX_JSON_DEPTH - 1) }]), { x: 1 });
    expect(ok.id).not.toBe("");
  });
});

describe("a forged page token", () => {
  it("whose priority int4 cannot hold (2^40, -2^40) is INVALID_ARGUMENT on QueueService and OpsService ListItems", async () => {
    const forge = (o: object) => Buffer.from(JSON.stringify(o)).toString("base64url");
    const ops = fx.closers.add(new Session(D.address, OpsService, TOKENS.ops));
    for (const priority of [2 ** 40, -(2 ** 40)]) {
      const token = forge({ priority, createdon: 1, id: "x" });
      const queue = await refusal(p.q.listItems({ tenantKey: "t", pageToken: token }, p.call));
      expect(queue.code).toBe(Code.InvalidArgument);
      expect(queue.rawMessage).toContain("page_token");
      expect((await refusal(ops.client.listItems({ pageToken: token }, ops.call))).code).toBe(Code.InvalidArgument);
    }
  });
});
