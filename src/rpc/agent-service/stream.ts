/**
 * AgentService.Connect: one long-lived stream per agent (see the proto for the contract). The agent
 * grants credits; the daemon pushes items under leases within them — from its claim statement, or
 * from an Enqueue insert on this daemon that hands its rows to the stream's open slot
 * (../../queue/waiting-claims.ts) — and answers every report on the same stream.
 *
 * What must stay true:
 * - Never more items pushed than credits granted: a push uses credits; the slot an insert may fill
 *   is sized to the credits left, and what a claim and a hand-off bring together past them goes back.
 * - One statement at a time per stream, in arrival order: a session applies its messages serially,
 *   so its reports and claims never race each other, and it holds at most one pool connection.
 * - Bounded memory: the session stops reading requests while its outgoing queue or its inbox is
 *   long (HTTP/2 flow control then holds the agent's writes back), and items are bounded by credits.
 * - A parked stream costs nothing per unit of time: no timer, no statement, no signal listener per
 *   wait; it is woken by a ring for its keys, an insert's offer, its own next message, a directive,
 *   or the daemon's fallback re-check (which rings keys with due work).
 * - The database away does not end a session: a statement that fails for it is tried again, in
 *   order, after a backoff, while the session keeps its stream, its credits and what it holds
 *   (pushes simply pause). Ending it would cost the agent a reconnect and a fresh stream at the
 *   worst moment, and every agent would come back at once when the database does.
 * - The end decides the fate of the unreported items it pushed: the agent's goodbye releases them
 *   at once, spending nothing; a broken stream (reset, cancelled, half-closed without a goodbye)
 *   requeues them at once, one redelivery spent; a daemon shutting down, or ending the stream with
 *   an error of its own (a bug, a message it refused), leaves them leased, to be reported through
 *   any daemon.
 *
 * Here the call opens its session; the session is ./stream-session.ts, its flow (responses,
 * reading, waits, the database away) ./stream-flow.ts, and what it holds (credits, items pushed,
 * completions queued) ./stream-ledger.ts.
 */
import type { HandlerContext } from "@connectrpc/connect";
import type { ConnectRequest } from "@aiflow/wire/gen/aiflow/cluster/v1/agent_pb.js";
import { OutageLog } from "../../db/outage-log.js";
import { callerOf } from "../caller.js";
import type { Handed } from "../../queue/waiting-claims.js";
import { dispatchTracer } from "../../observability/dispatch-spans.js";
import { callSpanKey } from "../../observability/rpc-spans.js";
import { agentName } from "../input/validate.js";
import { assertScopeWithin } from "./registration.js";
import type { Response } from "./stream-flow.js";
import { Session, type AgentStreamDeps } from "./stream-session.js";

export type { AgentStreamDeps } from "./stream-session.js";

export function agentStreamImpl(d: AgentStreamDeps) {
  const traceDispatches = dispatchTracer();
  const outage = new OutageLog(d.queue.log, "database unavailable: agent streams keep their sessions and try again");
  return {
    async *connect(requests: AsyncIterable<ConnectRequest>, ctx: HandlerContext): AsyncGenerator<Response> {
      const caller = callerOf(ctx);
      const reader = requests[Symbol.asyncIterator]();
      const first = await reader.next();
      if (first.done) return;
      const name = agentName(first.value.name, ctx);
      assertScopeWithin(caller, name, await d.reports.scopeOf(name));
      const state = await d.known(name);
      // Dispatch spans link to this call's span, as a Claim's do to the Claim's.
      const trace = traceDispatches && ((parts: Handed[]) => traceDispatches(ctx.values.get(callSpanKey), parts));
      yield* new Session(d, name, caller, state, trace, outage).run(first.value, reader, ctx.signal);
    },
  };
}
