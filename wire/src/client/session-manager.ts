/**
 * connect-node's HTTP/2 session manager, with every session it hands out kept from crashing the
 * process. Its keep-alive can destroy a session with an error after it has stopped listening for
 * errors on it (a ping timer outliving the state that armed it, as a half-open path triggers); an
 * 'error' event with no listener is an uncaught exception, which would end a worker process over a
 * network fault. Each session gets one listener that ignores the event: the manager and the calls
 * on the session learn of its end from their own 'close' and stream events.
 */
import type { ClientHttp2Session } from "node:http2";
import { Http2SessionManager } from "@connectrpc/connect-node";

const guarded = new WeakSet<ClientHttp2Session>();
const ignore = () => {};

function guard(session: ClientHttp2Session | undefined): void {
  if (!session || guarded.has(session)) return;
  guarded.add(session);
  session.on("error", ignore);
}

export class GuardedSessionManager extends Http2SessionManager {
  override async request(...args: Parameters<Http2SessionManager["request"]>): ReturnType<Http2SessionManager["request"]> {
    const stream = await super.request(...args);
    guard(stream.session as ClientHttp2Session | undefined);
    return stream;
  }
}
