import { describe, expect, it } from "vitest";
import { Code, createClient, createRouterTransport } from "@connectrpc/connect";
import { Health, HealthCheckResponse_ServingStatus } from "@aiflow/wire/gen/grpc/health/v1/health_pb.js";
import { Authenticator, type Access } from "../src/server/auth.js";
import { callerOf, assertTenant } from "../src/rpc/caller.js";
import { parseTokenSpec } from "../src/domain/tokens.js";
import { codeOf, refusal } from "./support/kit.js";

// Health stands in for a protected service here: the access map, not the service, decides who may call.
function clientFor(access: Access, grants = [parseTokenSpec("ops:ops-secret-1", "t"), parseTokenSpec("agent:agent-secret-1:t1", "t")]) {
  const auth = new Authenticator(grants);
  const seen: string[] = [];
  const transport = createRouterTransport(
    (router) =>
      router.service(Health, {
        check: (_req, ctx) => {
          if (access !== "public") {
            const who = callerOf(ctx);
            seen.push(who.principal);
            assertTenant(who, "t1");
          }
          return { status: HealthCheckResponse_ServingStatus.SERVING };
        },
      }),
    { router: { interceptors: [auth.interceptor(new Map([[Health.typeName, access]]))] } },
  );
  return { client: createClient(Health, transport), seen };
}

describe("auth", () => {
  it("no token is UNAUTHENTICATED, an unknown token too", async () => {
    const { client } = clientFor("ops");
    expect(await codeOf(client.check({}))).toBe(Code.Unauthenticated);
    expect(await codeOf(client.check({}, { headers: { authorization: "Bearer not-a-token" } }))).toBe(Code.Unauthenticated);
    expect(await codeOf(client.check({}, { headers: { authorization: "Basic b3BzOm9wcw==" } }))).toBe(Code.Unauthenticated);
  });

  it("a token of the wrong role is PERMISSION_DENIED; the right role passes with its identity", async () => {
    const { client, seen } = clientFor("ops");
    expect(await codeOf(client.check({}, { headers: { authorization: "Bearer agent-secret-1" } }))).toBe(Code.PermissionDenied);
    const ok = await client.check({}, { headers: { authorization: "Bearer ops-secret-1" } });
    expect(ok.status).toBe(HealthCheckResponse_ServingStatus.SERVING);
    expect(seen[0]).toMatch(/^ops-/);
  });

  it("a token limited to other tenants is PERMISSION_DENIED", async () => {
    const { client } = clientFor("any", [parseTokenSpec("engine:engine-secret:t2", "t")]);
    const err = await refusal(client.check({}, { headers: { authorization: "Bearer engine-secret" } }));
    expect(err.code).toBe(Code.PermissionDenied);
    expect(err.rawMessage).toContain("t1");
  });

  it("public services need no token", async () => {
    const { client } = clientFor("public");
    expect((await client.check({})).status).toBe(HealthCheckResponse_ServingStatus.SERVING);
  });

  it("a service missing from the access map is refused for everyone (deny by default)", async () => {
    const auth = new Authenticator([parseTokenSpec("ops:ops-secret-1", "t")]);
    const transport = createRouterTransport((r) => r.service(Health, { check: () => ({}) }), {
      router: { interceptors: [auth.interceptor(new Map())] },
    });
    const client = createClient(Health, transport);
    expect(await codeOf(client.check({}, { headers: { authorization: "Bearer ops-secret-1" } }))).toBe(Code.PermissionDenied);
  });

  it("with no tokens configured every role is open", async () => {
    const { client, seen } = clientFor("ops", []);
    await client.check({});
    expect(seen).toEqual(["anonymous"]);
  });
});
