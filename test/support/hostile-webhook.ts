/**
 * Hostile webhook deliveries over HTTP/1.1 (node:http, one connection each): bodies as raw bytes, so
 * a test can send what no JSON library would write (a raw NUL, a lone surrogate's bytes, invalid
 * UTF-8), and headers exactly as given, so a replay can drop or change the unsigned ones.
 */
import { createHash, createHmac } from "node:crypto";
import http from "node:http";
import type { Daemon } from "../../src/daemon.js";

export interface Answer {
  status: number;
  body: { outcome?: string; firing_id?: string; run_id?: string; error?: string; recorded?: boolean };
}

/** POSTs `body` to /hooks/<tenant>/<name> with exactly `headers` (and content-length). */
export function post(httpUrl: string, tenant: string, name: string, body: string | Buffer, headers: Record<string, string> = {}): Promise<Answer> {
  const bytes = typeof body === "string" ? Buffer.from(body) : body;
  const url = new URL(`/hooks/${encodeURIComponent(tenant)}/${encodeURIComponent(name)}`, httpUrl);
  return new Promise((resolve, reject) => {
    const req = http.request(
      url,
      { method: "POST", agent: false, headers: { "content-type": "application/json", "content-length": String(bytes.length), ...headers } },
      (res) => {
        const chunks: Buffer[] = [];
        res.on("data", (c: Buffer) => chunks.push(c));
        res.on("end", () => {
          const text = Buffer.concat(chunks).toString("utf8");
          let parsed: Answer["body"] = {};
          try {
            parsed = text ? (JSON.parse(text) as Answer["body"]) : {};
          } catch {
            parsed = { error: text };
          }
          resolve({ status: res.statusCode ?? 0, body: parsed });
        });
        res.on("error", reject);
      },
    );
    req.on("error", reject);
    req.end(bytes);
  });
}

/** GitHub's header: the body's HMAC-SHA256 alone. */
export const githubSignature = (secret: string, body: string | Buffer) => ({
  "x-hub-signature-256": `sha256=${createHmac("sha256", secret).update(body).digest("hex")}`,
});

/** The signed-timestamp header: `t=<unix seconds>,v1=<HMAC-SHA256 of "<t>." + body>`. */
export function stampedSignature(secret: string, unixSeconds: number, body: string | Buffer): Record<string, string> {
  const mac = createHmac("sha256", secret).update(`${unixSeconds}.`).update(body).digest("hex");
  return { "x-aiflow-signature": `t=${unixSeconds},v1=${mac}` };
}

export const sha256Hex = (body: string | Buffer) => createHash("sha256").update(body).digest("hex");

/** The value of one series of a counter on the daemon's registry (0 when it has none yet). */
export async function counterValue(d: Daemon, name: string, labels: Record<string, string>): Promise<number> {
  const m = (await d.metrics.registry.getMetricsAsJSON()).find((x) => x.name === name);
  const v = m?.values.find((x) => Object.entries(labels).every(([k, want]) => String(x.labels[k]) === want));
  return Number(v?.value ?? 0);
}
