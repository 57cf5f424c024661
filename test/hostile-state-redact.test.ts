/**
 * A database password never reaches the log (issue 51, item 12): libpq and pg take it from the
 * URL's query string (`?password=`, `?sslpassword=`) as well as from its userinfo, and the daemon
 * logs the URL it uses at start and names it in a refusal of --database-url.
 */
import { describe, expect, it } from "vitest";
import { parseArgs, redactDatabaseUrl } from "../src/config.js";
import { captureLog } from "./support/agents.js";
import { databaseUrl } from "./support/database-url.js";
import { useTestDb } from "./support/kit.js";

const fx = useTestDb("hredact");

describe("redactDatabaseUrl", () => {
  it("masks the userinfo's password and every query parameter named *password, in any case or percent-encoding", () => {
    expect(redactDatabaseUrl("postgres://u:pw@h:5432/db")).toBe("postgres://u:****@h:5432/db");
    expect(redactDatabaseUrl("postgres://u@h/db?password=s3cret&sslmode=require")).toBe("postgres://u@h/db?password=****&sslmode=require");
    expect(redactDatabaseUrl("postgres://u@h/db?sslmode=verify-full&sslpassword=k3y")).toBe("postgres://u@h/db?sslmode=verify-full&sslpassword=****");
    expect(redactDatabaseUrl("postgres://u:a@h/db?PASSWORD=b&pass%77ord=c&application_name=password")).toBe(
      "postgres://u:****@h/db?PASSWORD=****&pass%77ord=****&application_name=password",
    );
    expect(redactDatabaseUrl("postgresql://u@/db?host=/run/postgresql&password=zz")).toBe("postgresql://u@/db?host=/run/postgresql&password=****");
  });

  it("masks them in a refusal of --database-url", () => {
    expect(() => parseArgs(["--database-url", "postgres://u@[bad/db?password=s3cret"], {})).toThrow(/password=\*\*\*\*/);
    expect(() => parseArgs(["--database-url", "postgres://u@[bad/db?password=s3cret"], {})).not.toThrow(/s3cret/);
  });
});

describe("the daemon's start", () => {
  it("logs the database it uses without a password given in the query string", async () => {
    const captured = captureLog("info");
    const url = new URL(databaseUrl());
    url.searchParams.set("password", "hunter2-in-the-query");
    await fx.startDaemon({ log: captured.log, config: { databaseUrl: url.toString() } });
    const using = captured.lines().find((l) => l.msg === "using database");
    expect(using?.database).toContain("password=****");
    expect(captured.raw().join("\n")).not.toContain("hunter2");
  });
});
