/**
 * The CLI's --json is the reply's protobuf JSON, where some times are google.protobuf.Timestamp
 * (ISO 8601: `createdOn`) and others epoch nanoseconds as strings (`dispatchedAtNs`, a run's
 * `endedOn`). A reader should not need to know which: beside each epoch-nanosecond time this adds the
 * same instant in ISO 8601 UTC (`dispatchedAtNs` → `dispatchedAt`, `endedOn` → `endedAt`, `firedOn`
 * → `firedAt`), null where the time is unset (0). The nanosecond keys stay, exact and unchanged, so
 * what a script read before still reads the same.
 */

/** The ISO key beside an epoch-nanosecond key, or undefined when the key holds no epoch time. */
export function isoKeyOf(key: string): string | undefined {
  if (/AtNs$/.test(key)) return key.slice(0, -2);
  if (key === "endedOn") return "endedAt";
  if (key === "firedOn") return "firedAt";
  return undefined;
}

/** `json` with an ISO 8601 companion beside every epoch-nanosecond time, at any depth. */
export function withIsoTimes(json: unknown): unknown {
  if (Array.isArray(json)) return json.map(withIsoTimes);
  if (json === null || typeof json !== "object") return json;
  const out: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(json)) {
    out[key] = withIsoTimes(value);
    const iso = isoKeyOf(key);
    if (iso !== undefined && !(iso in json) && typeof value === "string" && /^\d+$/.test(value)) out[iso] = isoOfNs(value);
  }
  return out;
}

function isoOfNs(ns: string): string | null {
  const ms = Number(BigInt(ns) / 1_000_000n);
  // 0 is "not set"; past what a Date holds there is no ISO form to give.
  if (ms === 0 || !Number.isFinite(new Date(ms).getTime())) return null;
  return new Date(ms).toISOString();
}
