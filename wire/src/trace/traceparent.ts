/**
 * W3C Trace Context's `traceparent` text (https://www.w3.org/TR/trace-context/#traceparent-header),
 * read and written in one place for the daemon, which stores it with each work item, and the agent
 * SDK, which parents its handler spans on it. Plain text in and out, no OpenTelemetry types: the
 * wire package depends on neither side's tracing.
 *
 * What must stay true: parse() accepts exactly what the recommendation says a receiver accepts
 * (lowercase hex; ids not all zeros; version `ff` refused; a version above 00 read as 00 when its
 * first four fields are well formed), and format() writes only version 00, so whatever the daemon
 * stores and hands to agents is text every W3C receiver reads.
 */

export interface TraceParent {
  /** 32 lowercase hex digits, not all zeros. */
  traceId: string;
  /** 16 lowercase hex digits, not all zeros. */
  spanId: string;
  /** The trace flags byte (bit 0: sampled). */
  traceFlags: number;
}

const V00 = /^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/;
/** A later version: its first four fields as version 00's, then nothing or `-` and more. */
const LATER = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(?:-.*)?$/;
const ZERO_TRACE = "0".repeat(32);
const ZERO_SPAN = "0".repeat(16);

/** The trace context a traceparent names; undefined for anything the recommendation says to ignore. */
export function parseTraceparent(text: string | null | undefined): TraceParent | undefined {
  if (!text) return undefined;
  const value = text.trim();
  let traceId: string, spanId: string, flags: string;
  const v00 = V00.exec(value);
  if (v00) [, traceId, spanId, flags] = v00 as unknown as [string, string, string, string];
  else {
    const later = LATER.exec(value);
    if (!later || later[1] === "00" || later[1] === "ff") return undefined;
    [, , traceId, spanId, flags] = later as unknown as [string, string, string, string, string];
  }
  if (traceId === ZERO_TRACE || spanId === ZERO_SPAN) return undefined;
  return { traceId, spanId, traceFlags: parseInt(flags, 16) };
}

/** Version 00 text of a trace context. */
export function formatTraceparent(tp: TraceParent): string {
  return `00-${tp.traceId}-${tp.spanId}-${(tp.traceFlags & 0xff).toString(16).padStart(2, "0")}`;
}

/** The traceparent as the daemon stores it: version 00 text, or null when there is none or it is not valid. */
export function normalizeTraceparent(text: string | null | undefined): string | null {
  const tp = parseTraceparent(text);
  return tp ? formatTraceparent(tp) : null;
}
