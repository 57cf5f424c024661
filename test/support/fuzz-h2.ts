/**
 * One request over node:http2, as a fuzz case sends it, and what came back: the HTTP status, the
 * gRPC status wherever it was (trailers, headers, or a gRPC-Web trailer frame in the body), a reset,
 * or nothing within the case's wait (a hang, after which the stream is cancelled).
 */
import http2 from "node:http2";
import { performance } from "node:perf_hooks";

export interface Request {
  headers: http2.OutgoingHttpHeaders;
  chunks: Buffer[];
  /** How long it may take before it counts as a hang. */
  waitMs: number;
}

/** What came back. */
export interface Answer {
  kind: "response" | "reset" | "closed" | "hang" | "unsendable";
  ms: number;
  httpStatus?: number;
  contentType?: string;
  /** grpc-status as sent (in the trailers, the headers, or a gRPC-Web trailer frame). */
  grpcStatus?: string;
  grpcMessage?: string;
  rstCode?: number;
  /** The client's error (a reset, a refused header). */
  error?: string;
  /** The first bytes of the body. */
  body: Buffer;
}

/** One HTTP/2 connection to the daemon, opened again whenever a case ends it. */
export class H2Client {
  #session: http2.ClientHttp2Session | undefined;

  constructor(readonly address: string) {}

  session(): http2.ClientHttp2Session {
    if (!this.#session || this.#session.closed || this.#session.destroyed) {
      // Node counts a request's unsent bytes against its session's memory (10 MB by default) when
      // the server answers before reading them all; past that the session refuses every new stream
      // (ENHANCE_YOUR_CALM). Cases of large bodies refused early add up to that, in a long run.
      const s = http2.connect(`http://${this.address}`, { maxSessionMemory: 1024 });
      s.on("error", () => {});
      this.#session = s;
    }
    return this.#session;
  }

  close(): void {
    this.#session?.destroy();
  }
}

const BODY_KEPT = 64 * 1024;

/** Sends one request (its DATA as `chunks`, one write each) and waits at most `waitMs` for its end. */
export function send(client: H2Client, req: Request): Promise<Answer> {
  const t0 = performance.now();
  return new Promise((resolve) => {
    let stream: http2.ClientHttp2Stream;
    try {
      // Not ended at once, whatever the method (Node ends GET and DELETE requests by default):
      // the body is part of the case.
      stream = client.session().request(req.headers, { endStream: false });
    } catch (err) {
      resolve({ kind: "unsendable", ms: 0, error: (err as { code?: string }).code ?? String(err), body: Buffer.alloc(0) });
      return;
    }
    let head: http2.IncomingHttpHeaders | undefined;
    let trailers: http2.IncomingHttpHeaders | undefined;
    let error: string | undefined;
    const body: Buffer[] = [];
    let kept = 0;
    let hung = false;
    const timer = setTimeout(() => {
      hung = true;
      stream.close(http2.constants.NGHTTP2_CANCEL);
    }, req.waitMs);
    stream.on("response", (h) => (head = h));
    stream.on("trailers", (t) => (trailers = t));
    stream.on("data", (d: Buffer) => {
      if (kept < BODY_KEPT) body.push(d);
      kept += d.length;
    });
    stream.on("error", (e: Error & { code?: string }) => (error = e.code ?? e.message));
    stream.on("close", () => {
      clearTimeout(timer);
      const ms = performance.now() - t0;
      const all = Buffer.concat(body);
      const rstCode = stream.rstCode;
      if (hung) return resolve({ kind: "hang", ms, body: all, error, rstCode });
      if (!head) return resolve({ kind: rstCode !== undefined && rstCode !== 0 ? "reset" : "closed", ms, rstCode, error, body: all });
      const status = trailers?.["grpc-status"] ?? head["grpc-status"] ?? webTrailer(all, "grpc-status");
      const message = trailers?.["grpc-message"] ?? head["grpc-message"] ?? webTrailer(all, "grpc-message");
      resolve({
        kind: "response",
        ms,
        httpStatus: Number(head[":status"]),
        contentType: head["content-type"],
        grpcStatus: status === undefined ? undefined : String(status),
        grpcMessage: message === undefined ? undefined : decodeMessage(String(message)),
        rstCode,
        error,
        body: all,
      });
    });
    for (const chunk of req.chunks) stream.write(chunk);
    stream.end();
  });
}

/** A field of a gRPC-Web trailer frame (flag 0x80) in the body, if there is one. */
function webTrailer(body: Buffer, name: string): string | undefined {
  for (let at = 0; at + 5 <= body.length; ) {
    const len = body.readUInt32BE(at + 1);
    if ((body[at]! & 0x80) !== 0) {
      const m = new RegExp(`^${name}:\\s*(.*?)\\r?$`, "im").exec(body.subarray(at + 5, at + 5 + len).toString("latin1"));
      return m?.[1];
    }
    at += 5 + len;
  }
  return undefined;
}

function decodeMessage(s: string): string {
  try {
    return decodeURIComponent(s);
  } catch {
    return s;
  }
}

/**
 * The call succeeded: grpc-status 0, or a Connect unary reply (no envelope: a mutation that drops
 * the gRPC envelope of a Connect unary request makes it well-formed) with HTTP 200.
 */
export function succeeded(a: Answer): boolean {
  if (a.grpcStatus !== undefined) return a.grpcStatus === "0";
  return a.kind === "response" && a.httpStatus === 200 && /^application\/(proto|json)/.test(a.contentType ?? "");
}

/** A short name of the answer's kind, for the counts. */
export function answerClass(a: Answer): string {
  if (a.kind !== "response") return a.kind === "reset" ? `reset ${a.rstCode}` : a.kind;
  return a.grpcStatus !== undefined ? `grpc ${a.grpcStatus}` : `http ${a.httpStatus}`;
}
