/**
 * A span per dispatched item, in the trace the item was enqueued in: `dispatch <engine kind>`, a
 * child of the item's stored traceparent, at the moment of the dispatch, naming the agent it went
 * to, the daemon instance that granted the lease, the attempt, and how long the item waited while
 * due (from its creation, not-before or retry backoff end). It links to the Claim call's server
 * span, which is in the agent's trace, not the item's: one claim answers items of many traces.
 *
 * Only items that carry a traceparent get one, and only while a tracer provider is registered when
 * the service is built (dispatchTracer() is undefined otherwise): the claim is the hot path, and an
 * untraced daemon does nothing per item here.
 */
import { ROOT_CONTEXT, SpanKind, trace, type HrTime, type Span } from "@opentelemetry/api";
import { parseTraceparent } from "@aiflow/wire/traceparent";
import type { Handed } from "../queue/waiting-claims.js";
import { TRACER_NAME, tracingActive } from "./tracing.js";
import { VERSION } from "../util/package-version.js";

export type DispatchTracer = (claimSpan: Span | undefined, parts: readonly Handed[]) => void;

const hrTime = (ns: bigint): HrTime => [Number(ns / 1_000_000_000n), Number(ns % 1_000_000_000n)];

export function dispatchTracer(): DispatchTracer | undefined {
  if (!tracingActive()) return undefined;
  const tracer = trace.getTracer(TRACER_NAME, VERSION);
  return (claimSpan, parts) => {
    const links = claimSpan ? [{ context: claimSpan.spanContext() }] : [];
    for (const { rows, dispatch } of parts) {
      const at = hrTime(dispatch.dispatchedAtNs);
      for (const r of rows) {
        const stored = parseTraceparent(r.trace_context);
        if (!stored) continue;
        // Due at next_attempt_at, never before it was created (as the queue's stats count it).
        const createdNs = BigInt(Math.round(r.createdon_ms)) * 1_000_000n;
        const readyNs = r.next_attempt_at !== null && r.next_attempt_at > createdNs ? r.next_attempt_at : createdNs;
        const waitMs = readyNs < dispatch.dispatchedAtNs ? Number(dispatch.dispatchedAtNs - readyNs) / 1e6 : 0;
        tracer
          .startSpan(
            `dispatch ${r.engine_kind}`,
            {
              kind: SpanKind.INTERNAL,
              startTime: at,
              links,
              attributes: {
                "aiflow.tenant": r.tenant_key,
                "aiflow.work_item.id": r.id,
                "aiflow.work_item.attempt": (r.retry_count ?? 0) + 1,
                "aiflow.work_item.redelivery_count": r.redelivery_count,
                "aiflow.agent.name": dispatch.agent,
                "aiflow.daemon.instance": dispatch.instance,
                "aiflow.queue.wait_ms": waitMs,
              },
            },
            trace.setSpanContext(ROOT_CONTEXT, { ...stored, isRemote: true }),
          )
          .end(at);
      }
    }
  };
}
