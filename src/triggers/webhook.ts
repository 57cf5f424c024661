/**
 * Webhooks: `POST /hooks/<tenant>/<trigger>` on the daemon's HTTP port.
 *
 * The signature is the only credential (./signature.ts): `X-Aiflow-Signature: t=…,v1=…` over the
 * signed time and the body, within ±5 minutes of it, or GitHub's `X-Hub-Signature-256` over the
 * body alone. A delivery acts at most once per replay key, claimed in the transaction of the run it
 * starts or moves: its delivery id (`X-GitHub-Delivery` or `X-Delivery-Id`) when it has one, and
 * what its signature covers (the signed time and the body's digest, or the body's digest alone), so
 * a copy with its unsigned headers removed or changed is a replay (409). The source's time is the
 * signed time, else the request's `Date` header, else the time the request arrived.
 *
 * What is recorded, and why so (the firing log keeps what arrived, for senders who proved who they
 * are; ./payload.ts says what of a body each row keeps):
 * - A delivery whose signature proved the secret is recorded with its whole body, whatever became
 *   of it: started or signalled (202), a body that is not a payload (400: not UTF-8, not JSON, or
 *   what StartRun's check refuses — one place, ../domain/json-text.ts), or the action's own
 *   refusal (./firer.ts).
 * - A delivery that proved nothing — an unknown trigger (404), a body over --webhook-max-bytes
 *   (413), a missing or wrong signature (401), a signed time outside the window (401), a replay
 *   (409) — is recorded with its body's size, digest and first KiB, only under a tenant that has a
 *   webhook trigger here, and at most REFUSALS_RECORDED_PER_MINUTE a minute per trigger (per tenant
 *   for unknown names: ./refusal-budget.ts). The others are answered the same, with `recorded:
 *   false`, and counted.
 * - An address past its limit of unsigned and unknown-trigger deliveries (`guesses`) has its
 *   failing deliveries answered 429, unrecorded (one without a signature header before its body is
 *   read), and its validly signed ones served: the limit throttles guesses, not the senders beside
 *   a guesser. The failure is counted before anything is written, so no insert that fails lets a
 *   request escape the count.
 * Every refusal is counted in aiflow_webhook_refusals_total{reason,recorded}; nothing a sender puts
 * in a body is a 500 (a 500 is a bug, with its cause in the log).
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import { type Clock, msToNs } from "../clock.js";
import { AppError } from "../domain/errors.js";
import { isTenantKey } from "../domain/names.js";
import type { Logger } from "../log.js";
import type { WebhookEvents } from "../observability/metrics.js";
import type { AuthFailures } from "../server/auth-failures.js";
import type { TriggerStore } from "../store/triggers.js";
import { TRIGGER_NAME } from "./definition.js";
import { FiringRefused, Replayed, type FireResult, type Refusal, type TriggerFirer } from "./firer.js";
import { parseBody, unverifiedPayload, verifiedPayload } from "./payload.js";
import { RefusalBudget } from "./refusal-budget.js";
import { verify } from "./signature.js";

export const HOOKS_PREFIX = "/hooks/";
const DELIVERY_ID = /^[\x21-\x7e]{1,200}$/;

export interface WebhookDeps {
  triggers: TriggerStore;
  /**
   * Unsigned deliveries and deliveries to unknown triggers per remote address (--auth-failure-limit
   * per --auth-failure-window): past the limit an address is answered 429 and not recorded until its
   * window ends.
   */
  guesses: AuthFailures;
  firer: TriggerFirer;
  clock: Clock;
  log: Logger;
  /** --webhook-max-bytes. */
  maxBytes: number;
  /** aiflow_webhook_refusals_total. */
  metrics: WebhookEvents;
  /** Refusals of deliveries that proved nothing recorded per trigger a minute (default REFUSALS_RECORDED_PER_MINUTE). */
  refusalsPerMinute?: number;
}

