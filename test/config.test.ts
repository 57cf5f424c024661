import { describe, expect, it } from "vitest";
import { ConfigError, parseArgs, parseDuration } from "../src/config.js";
import { parseTokensFile } from "../src/domain/tokens.js";

// The aiflowd command's answers to the same settings: config-cli.test.ts (slow tier: it runs processes).
describe("config", () => {
  it("applies defaults, env and flags in that order of precedence", () => {
    expect(parseArgs([], {}).config.listen).toEqual({ host: "127.0.0.1", port: 7400 });
    expect(parseArgs([], { AIFLOW_LISTEN: "0.0.0.0:9000" }).config.listen).toEqual({ host: "0.0.0.0", port: 9000 });
    expect(parseArgs(["--listen", "[::1]:7401"], { AIFLOW_LISTEN: "0.0.0.0:9000" }).config.listen).toEqual({ host: "::1", port: 7401 });
    expect(parseArgs(["--lease-ttl=45s"], {}).config.leaseTtl).toBe(45_000);
    expect(parseArgs([], { DATABASE_URL: "postgres://x/y" }).config.databaseUrl).toBe("postgres://x/y");
    expect(parseArgs([], {}).config.enqueueWindow).toBe(8);
    expect(parseArgs([], { AIFLOW_ENQUEUE_WINDOW: "0" }).config.enqueueWindow).toBe(0);
    expect(parseArgs(["--enqueue-window", "20ms"], { AIFLOW_ENQUEUE_WINDOW: "0" }).config.enqueueWindow).toBe(20);
  });

  // slonik reads the URL with the WHATWG parser, and reads a percent-encoded host that starts with
  // '/' as a Unix socket's directory (as pg does): what it would connect to is checked that way.
  it("takes a Unix socket as libpq writes it (an empty host and a host parameter), and refuses a URL that does not parse", () => {
    const url = (raw: string) => parseArgs(["--database-url", raw], {}).config.databaseUrl!;
    const socket = url("postgresql://root@/test?host=/var/run/postgresql&port=5433&application_name=a");
    const parsed = new URL(socket);
    expect([decodeURIComponent(parsed.hostname), parsed.port, parsed.username, parsed.pathname, parsed.searchParams.get("application_name")]).toEqual([
      "/var/run/postgresql",
      "5433",
      "root",
      "/test",
      "a",
    ]);
    expect(parsed.searchParams.has("host")).toBe(false);
    expect(url("postgres://u:p@db.internal:6432/app?sslmode=require")).toBe("postgres://u:p@db.internal:6432/app?sslmode=require");
    expect(url("postgresql:///test?host=/tmp")).toBe("postgresql:///test?host=/tmp");
    expect(() => url("mysql://root@localhost/test")).toThrow(/--database-url.*not a postgres/);
    expect(() => url("postgresql://root:secret@/test")).toThrow(ConfigError);
    expect(() => url("postgresql://root:secret@/test")).not.toThrow(/secret/);
  });

  it("parses token grants from flags and env, with tenant limits", () => {
    const { tokens } = parseArgs(["--token", "agent:secret-aaa", "--token", "engine:secret-bbb:t1,t2"], {}).config;
    expect(tokens.map((t) => [t.role, t.tenants])).toEqual([
      ["agent", undefined],
      ["engine", ["t1", "t2"]],
    ]);
    expect(parseArgs([], { AIFLOW_TOKENS: "ops:secret-ccc;agent:secret-ddd" }).config.tokens).toHaveLength(2);
    expect(() => parseArgs(["--token", "admin:secret-eee"], {})).toThrow(/--token/);
  });

  it("reads a tokens file's agent-name limits, and refuses them on other roles or malformed", () => {
    const file = (entry: Record<string, unknown>) => JSON.stringify([{ role: "agent", token: "secret-fff", ...entry }]);
    expect(parseTokensFile(file({ agents: ["gpu-*", "solo"] }), "--tokens-file")[0]?.agents).toEqual(["gpu-*", "solo"]);
    expect(parseTokensFile(file({}), "--tokens-file")[0]?.agents).toBeUndefined();
    const refused: [Record<string, unknown>, RegExp][] = [
      [{ role: "engine", agents: ["x"] }, /agent tokens only/],
      [{ agents: [] }, /non-empty array/],
      [{ agents: "gpu-*" }, /non-empty array/],
      [{ agents: ["g*pu"] }, /prefix ending in '\*'/],
      [{ agents: ["gpu-**"] }, /prefix ending in '\*'/],
      [{ agents: ["bad name"] }, /entry 0/],
    ];
    for (const [entry, re] of refused) expect(() => parseTokensFile(file(entry), "--tokens-file")).toThrow(re);
  });

  it("names the setting in every error", () => {
    const cases: [string[], Record<string, string>, RegExp][] = [
      [["--listen", "nowhere"], {}, /--listen/],
      [[], { AIFLOW_LEASE_TTL: "forever" }, /AIFLOW_LEASE_TTL/],
      [["--schema", "Bad-Name"], {}, /--schema/],
      [["--db-pool-size", "1"], {}, /--db-pool-size/],
      [["--no-such-flag", "1"], {}, /--no-such-flag/],
      [["--backoff-base", "10m", "--backoff-cap", "1m"], {}, /--backoff-cap/],
      [[], { AIFLOW_ENQUEUE_WINDOW: "5s" }, /AIFLOW_ENQUEUE_WINDOW.*longer than the maximum 1000ms/],
      [["--tenant-weights", "a=0"], {}, /--tenant-weights.*the weight of 'a' must be between/],
      [["--tenant-weights", "=3"], {}, /--tenant-weights.*'=3' is not tenant=weight/],
      [[], { AIFLOW_TENANT_WEIGHTS: "a=heavy" }, /AIFLOW_TENANT_WEIGHTS.*the weight of 'a' is not a number/],
    ];
    for (const [argv, env, re] of cases) {
      const err = (() => {
        try {
          parseArgs(argv, env);
        } catch (e) {
          return e;
        }
      })();
      expect(err, argv.join(" ")).toBeInstanceOf(ConfigError);
      expect((err as Error).message).toMatch(re);
    }
  });

  it("reads tenants' weights, the fair-share credit and aging", () => {
    const { config } = parseArgs(["--tenant-weights", "acme=3, beta=0.5", "--priority-aging", "30s"], { AIFLOW_FAIR_SHARE_CREDIT: "10" });
    expect([...config.tenantWeights]).toEqual([
      ["acme", 3],
      ["beta", 0.5],
    ]);
    expect(config.priorityAging).toBe(30_000);
    expect(config.fairShareCredit).toBe(10);
    const defaults = parseArgs([], {}).config;
    expect([defaults.tenantWeights.size, defaults.fairShareCredit, defaults.priorityAging]).toEqual([0, 100, 0]);
  });

  it("parses durations", () => {
    expect(parseDuration("500ms")).toBe(500);
    expect(parseDuration("1.5s")).toBe(1500);
    expect(parseDuration("2h")).toBe(7_200_000);
    expect(parseDuration("250")).toBe(250);
  });
});
