/**
 * The daemon's own services, called from the page over the Connect protocol (JSON over HTTP/1.1)
 * at /api on the origin that served it: the same services, roles and validation aiflowctl meets.
 *
 * The token lives in this tab's sessionStorage and goes with each call as `Authorization: Bearer`,
 * never in a cookie, so another site cannot make the browser use it. Under mutual TLS the token may
 * be empty: the client certificate the browser presents then names the caller, as it would on the
 * gRPC port.
 */
import { Code, ConnectError, createClient, type Client, type Interceptor } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-web";
import { OpsService } from "@aiflow/wire/gen/aiflow/cluster/v1/ops_pb.js";
import { DagOpsService } from "@aiflow/wire/gen/aiflow/dag/v1/dag_pb.js";

const KEY = "aiflow.console.token";

export const token = {
  get: (): string | null => sessionStorage.getItem(KEY),
  set: (t: string) => sessionStorage.setItem(KEY, t),
  clear: () => sessionStorage.removeItem(KEY),
};

/** Called when the daemon refuses the token (it was changed or revoked): the page signs out. */
let onUnauthenticated: () => void = () => undefined;
export const whenSignedOut = (f: () => void) => (onUnauthenticated = f);

const bearer: Interceptor = (next) => async (req) => {
  const t = token.get();
  if (t) req.header.set("authorization", `Bearer ${t}`);
  try {
    return await next(req);
  } catch (err) {
    if (ConnectError.from(err).code === Code.Unauthenticated) onUnauthenticated();
    throw err;
  }
};

const transport = createConnectTransport({ baseUrl: `${location.origin}/api`, interceptors: [bearer] });

export const ops: Client<typeof OpsService> = createClient(OpsService, transport);
export const dagOps: Client<typeof DagOpsService> = createClient(DagOpsService, transport);

/** What to show a person for a failed call: the daemon's own sentence. */
export const messageOf = (err: unknown): string => {
  const e = ConnectError.from(err);
  return e.code === Code.Unknown && /fetch/i.test(e.rawMessage) ? "the daemon cannot be reached" : e.rawMessage;
};
