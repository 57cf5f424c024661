/**
 * Webhooks: `POST /hooks/<tenant>/<trigger>` on the daemon's HTTP port.
 *
 * The signature is the only credential: the body's HMAC-SHA256 under the trigger's secret, sent as
 * `X-Hub-Signature-256: sha256=<hex>` (GitHub's header; any sender can compute it), compared in
 * constant time. A delivery id (`X-GitHub-Delivery` or `X-Delivery-Id`) makes a delivery act at
 * most once. The source's time is the request's `Date` header when it has one, else the time the
 * request arrived.
 *
 * Every request that names a tenant and a trigger is recorded as a firing, whatever becomes of it:
 * an unknown trigger (404), a body over --webhook-max-bytes (413, its payload not kept), a missing
 * or wrong signature (401), a body that is not JSON (400), a replayed delivery (409), and whatever
 * the action's own refusal was (./firer.ts). A success answers 202 with the firing's id and the run
 * it started or moved. Only a request that names no tenant and trigger at all is answered 404
 * without a record (there is nothing to record it under), and so is an address past its limit of
 * unsigned and unknown-trigger deliveries (429; see `guesses`).
 */
import { createHmac, timingSafeEqual } from "node:crypto";
import type { IncomingMessage, ServerResponse } from "node:http";
import { msToNs, type Clock } from "../clock.js";
import { AppError } from "../domain/errors.js";
import { isTenantKey } from "../domain/names.js";
import type { Logger } from "../log.js";
import type { AuthFailures } from "../server/auth-failures.js";
import type { TriggerStore } from "../store/triggers.js";
import { TRIGGER_NAME } from "./definition.js";
import { FiringRefused, type FireResult, type Refusal, type TriggerFirer } from "./firer.js";

export const HOOKS_PREFIX = "/hooks/";
const DELIVERY_ID = /^[\x21-\x7e]{1,200}$/;

export interface WebhookDeps {
  triggers: TriggerStore;
  /**
   * Unsigned deliveries and deliveries to unknown triggers per remote address (--auth-failure-limit
   * per --auth-failure-window): past the limit an address is answered 429 and not recorded until its
   * window ends, so nobody without a secret can grow the firing log without bound.
   */
  guesses: AuthFailures;
  firer: TriggerFirer;
  clock: Clock;
  log: Logger;
  /** --webhook-max-bytes. */
  maxBytes: number;
}

/** HTTP status of each refusal. */
const STATUS: Record<Refusal, number> = {
  unknown_trigger: 404,
  not_found: 404,
  unsigned: 401,
  unauthenticated: 401,
  too_large: 413,
  bad_body: 400,
  invalid_argument: 422,
  replayed: 409,
  failed_precondition: 409,
  already_exists: 409,
  resource_exhausted: 429,
  permission_denied: 403,
  unavailable: 503,
};

