/**
 * A webhook's signature, in the two forms a trigger's secret is checked in, and the keys that make a
 * signed delivery act once.
 *
 * - `X-Aiflow-Signature: t=<unix seconds>,v1=<hex>` (Stripe's layout): v1 is the HMAC-SHA256, under
 *   the trigger's secret, of `<t>.` followed by the body; several v1 may be given (a sender rotating
 *   its secret), one must match. The signed time must be within ±SIGNED_TIME_WINDOW_MS of the
 *   daemon's clock, and the delivery's replay key is that time with the body's digest: a captured
 *   delivery is refused as a replay inside the window and as stale outside it, for ever, while the
 *   same body signed at a new time is a new delivery. When the header is there it alone decides: a
 *   GitHub signature beside a bad one does not rescue it.
 * - `X-Hub-Signature-256: sha256=<hex>` (GitHub's, and the only form GitHub sends): the body's
 *   HMAC-SHA256 alone. Nothing in it says when, so its replay key is the body's digest: a body acts
 *   once per trigger for as long as the key is kept (the firing retention), whatever delivery id or
 *   Date the copy carries. A sender whose bodies may repeat must use the form above.
 *
 * MACs are compared in constant time. What must stay true: nothing outside what the MAC covers
 * (the delivery id, Date, any other header) can make a signed body a new delivery.
 */
import { createHash, createHmac, timingSafeEqual } from "node:crypto";
import { msToNs } from "../clock.js";

/** How far a signed time may be from the daemon's clock, either way. */
export const SIGNED_TIME_WINDOW_MS = 5 * 60_000;

export type Verdict =
  /** Signed under the trigger's secret: `replayKey` is what makes it act once; `firedOnNs` the signed time, when signed. */
  | { ok: true; form: "stamped" | "github"; replayKey: string; firedOnNs: bigint | null }
  /** No signature, a malformed one, or a MAC that does not match (the header named in `why`). */
  | { ok: false; refusal: "unsigned"; why: string }
  /** A valid signed-timestamp signature whose time is outside the window: a replay, or a sender's clock far off. */
  | { ok: false; refusal: "stale"; why: string };

type Headers = Record<string, string | string[] | undefined>;

const HEX_MAC = /^[0-9a-fA-F]{64}$/;
const GITHUB = /^sha256=[0-9a-fA-F]{64}$/;
const GITHUB_WHY = "no X-Aiflow-Signature, and the X-Hub-Signature-256 header is missing or is not the body's HMAC-SHA256 under the trigger's secret";

/** Checks `body` against the trigger's secret as the request's headers sign it. */
export function verify(body: Buffer, secret: string | null, headers: Headers, nowMs: number): Verdict {
  const stamped = one(headers["x-aiflow-signature"]);
  if (stamped !== undefined) {
    const parsed = parseStamped(stamped);
    if (!secret || !parsed) return { ok: false, refusal: "unsigned", why: "the X-Aiflow-Signature header is not t=<unix seconds>,v1=<hex HMAC-SHA256>" };
    // The MAC covers the time as sent, so the key and the check use that text, not a number made of it.
    const { t, macs } = parsed;
    const expected = createHmac("sha256", secret).update(`${t}.`).update(body).digest();
    if (!macs.some((mac) => timingSafeEqual(expected, mac)))
      return {
        ok: false,
        refusal: "unsigned",
        why: "the X-Aiflow-Signature header's v1 is not the HMAC-SHA256 of '<t>.' and the body under the trigger's secret",
      };
    const skewMs = nowMs - Number(t) * 1000;
    if (Math.abs(skewMs) > SIGNED_TIME_WINDOW_MS) {
      const s = Math.round(Math.abs(skewMs) / 1000);
      return {
        ok: false,
        refusal: "stale",
        why: `the X-Aiflow-Signature time t=${t} is ${s} s ${skewMs >= 0 ? "old" : "ahead"}, outside the ±${SIGNED_TIME_WINDOW_MS / 1000} s window: a replay, or a sender's clock that is off`,
      };
    }
    return { ok: true, form: "stamped", replayKey: `t=${t} sha256 ${digestHex(body)}`, firedOnNs: msToNs(Number(t) * 1000) };
  }
  const github = one(headers["x-hub-signature-256"]);
  if (!secret || github === undefined || !GITHUB.test(github)) return { ok: false, refusal: "unsigned", why: GITHUB_WHY };
  if (!timingSafeEqual(createHmac("sha256", secret).update(body).digest(), Buffer.from(github.slice(7), "hex")))
    return { ok: false, refusal: "unsigned", why: GITHUB_WHY };
  return { ok: true, form: "github", replayKey: `sha256 ${digestHex(body)}`, firedOnNs: null };
}

/** `t=<1-12 digits>` once and 1-8 `v1=<64 hex>`, comma-separated; other schemes' entries (Stripe's v0) are ignored. */
function parseStamped(header: string): { t: string; macs: Buffer[] } | null {
  const parts = header.split(",");
  if (parts.length > 16) return null;
  let t: string | undefined;
  const macs: Buffer[] = [];
  for (const part of parts) {
    const eq = part.indexOf("=");
    const k = part.slice(0, eq).trim();
    const v = part.slice(eq + 1).trim();
    if (eq < 0) return null;
    if (k === "t") {
      if (t !== undefined || !/^\d{1,12}$/.test(v)) return null;
      t = v;
    } else if (k === "v1") {
      if (!HEX_MAC.test(v) || macs.length >= 8) return null;
      macs.push(Buffer.from(v, "hex"));
    }
  }
  return t === undefined || macs.length === 0 ? null : { t, macs };
}

/** Why a delivery was refused as a replay of `key` (a delivery id or a replay key made above), acted on in `firingId`. */
export function replayMessage(key: string, firingId: string | null): string {
  const where = firingId ? ` (firing ${firingId})` : "";
  if (key.startsWith("sha256 "))
    return `this body (sha256 ${key.slice(7, 23)}…) was already acted on${where}; under X-Hub-Signature-256 a body starts or moves a run once per trigger, whatever its delivery id: sign with X-Aiflow-Signature to send the same body again`;
  if (key.startsWith("t="))
    return `this signed delivery (${key.slice(0, key.indexOf(" "))}) was already acted on${where}; sign the body at a new time to deliver it again`;
  return `delivery '${key}' was already acted on${where}; a delivery id starts or moves a run once`;
}

export const digestHex = (body: Buffer) => createHash("sha256").update(body).digest("hex");

const one = (v: string | string[] | undefined): string | undefined => (Array.isArray(v) ? v[0] : v);
