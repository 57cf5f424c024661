/**
 * The operators' console end to end, in headless Chromium (Debian's, driven by playwright-core)
 * against a real daemon and three real SDK agents: sign-in (a wrong token refused by the daemon,
 * not merely by the page), the fleet with the agents' heartbeat metrics, a drain with a deadline
 * whose progress reaches done, a dead letter redriven, a DAG run's graph; every view passes axe-core
 * with no serious or critical violation, the dialogs work from the keyboard, and the page runs
 * under its Content-Security-Policy with no violation. A failing case leaves a screenshot in
 * .tmp/console-screenshots/ (every case does with CONSOLE_SCREENSHOTS=1).
 */
import { mkdirSync, readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import type { Browser, Page } from "playwright-core";
import { launchChromium } from "./support/browser.js";
import { createAgent, NonRetryableError, type Agent } from "../agent-sdk/src/index.js";
import { QueueService } from "@aiflow/wire/gen/aiflow/cluster/v1/queue_pb.js";
import type { Daemon } from "../src/daemon.js";
import { TOKENS } from "./support/daemon.js";
import { DagClient, chain, definition } from "./support/dag.js";
import { until, useTestDb } from "./support/kit.js";

/** expect.poll with room for the page's own polling (its views read every 2-5 s) on a loaded machine. */
const eventually = <T>(fn: () => T | Promise<T>, opts: { timeout?: number } = {}) => expect.poll(fn, { timeout: 15_000, ...opts });
const SHOTS = ".tmp/console-screenshots";
const AXE = readFileSync(createRequire(import.meta.url).resolve("axe-core/axe.min.js"), "utf8");

const fx = useTestDb("console");
let D: Daemon;
let base: string;
let browser: Browser;
let page: Page;
const agents: Agent[] = [];
/** Problems the page reported: console errors, CSP violations, failed requests of its own assets. */
const problems: string[] = [];
let release: () => void = () => undefined;
const held = new Promise<void>((r) => (release = r));
let failedOnce = false;

beforeAll(async () => {
  D = await fx.startDaemon({ config: { httpListen: { host: "127.0.0.1", port: 0 }, heartbeatInterval: 500, heartbeatFlush: 100, sweepInterval: 200 } });
  base = D.httpUrl!;
  for (const [i, name] of ["gpu-a", "gpu-b", "cpu-c"].entries()) {
    const agent = createAgent({
      address: D.address,
      token: TOKENS.agent,
      name,
      tenants: ["t"],
      slots: 4,
      tags: { pool: i < 2 ? "gpu" : "cpu" },
      logger: (await import("pino")).pino({ level: "silent" }),
      claimWaitMs: 1_000,
      heartbeatMetrics: {
        cpuUtilization: 20 + i * 30,
        memory: { usedMb: 2048 * (i + 1), totalMb: 16384 },
        gpus: i < 2 ? [{ index: 0, model: "L40S", memoryUsedMb: 4096, memoryTotalMb: 49152, utilization: 60 }] : [],
      },
      handlers: {
        // Held until the test lets go: gives the drained agent work in flight.
        hold: async () => {
          await held;
          return { held: true };
        },
        // Fails for good the first time, so it dead-letters; a redrive then completes it.
        flaky: async () => {
          if (!failedOnce) {
            failedOnce = true;
            throw new NonRetryableError("the model file was missing");
          }
          return { ok: true };
        },
        dag: async (item) => ({ node: item.taskName }),
      },
    });
    await agent.start();
    agents.push(agent);
  }
  browser = await launchChromium();
  page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
  // A step that cannot happen fails with what it waited for, not with the test's timeout.
  page.setDefaultTimeout(10_000);
  page.on("console", (m) => {
    if (m.type() === "error" && !/401|Unauthorized/.test(m.text())) problems.push(`console: ${m.text()}`);
  });
  page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
  await page.exposeFunction("__cspViolation", (v: string) => problems.push(`CSP: ${v}`));
  // (Page code as text: this file is compiled without the DOM's types.)
  await page.addInitScript({
    content: 'document.addEventListener("securitypolicyviolation", (e) => window.__cspViolation(e.violatedDirective + " " + e.blockedURI));',
  });
}, 60_000);

afterEach(async (ctx) => {
  if ((ctx.task.result?.state === "fail" || process.env.CONSOLE_SCREENSHOTS) && page) {
    mkdirSync(SHOTS, { recursive: true });
    await page.screenshot({ path: `${SHOTS}/${ctx.task.name.replace(/[^a-z0-9]+/gi, "-").slice(0, 80)}.png`, fullPage: true }).catch(() => undefined);
  }
});

afterAll(async () => {
  release();
  await browser?.close();
  await Promise.all(agents.map((a) => a.stop().catch(() => undefined)));
});

/** axe-core on the page as it is: serious and critical violations, by rule and target. */
async function accessibilityProblems(): Promise<string[]> {
  await page.evaluate(AXE);
  const result = (await page.evaluate("axe.run()")) as {
    violations: { id: string; impact: string; nodes: { target: string[] }[] }[];
  };
  return result.violations
    .filter((v) => v.impact === "serious" || v.impact === "critical")
    .map((v) => `${v.id}: ${v.nodes.map((n) => n.target.join(" ")).join(", ")}`);
}

/** With CONSOLE_SCREENSHOTS=1, a picture of the page now, for a person to look at. */
const shot = async (name: string) => {
  if (!process.env.CONSOLE_SCREENSHOTS) return;
  mkdirSync(SHOTS, { recursive: true });
  await page.screenshot({ path: `${SHOTS}/${name}.png`, fullPage: true });
};

const row = (name: string) => page.locator(`tr[data-agent="${name}"]`);

describe("the console", () => {
  it("is served with a strict Content-Security-Policy and no cookie, and the API refuses a wrong token itself", async () => {
    const res = await fetch(`${base}/console/`);
    expect(res.status).toBe(200);
    const csp = res.headers.get("content-security-policy")!;
    expect(csp).toContain("script-src 'self'");
    expect(csp).toContain("frame-ancestors 'none'");
    expect(csp).not.toMatch(/unsafe-inline|unsafe-eval/);
    expect(res.headers.get("set-cookie")).toBeNull();
    expect(await res.text()).not.toMatch(/<script>(?!\s*<\/script>)/);
    // The daemon, not the page, refuses: the same call without a token, with a wrong one, with another role's.
    const call = (token?: string) =>
      fetch(`${base}/api/aiflow.cluster.v1.OpsService/ListAgents`, {
        method: "POST",
        headers: { "content-type": "application/json", ...(token ? { authorization: `Bearer ${token}` } : {}) },
        body: "{}",
      });
    expect((await call()).status).toBe(401);
    expect((await call("not-a-token-at-all")).status).toBe(401);
    expect((await call(TOKENS.agent)).status).toBe(403);
    expect((await call(TOKENS.ops)).status).toBe(200);
    // No CORS: a page of another origin gets nothing it may read.
    const cors = await fetch(`${base}/api/aiflow.cluster.v1.OpsService/ListAgents`, {
      method: "OPTIONS",
      headers: { origin: "https://evil.example", "access-control-request-method": "POST" },
    });
    expect(cors.headers.get("access-control-allow-origin")).toBeNull();
  });

  it("refuses a wrong token at sign-in with the daemon's answer, and signs in with the keyboard alone", async () => {
    await page.goto(`${base}/console/`);
    const refused = page.waitForResponse((r) => r.url().includes("/api/") && r.status() === 401);
    await page.getByLabel("Ops token").fill("wrong-token-123456");
    await page.getByRole("button", { name: "Sign in" }).click();
    await refused;
    await eventually(() => page.getByRole("alert").textContent()).toMatch(/token/i);
    expect(await page.evaluate("sessionStorage.length")).toBe(0);
    expect(await accessibilityProblems()).toEqual([]);
    // Keyboard: focus the field, type, Enter.
    await page.getByLabel("Ops token").fill("");
    await page.getByLabel("Ops token").focus();
    await page.keyboard.type(TOKENS.ops);
    await page.keyboard.press("Enter");
    await page.getByRole("heading", { name: "Fleet" }).waitFor();
    expect((await page.context().cookies()).length).toBe(0);
  });

  it("shows the three agents with their heartbeat metrics, charted", async () => {
    for (const name of ["gpu-a", "gpu-b", "cpu-c"]) await row(name).waitFor();
    // Two heartbeats at least, so the charts have a line.
    await eventually(
      async () =>
        (await row("cpu-c")
          .getByRole("img", { name: /cpu-c CPU 80%/ })
          .count()) > 0,
      { timeout: 15_000 },
    ).toBe(true);
    await eventually(() => row("gpu-a").getByRole("img", { name: "gpu-a GPU 0 utilisation" }).count()).toBe(1);
    expect(await row("cpu-c").getByRole("img", { name: /GPU/ }).count()).toBe(0);
    expect(await row("gpu-b").textContent()).toMatch(/4\.0 GiB of 16\.0 GiB/);
    // Filters: by tag.
    await page.getByLabel("Tags").fill("pool=gpu");
    await page.getByLabel("Tags").press("Enter");
    await eventually(() => page.locator("tr[data-agent]").count()).toBe(2);
    await page.getByLabel("Tags").fill("");
    await page.getByLabel("Tags").press("Enter");
    await eventually(() => page.locator("tr[data-agent]").count()).toBe(3);
    expect(await accessibilityProblems()).toEqual([]);
  });

  it("drains an agent with a deadline, from the keyboard, and shows its progress reach done", async () => {
    // Give gpu-a work in flight, and only gpu-a: the other two are drained out of the way first.
    const queue = fx.clientAt(D.address, QueueService, TOKENS.engine);
    await fx.clientAt(D.address, (await import("@aiflow/wire/gen/aiflow/cluster/v1/ops_pb.js")).OpsService, TOKENS.ops).drainAgent({ name: "gpu-b" });
    await fx.clientAt(D.address, (await import("@aiflow/wire/gen/aiflow/cluster/v1/ops_pb.js")).OpsService, TOKENS.ops).drainAgent({ name: "cpu-c" });
    await queue.enqueue({ tenantKey: "t", items: [{ engineKind: "hold", payloadJson: "{}" }] });
    await eventually(() => row("gpu-a").locator("td").nth(4).textContent(), { timeout: 15_000 }).toBe("1");
    const drain = row("gpu-a").getByRole("button", { name: "Drain" });
    await drain.focus();
    await page.keyboard.press("Enter");
    const dialog = page.getByRole("dialog", { name: "Drain gpu-a" });
    await dialog.waitFor();
    expect(await accessibilityProblems()).toEqual([]);
    // Escape closes it without draining.
    await page.keyboard.press("Escape");
    await eventually(() => dialog.isVisible()).toBe(false);
    await drain.click();
    await dialog.getByLabel(/Deadline in minutes/).fill("5");
    await dialog.getByLabel("Reason").fill("rolling deploy");
    await shot("drain-dialog");
    await dialog.getByRole("button", { name: "Drain" }).click();
    await eventually(() => row("gpu-a").locator("[data-drain]").getAttribute("data-drain"), { timeout: 10_000 }).toBe("running");
    expect(await row("gpu-a").textContent()).toMatch(/1 of 1 left.*deadline/);
    release();
    await eventually(() => row("gpu-a").locator("[data-drain]").getAttribute("data-drain"), { timeout: 15_000 }).toBe("done");
    expect(await row("gpu-a").textContent()).toContain("drained");
    for (const name of ["gpu-a", "gpu-b", "cpu-c"])
      await row(name)
        .getByRole("button", { name: "Undrain" })
        .click()
        .then(() =>
          page
            .getByRole("dialog", { name: `Undrain ${name}` })
            .getByRole("button", { name: "Undrain" })
            .click(),
        );
    await eventually(() => page.locator("tr[data-agent] .status.active").count(), { timeout: 10_000 }).toBe(3);
  });

  it("redrives a dead letter, after which it completes", async () => {
    const queue = fx.clientAt(D.address, QueueService, TOKENS.engine);
    const [id] = (await queue.enqueue({ tenantKey: "t", items: [{ engineKind: "flaky", payloadJson: "{}", maxRetries: 0 }] })).results.map((r) => r.id);
    await page.getByRole("link", { name: "Queue" }).click();
    const dead = page.locator(`tr[data-item="${id}"]`);
    await dead.waitFor({ timeout: 15_000 });
    expect(await dead.textContent()).toContain("the model file was missing");
    expect(await accessibilityProblems()).toEqual([]);
    await dead.getByRole("button", { name: "Redrive" }).click();
    await page
      .getByRole("dialog", { name: `Redrive ${id}` })
      .getByRole("button", { name: "Redrive" })
      .click();
    await eventually(() => dead.count(), { timeout: 10_000 }).toBe(0);
    await until("the redriven item completes", async () => (await queue.getItem({ tenantKey: "t", id: id! })).item!.status === 3, 15_000, 50);
  });

  it("names work no active agent serves, with its oldest item's age", async () => {
    const queue = fx.clientAt(D.address, QueueService, TOKENS.engine);
    const [id] = (await queue.enqueue({ tenantKey: "t", items: [{ engineKind: "no-pollers", payloadJson: "{}" }] })).results.map((r) => r.id);
    await page.getByRole("link", { name: "Queue" }).click();
    const unserved = page.getByRole("table", { name: "Unserved" }).locator("tbody tr", { hasText: "no-pollers" });
    await unserved.waitFor({ timeout: 15_000 });
    expect((await unserved.locator("th, td").allTextContents()).map((t) => t.trim())).toEqual([
      "t",
      "no-pollers",
      "1",
      expect.stringMatching(/^(now|\d+ s)$/),
      "none registered",
    ]);
    expect(await accessibilityProblems()).toEqual([]);
    await queue.cancel({ tenantKey: "t", ids: [id!] });
    await eventually(() => unserved.count(), { timeout: 10_000 }).toBe(0);
  });

  it("opens a DAG run's graph, its nodes with their states and agents", async () => {
    const dag = fx.closers.add(new DagClient(D.address));
    const run = await dag.start("t", definition(chain(3)));
    await dag.until("t", run.id, 2);
    await page.getByRole("link", { name: "Items and runs" }).click();
    await page.getByLabel("Tenant").fill("t");
    await page.getByLabel("Run id").fill(run.id);
    await page.getByRole("button", { name: "Open run" }).click();
    await page.locator("[data-run-status]").waitFor();
    expect(await page.locator("[data-run-status]").getAttribute("data-run-status")).toBe("completed");
    const nodes = page.locator("g[data-node]");
    expect(await Promise.all((await nodes.all()).map(async (g) => [await g.getAttribute("data-node"), await g.getAttribute("data-status")]))).toEqual([
      ["n0", "completed"],
      ["n1", "completed"],
      ["n2", "completed"],
    ]);
    expect(await page.locator(".graph path.edge").count()).toBe(2);
    await shot("run-graph");
    expect(await page.locator(".node-list").textContent()).toMatch(/n1: completed, after n0, on (gpu-a|gpu-b|cpu-c)/);
    expect(await accessibilityProblems()).toEqual([]);
    // An item of the run opens from its attempt.
    await page.locator("table a[href^='#/items/']").first().click();
    await eventually(() => page.locator(".detail").textContent()).toMatch(/Statuscompleted/);
  });

  it("drains every agent a filter matches, for a rolling deploy, and finds a pending item by its key and cancels it", async () => {
    await page.getByRole("link", { name: "Fleet" }).click();
    await page.getByLabel("Tags").fill("pool=cpu");
    await page.getByLabel("Tags").press("Enter");
    await eventually(() => page.locator("tr[data-agent]").count()).toBe(1);
    await page.getByRole("button", { name: "Drain matching…" }).click();
    const dialog = page.getByRole("dialog", { name: "Drain matching agents" });
    expect(await dialog.textContent()).toContain("tagged pool=cpu");
    // Before anyone confirms, the dialog lists whom the drain would hit (a dry run: nothing drains yet).
    const listed = dialog.getByRole("list", { name: "Agents it would drain" });
    await eventually(() => listed.locator("li").evaluateAll((els) => els.map((e) => e.getAttribute("data-preview-agent")))).toEqual(["cpu-c"]);
    expect(await dialog.textContent()).toContain("It would drain 1 agent:");
    expect(await row("cpu-c").locator(".status").textContent()).toBe("active");
    // A version that is not one is refused as it is typed, in the words the daemon refuses it with.
    await dialog.getByLabel("Version below").fill("sim-1.1.0");
    await eventually(() => dialog.locator(".drain-preview").textContent()).toContain("'sim-1.1.0' is not a version");
    await dialog.getByLabel("Version below").fill("");
    await eventually(() => listed.locator("li").count()).toBe(1);
    await dialog.getByRole("button", { name: "Drain them" }).click();
    await eventually(() => page.getByRole("status").textContent()).toBe("1 agents draining");
    await eventually(() => row("cpu-c").locator(".status").textContent()).toBe("draining");
    await page.getByLabel("Tags").fill("");
    await page.getByLabel("Tags").press("Enter");
    await eventually(() => page.locator("tr[data-agent] .status.active").count()).toBe(2);

    const queue = fx.clientAt(D.address, QueueService, TOKENS.engine);
    const [id] = (
      await queue.enqueue({ tenantKey: "t", items: [{ engineKind: "nobody-runs-this", payloadJson: "{}", idempotencyKey: "order-77" }] })
    ).results.map((r) => r.id);
    // Found by its producer's key, then opened.
    await page.getByRole("link", { name: "Items and runs" }).click();
    await page.getByLabel("or with idempotency key").fill("order-77");
    await page.getByRole("button", { name: "List items" }).click();
    await page.locator(`tr[data-item="${id}"]`).getByRole("link").click();
    await eventually(() => page.locator(".detail").textContent()).toMatch(/Statuspending/);
    await page.getByRole("button", { name: "Cancel item" }).click();
    await page
      .getByRole("dialog", { name: `Cancel ${id}` })
      .getByRole("button", { name: "Cancel item" })
      .click();
    await eventually(() => page.locator(".detail").textContent(), { timeout: 10_000 }).toMatch(/Statuscancelled/);
  }, 60_000);

  it("shows bindings and limits, sets and clears a rate limit, and ran under its CSP with no error", async () => {
    await page.getByRole("link", { name: "Bindings and limits" }).click();
    await page.getByRole("heading", { name: "Tenants" }).waitFor();
    await eventually(() => page.locator("table").nth(2).textContent()).toMatch(/t/);
    await page.getByRole("button", { name: "Set a rate limit…" }).click();
    const dialog = page.getByRole("dialog", { name: "Set a rate limit" });
    await dialog.getByLabel("Tenant").fill("t");
    await dialog.getByLabel("Key", { exact: true }).fill("api");
    await dialog.getByLabel("Dispatches").fill("50");
    await dialog.getByRole("button", { name: "Set it" }).click();
    const rule = page.locator("table").nth(3).locator("tr", { hasText: "50 per 1 s" });
    await rule.waitFor();
    await rule.getByRole("button", { name: "Clear" }).click();
    await page.getByRole("dialog", { name: "Clear the rate limit of api" }).getByRole("button", { name: "Clear" }).click();
    await eventually(() => rule.count()).toBe(0);
    expect(await accessibilityProblems()).toEqual([]);
    expect(problems).toEqual([]);
  });
});