/** Serves one request whose path starts with /hooks/. */
export function webhookHandler(d: WebhookDeps): (req: IncomingMessage, res: ServerResponse, path: string) => Promise<void> {
  return async (req, res, path) => {
    const where = parsePath(path);
    if (!where) return answer(res, 404, { error: "not found: webhooks are POST /hooks/<tenant>/<trigger>" });
    if (req.method !== "POST") {
      res.setHeader("allow", "POST");
      return answer(res, 405, { error: `method not allowed: webhooks are POST ${path}` });
    }
    const address = req.socket.remoteAddress ?? "unknown";
    if (d.guesses.throttled(address)) {
      res.setHeader("connection", "close");
      return answer(res, 429, { error: "too many unsigned or unknown-trigger webhooks from this address; wait for --auth-failure-window to pass" });
    }
    const firedOnNs = sourceTime(req.headers.date, d.clock.nowMs());
    try {
      const body = await readBody(req, res, d.maxBytes);
      const trigger = await d.triggers.forWebhook(where.tenantKey, where.name);
      const refuse = async (r: FiringRefused, payloadText: string | null) => {
        const recorded = await d.firer.refuse(where, trigger, payloadText, firedOnNs, r);
        if ((r.refusal === "unsigned" || r.refusal === "unknown_trigger") && d.guesses.record(address))
          d.log.warn({ address, tenant: where.tenantKey, trigger: where.name }, "too many unsigned or unknown-trigger webhooks from one address: refusing its webhooks unrecorded until its window ends");
        reply(res, recorded);
      };
      if (body === null) return refuse(new FiringRefused("too_large", `the body is over --webhook-max-bytes (${d.maxBytes} bytes); it was not kept`), null);
      const text = body.toString("utf8");
      if (!trigger || trigger.trigger_type !== "webhook")
        return refuse(new FiringRefused("unknown_trigger", `tenant '${where.tenantKey}' has no webhook trigger '${where.name}'`), text);
      if (!signed(body, trigger.secret, req.headers["x-hub-signature-256"]))
        return refuse(new FiringRefused("unsigned", "the X-Hub-Signature-256 header is missing or is not the body's HMAC-SHA256 under the trigger's secret"), text);
      let payload: unknown = null;
      if (body.length > 0) {
        try {
          payload = JSON.parse(text);
        } catch {
          return refuse(new FiringRefused("bad_body", "the body is not JSON"), text);
        }
      }
      const rawDelivery = header(req.headers["x-github-delivery"]) ?? header(req.headers["x-delivery-id"]);
      if (rawDelivery !== undefined && !DELIVERY_ID.test(rawDelivery)) return refuse(new FiringRefused("bad_body", "the delivery id header is not 1-200 visible ASCII characters"), text);
      return reply(res, await d.firer.fire({ trigger, payloadText: text, payload, firedOnNs, deliveryId: rawDelivery ?? null }));
    } catch (err) {
      if (err instanceof AppError && err.kind === "unavailable") {
        d.log.warn({ tenant: where.tenantKey, trigger: where.name }, "a webhook came while the database is unavailable; answered 503 and nothing was recorded");
        res.setHeader("retry-after", "5");
        return answer(res, 503, { error: "the database is unavailable; nothing was recorded: deliver again later" });
      }
      throw err;
    }
  };
}

function reply(res: ServerResponse, r: FireResult): void {
  const status = r.outcome === "refused" ? STATUS[r.refusal ?? "invalid_argument"] : r.outcome === "failed" ? 500 : 202;
  answer(res, status, { outcome: r.outcome, firing_id: r.firingId, ...(r.runId ? { run_id: r.runId } : {}), ...(r.error ? { error: r.error } : {}) });
}

function answer(res: ServerResponse, status: number, body: object): void {
  res.writeHead(status, { "content-type": "application/json", "cache-control": "no-store" });
  res.end(`${JSON.stringify(body)}\n`);
}

function parsePath(path: string): { tenantKey: string; name: string } | null {
  const parts = path.slice(HOOKS_PREFIX.length).split("/");
  if (parts.length !== 2) return null;
  let tenantKey: string, name: string;
  try {
    [tenantKey, name] = parts.map(decodeURIComponent) as [string, string];
  } catch {
    return null;
  }
  return isTenantKey(tenantKey) && TRIGGER_NAME.test(name) ? { tenantKey, name } : null;
}

/**
 * The body, or null when it is over `max` bytes. A declared length over it is refused before a byte
 * is read, and the connection closes after the answer rather than read the rest; a chunked body that
 * grows past it is read to its end (the server's request timeout bounds that) and not kept.
 */
async function readBody(req: IncomingMessage, res: ServerResponse, max: number): Promise<Buffer | null> {
  if (Number(req.headers["content-length"] ?? "0") > max) {
    res.setHeader("connection", "close");
    return null;
  }
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req as AsyncIterable<Buffer>) {
    size += chunk.length;
    if (size <= max) chunks.push(chunk);
  }
  return size > max ? null : Buffer.concat(chunks);
}

function signed(body: Buffer, secret: string | null, given: string | string[] | undefined): boolean {
  const sig = header(given);
  if (!secret || !sig || !/^sha256=[0-9a-fA-F]{64}$/.test(sig)) return false;
  const expected = createHmac("sha256", secret).update(body).digest();
  return timingSafeEqual(expected, Buffer.from(sig.slice(7), "hex"));
}

const header = (v: string | string[] | undefined): string | undefined => (Array.isArray(v) ? v[0] : v);

/** The request's Date header (the sender's clock) when it parses, else the time it arrived. */
function sourceTime(date: string | undefined, nowMs: number): bigint {
  const ms = date ? Date.parse(date) : NaN;
  return msToNs(Number.isFinite(ms) && ms > 0 ? ms : nowMs);
}