/** HTTP status of each refusal. */
const STATUS: Record<Refusal, number> = {
  unknown_trigger: 404,
  not_found: 404,
  unsigned: 401,
  stale: 401,
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
  const budget = new RefusalBudget(d.clock, d.log, d.refusalsPerMinute);
  return async (req, res, path) => {
    const where = parsePath(path);
    if (!where) return answer(res, 404, { error: "not found: webhooks are POST /hooks/<tenant>/<trigger>" });
    if (req.method !== "POST") {
      res.setHeader("allow", "POST");
      return answer(res, 405, { error: `method not allowed: webhooks are POST ${path}` });
    }
    const address = req.socket.remoteAddress ?? "unknown";
    // Past the limit only failures are refused (as on the gRPC port): a sender behind the same proxy
    // or NAT as a guesser still gets its signed deliveries through. One with no signature at all is
    // refused before its body is read; a signed one is read (bounded by --webhook-max-bytes and the
    // request timeout) and refused, unrecorded, unless its signature proves the trigger's secret.
    const throttled = d.guesses.throttled(address);
    const tooMany = () => {
      d.metrics.webhookRefused("throttled", false);
      res.setHeader("connection", "close");
      return answer(res, 429, {
        error: "too many unsigned or unknown-trigger webhooks from this address; wait for --auth-failure-window to pass (signed deliveries are still served)",
      });
    };
    if (throttled && !signed(req.headers)) return tooMany();
    const arrivedNs = sourceTime(req.headers.date, d.clock.nowMs());
    try {
      const body = await readBody(req, res, d.maxBytes);
      const row = await d.triggers.forWebhook(where.tenantKey, where.name);
      const trigger = row?.trigger_type === "webhook" ? row : null;
      // Checked once, here: a throttled address's failures stop before anything is recorded.
      const verdict = body === null || trigger === null ? null : verify(body, trigger.secret, req.headers, d.clock.nowMs());
      if (throttled && !verdict?.ok) return tooMany();

      /** A delivery that proved nothing: see the module's comment. */
      const unproven = async (r: FiringRefused): Promise<void> => {
        if ((r.refusal === "unsigned" || r.refusal === "unknown_trigger") && d.guesses.record(address))
          d.log.warn(
            { address, tenant: where.tenantKey, trigger: where.name },
            "too many unsigned or unknown-trigger webhooks from one address: refusing its webhooks unrecorded until its window ends",
          );
        const served = trigger !== null || (await d.triggers.servesWebhooks(where.tenantKey));
        if (!served || !budget.take({ tenantKey: where.tenantKey, trigger: trigger ? where.name : null })) {
          d.metrics.webhookRefused(r.refusal, false);
          return answer(res, STATUS[r.refusal], { outcome: "refused", recorded: false, error: r.message });
        }
        const recorded = await d.firer.refuse(where, trigger, unverifiedPayload(body), arrivedNs, r);
        d.metrics.webhookRefused(r.refusal, true);
        reply(res, recorded);
      };
      if (body === null) return unproven(new FiringRefused("too_large", `the body is over --webhook-max-bytes (${d.maxBytes} bytes); it was not kept`));
      // (verdict is null only for a missing body or trigger.)
      if (!trigger || !verdict) return unproven(new FiringRefused("unknown_trigger", `tenant '${where.tenantKey}' has no webhook trigger '${where.name}'`));
      if (!verdict.ok) return unproven(new FiringRefused(verdict.refusal, verdict.why));
      const firedOnNs = verdict.firedOnNs ?? arrivedNs;

      // Signed from here on: a refusal keeps the whole body.
      const proven = async (r: FiringRefused): Promise<void> => {
        const recorded = await d.firer.refuse(where, trigger, verifiedPayload(body), firedOnNs, r);
        d.metrics.webhookRefused(r.refusal, true);
        d.log.warn(
          { tenant: where.tenantKey, trigger: where.name, firing: recorded.firingId, why: r.message },
          "a signed webhook's body is not a payload; refused and recorded",
        );
        reply(res, recorded);
      };
      let parsed: ReturnType<typeof parseBody>;
      try {
        parsed = parseBody(body, d.maxBytes);
      } catch (err) {
        if (err instanceof FiringRefused) return proven(err);
        throw err;
      }
      const deliveryId = header(req.headers["x-github-delivery"]) ?? header(req.headers["x-delivery-id"]);
      if (deliveryId !== undefined && !DELIVERY_ID.test(deliveryId))
        return proven(new FiringRefused("bad_body", "the delivery id header is not 1-200 visible ASCII characters"));
      const replayKeys = [...(deliveryId === undefined ? [] : [deliveryId]), verdict.replayKey];
      // A replay is refused here without running the action; the claim in the run's transaction decides races.
      const seen = await d.triggers.claimed(where.tenantKey, where.name, replayKeys);
      if (seen) return unproven(new Replayed(seen.key, seen.firingId));
      let result: FireResult;
      try {
        result = await d.firer.fire({ trigger, payloadText: parsed.text, payload: parsed.payload, firedOnNs, replayKeys });
      } catch (err) {
        if (err instanceof Replayed) return unproven(err);
        throw err;
      }
      if (result.outcome === "refused") d.metrics.webhookRefused(result.refusal ?? "invalid_argument", true);
      return reply(res, result);
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

const header = (v: string | string[] | undefined): string | undefined => (Array.isArray(v) ? v[0] : v);

/** Whether a request carries a signature header of a supported sender (./signature.ts), valid or not. */
const signed = (headers: IncomingMessage["headers"]): boolean => headers["x-aiflow-signature"] !== undefined || headers["x-hub-signature-256"] !== undefined;

/** The request's Date header (the sender's clock) when it parses, else the time it arrived. */
function sourceTime(date: string | undefined, nowMs: number): bigint {
  const ms = date ? Date.parse(date) : NaN;
  return msToNs(Number.isFinite(ms) && ms > 0 ? ms : nowMs);
}
