/**
 * The console under mutual TLS, in headless Chromium: the browser presents a client certificate of
 * role ops and signs in with it alone (no token), and the daemon names it as on the gRPC port; a
 * certificate of another role is refused by the daemon; the page is HTTPS only.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Browser } from "playwright-core";
import { launchChromium } from "./support/browser.js";
import type { Daemon } from "../src/daemon.js";
import { useTestDb } from "./support/kit.js";
import { Pki } from "./support/pki.js";

/** expect.poll with room for the page's own polling (its views read every 2-5 s) on a loaded machine. */
const eventually = <T>(fn: () => T | Promise<T>, opts: { timeout?: number } = {}) => expect.poll(fn, { timeout: 15_000, ...opts });
const fx = useTestDb("consolemtls");
const pki = Pki.create();
let D: Daemon;
let browser: Browser;

beforeAll(async () => {
  const server = pki.server();
  D = await fx.startDaemon({ config: { httpListen: { host: "127.0.0.1", port: 0 }, tlsCert: server.cert, tlsKey: server.key, tlsClientCa: pki.ca.cert } });
  browser = await launchChromium();
}, 60_000);

afterAll(async () => {
  await browser?.close();
  pki.close();
});

async function signInWith(role: string) {
  const cert = pki.client(`${role}-browser`, { uris: [`spiffe://aiflow/${role}/${role}-browser`] });
  const context = await browser.newContext({ ignoreHTTPSErrors: true, clientCertificates: [{ origin: D.httpUrl!, certPath: cert.cert, keyPath: cert.key }] });
  const page = await context.newPage();
  await page.goto(`${D.httpUrl}/console/`);
  await page.getByRole("button", { name: "Sign in with my client certificate" }).click();
  return { page, context };
}

describe("the console under mutual TLS", () => {
  it("signs in with an ops client certificate and no token", async () => {
    expect(D.httpUrl).toMatch(/^https:/);
    const { page, context } = await signInWith("ops");
    await page.getByRole("heading", { name: "Fleet" }).waitFor();
    expect(await page.locator(".count").textContent()).toBe("0 agents");
    await context.close();
  });

  it("refuses a certificate of another role at the daemon, with its reason", async () => {
    const { page, context } = await signInWith("runs");
    await eventually(() => page.getByRole("alert").textContent()).toMatch(/needs a token with role 'ops'/);
    expect(await page.getByRole("heading", { name: "Fleet" }).count()).toBe(0);
    await context.close();
  });
});
