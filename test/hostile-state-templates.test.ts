/**
 * Payload templates and fan-out paths that try to leave the data they are given (issue 51, item
 * 12): a path naming `__proto__`, `constructor` or `prototype` is refused when the definition is
 * checked, on every engine, with INVALID_ARGUMENT naming the field; and a path that names a key the
 * data does not own (an inherited method) reads as null, like any key that is not there.
 */
import { beforeAll, describe, expect, it } from "vitest";
import { Code } from "@connectrpc/connect";
import { NodeKind } from "@aiflow/wire/gen/aiflow/graph/v1/graph_pb.js";
import type { Daemon } from "../src/daemon.js";
import { checkTemplate, render, TemplateError } from "../src/engines/dag/template.js";
import { refusal, useTestDaemon } from "./support/kit.js";
import { DagClient, definition } from "./support/dag.js";
import { GraphClient, MachineClient } from "./support/native.js";

const fx = useTestDaemon({ label: "htmpl" });
let D: Daemon;
let dags: DagClient;
let graphs: GraphClient;
let machines: MachineClient;

beforeAll(() => {
  D = fx.daemon;
  dags = fx.closers.add(new DagClient(D.address));
  graphs = fx.closers.add(new GraphClient(D.address));
  machines = fx.closers.add(new MachineClient(D.address));
});

const WALKS = ["context.__proto__", "context.constructor.name", "context.a.constructor.constructor", "item.prototype", "context.__proto__.polluted"];

describe("a template path into an object's prototype", () => {
  it("is refused by the template check, naming the key", () => {
    for (const path of WALKS) expect(() => checkTemplate({ x: `{{ ${path} }}` }), path).toThrow(TemplateError);
    expect(() => checkTemplate({ x: "{{ context.constructor }}" })).toThrow("'context.constructor' names 'constructor', which a path may not");
  });

  it("is INVALID_ARGUMENT on a DAG node's payload and fan-out, a graph node and a machine action", async () => {
    for (const path of ["context.__proto__", "context.constructor.name"]) {
      const payloadJson = JSON.stringify({ x: `{{ ${path} }}` });
      const dag = await refusal(dags.start("t", definition([{ name: "n", payloadJson }])));
      expect([dag.code, dag.rawMessage]).toEqual([
        Code.InvalidArgument,
        expect.stringMatching(/^node 'n'.payload_json: bad template: .* which a path may not/),
      ]);
      const fan = await refusal(dags.start("t", definition([{ name: "n", fanOut: path }])));
      expect([fan.code, fan.rawMessage]).toEqual([Code.InvalidArgument, expect.stringMatching(/^node 'n'.fan_out: .* which a path may not/)]);
      const graph = await refusal(
        graphs.start("t", {
          id: "g",
          start: "n",
          nodes: [
            { name: "n", kind: NodeKind.TASK, engineKind: "g", payloadJson },
            { name: "end", kind: NodeKind.END },
          ],
          edges: [{ from: "n", to: "end" }],
        }),
      );
      expect([graph.code, graph.rawMessage]).toEqual([Code.InvalidArgument, expect.stringContaining("node 'n'.payload_json: bad template:")]);
      const machine = await refusal(
        machines.start("t", {
          id: "m",
          initial: "a",
          states: [
            { name: "a", transitions: [{ event: "go", to: "b", action: { engineKind: "m", payloadJson } }] },
            { name: "b", terminal: true },
          ],
        }),
      );
      expect([machine.code, machine.rawMessage]).toEqual([Code.InvalidArgument, expect.stringContaining("transitions[0].action.payload_json: bad template:")]);
    }
  });
});

describe("a template path to a key the data does not own", () => {
  it("reads as null, as a missing key does, never as an inherited method", () => {
    const scope = { context: { a: { b: 1 }, list: [1, 2] }, run_id: "r" };
    expect(render("{{ context.toString }}", scope)).toBeNull();
    expect(render("{{ context.a.hasOwnProperty }}", scope)).toBeNull();
    expect(render("{{ context.list.map }}", scope)).toBeNull();
    expect(render("v={{ context.a.valueOf }}", scope)).toBe("v=null");
    expect(render("{{ context.a.b }}", scope)).toBe(1);
  });
});
