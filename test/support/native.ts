/**
 * Graph runs and state machines in tests: GraphService and MachineService clients with a runs token
 * on a connection of their own, and waits on a run's state (GetRun, checked until it holds).
 */
import type { MessageInitShape } from "@bufbuild/protobuf";
import { GraphService, RunStatus, type DefinitionSchema as GraphDefinitionSchema, type Run as GraphRun } from "@aiflow/wire/gen/aiflow/graph/v1/graph_pb.js";
import { MachineService, type DefinitionSchema as MachineDefinitionSchema, type Run as MachineRun } from "@aiflow/wire/gen/aiflow/machine/v1/machine_pb.js";
import { TOKENS } from "./daemon.js";
import { Connection, until } from "./kit.js";

export type GraphDef = MessageInitShape<typeof GraphDefinitionSchema>;
export type MachineDef = MessageInitShape<typeof MachineDefinitionSchema>;

export class GraphClient {
  readonly conn: Connection;
  readonly graph;

  constructor(address: string, token: string = TOKENS.runs) {
    this.conn = new Connection(address, { token });
    this.graph = this.conn.client(GraphService);
  }

  async start(tenant: string, def: GraphDef, state: unknown = {}): Promise<GraphRun> {
    return (await this.graph.startRun({ tenantKey: tenant, source: { case: "definition", value: def }, stateJson: JSON.stringify(state) })).run!;
  }

  async get(tenant: string, runId: string): Promise<GraphRun> {
    return (await this.graph.getRun({ tenantKey: tenant, runId })).run!;
  }

  /** The run once it has ended (any status but running). */
  async ended(tenant: string, runId: string, timeoutMs = 20_000): Promise<GraphRun> {
    let run: GraphRun | undefined;
    await until(`graph run ${runId} ended`, async () => (run = await this.get(tenant, runId)).status !== RunStatus.RUNNING, timeoutMs, 20);
    return run!;
  }

  close(): void {
    this.conn.close();
  }
}

export class MachineClient {
  readonly conn: Connection;
  readonly machine;

  constructor(address: string, token: string = TOKENS.runs) {
    this.conn = new Connection(address, { token });
    this.machine = this.conn.client(MachineService);
  }

  async start(tenant: string, def: MachineDef, context: unknown = {}): Promise<MachineRun> {
    return (await this.machine.startRun({ tenantKey: tenant, source: { case: "definition", value: def }, contextJson: JSON.stringify(context) })).run!;
  }

  async get(tenant: string, runId: string): Promise<MachineRun> {
    return (await this.machine.getRun({ tenantKey: tenant, runId })).run!;
  }

  signal(tenant: string, runId: string, event: string, payload?: unknown) {
    return this.machine.signalRun({ tenantKey: tenant, runId, event, payloadJson: payload === undefined ? "" : JSON.stringify(payload) });
  }

  /** The machine once `check` holds of it. */
  async when(tenant: string, runId: string, what: string, check: (r: MachineRun) => boolean, timeoutMs = 20_000): Promise<MachineRun> {
    let run: MachineRun | undefined;
    await until(`machine ${runId}: ${what}`, async () => check((run = await this.get(tenant, runId))), timeoutMs, 20);
    return run!;
  }

  close(): void {
    this.conn.close();
  }
}
