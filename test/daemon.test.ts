import { beforeAll, describe, expect, it } from "vitest";
import { Health, HealthCheckResponse_ServingStatus } from "@aiflow/wire/gen/grpc/health/v1/health_pb.js";
import type { Daemon } from "../src/daemon.js";
import type { TestDb } from "./support/db.js";
import { TOKENS } from "./support/daemon.js";
import { grpc, loadService, unary } from "./support/grpc-js.js";
import { useTestDaemon } from "./support/kit.js";

// The daemon migrates the schema itself.
const fx = useTestDaemon({ label: "daemon", migrate: false });
let db: TestDb;
let daemon: Daemon;
beforeAll(() => void ({ db, daemon } = fx));

describe("daemon over real HTTP/2", () => {
  it("answers Health/Check from a stock grpc-js client without a token", async () => {
    const HealthClient = loadService("grpc/health/v1/health.proto", "grpc.health.v1.Health");
    const client = new HealthClient(daemon.address, grpc.credentials.createInsecure());
    const [err, res] = await unary<{ status: string }>(client, "check", { service: "" });
    client.close();
    expect(err).toBeNull();
    expect(res?.status).toBe("SERVING");
  });

  it("answers Health/Check from our connect client", async () => {
    const client = fx.client(Health);
    expect((await client.check({ service: "" })).status).toBe(HealthCheckResponse_ServingStatus.SERVING);
    expect((await client.check({ service: "grpc.health.v1.Health" })).status).toBe(HealthCheckResponse_ServingStatus.SERVING);
  });

  it("migrated the schema on start", async () => {
    const rows = await db.raw<{ n: number }>(`SELECT count(*)::int AS n FROM information_schema.tables WHERE table_schema = $1`, [db.schema]);
    expect(rows[0]!.n).toBeGreaterThanOrEqual(7);
  });

  it("refuses reflection without a token and serves it with one (deny by default)", async () => {
    const Reflection = loadService("grpc/reflection/v1/reflection.proto", "grpc.reflection.v1.ServerReflection");
    const client = new Reflection(daemon.address, grpc.credentials.createInsecure());
    const list = (token?: string) =>
      new Promise<{ code: number; services: string[] }>((resolve) => {
        const md = new grpc.Metadata();
        if (token) md.set("authorization", `Bearer ${token}`);
        const call = (
          client as unknown as {
            serverReflectionInfo(md: grpc.Metadata): grpc.ClientDuplexStream<object, { listServicesResponse?: { service: { name: string }[] } }>;
          }
        ).serverReflectionInfo(md);
        const services: string[] = [];
        call.on("data", (m) => services.push(...(m.listServicesResponse?.service ?? []).map((s: { name: string }) => s.name)));
        call.on("error", (e: grpc.ServiceError) => resolve({ code: e.code, services }));
        call.on("end", () => resolve({ code: 0, services }));
        call.write({ listServices: "*" });
        call.end();
      });
    expect((await list()).code).toBe(grpc.status.UNAUTHENTICATED);
    expect((await list("wrong-token-xyz")).code).toBe(grpc.status.UNAUTHENTICATED);
    const ok = await list(TOKENS.ops);
    expect(ok.code).toBe(0);
    expect(ok.services).toContain("grpc.health.v1.Health");
    expect(ok.services).toContain("grpc.reflection.v1.ServerReflection");
    client.close();
  });
});

describe("graceful shutdown", () => {
  it("ends Health/Watch streams with NOT_SERVING, then stops accepting calls", async () => {
    const other = await fx.startDaemon();
    const client = fx.clientAt(other.address, Health);
    const statuses: HealthCheckResponse_ServingStatus[] = [];
    const watching = (async () => {
      for await (const m of client.watch({ service: "" })) {
        statuses.push(m.status);
        if (statuses.length === 1) void other.stop();
      }
    })();
    await watching;
    expect(statuses[0]).toBe(HealthCheckResponse_ServingStatus.SERVING);
    expect(statuses.at(-1)).toBe(HealthCheckResponse_ServingStatus.NOT_SERVING);
    await other.stop();
    await expect(client.check({})).rejects.toThrow();
  });
});
