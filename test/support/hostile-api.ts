/**
 * HTTP/1.1 callers of the daemon's /api (the Connect API on the HTTP port), for the hostile tests:
 * a request that sends its headers and only part of the body it declares, a whole request, and a
 * Connect server stream read to its end-stream message. Each can come from an address of its own
 * on loopback (127.0.0.2, 127.0.0.3, …), so that one test's failures are not another's.
 */
import http from "node:http";

export interface H1Answer {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: string;
}

export interface Target {
  /** The daemon's HTTP port. */
  port: number;
  localAddress?: string;
}

/**
 * Sends the headers (declaring `declared` bytes of body) and `prefix`, and never the rest. Resolves
 * with the answer and with whether the server then closed the connection, once it has: an answer
 * proves the server did not wait for the body, and the close that it will not read it.
 */
export function partialPost(
  t: Target,
  path: string,
  headers: Record<string, string>,
  declared: number,
  prefix: Buffer,
): Promise<H1Answer & { closedByServer: boolean }> {
  return new Promise((resolve, reject) => {
    const req = http.request({
      host: "127.0.0.1",
      port: t.port,
      localAddress: t.localAddress,
      path,
      method: "POST",
      agent: false,
      headers: { ...headers, "content-length": String(declared) },
    });
    req.on("error", () => {});
    req.on("response", (res) => {
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("error", reject);
      res.on("end", () => {
        const answer = { status: res.statusCode!, headers: res.headers, body: Buffer.concat(chunks).toString() };
        // The socket ends from the server's side: this client never finishes its request.
        const socket = req.socket!;
        if (socket.destroyed || socket.readableEnded) resolve({ ...answer, closedByServer: true });
        else socket.once("close", () => resolve({ ...answer, closedByServer: true }));
      });
    });
    req.flushHeaders();
    req.write(prefix);
  });
}

/** A whole request; resolves with the answer (or the socket error's code as status -1 when none came). */
export function post(t: Target, path: string, headers: Record<string, string>, body: Buffer | string): Promise<H1Answer & { error?: string }> {
  return new Promise((resolve) => {
    const buf = typeof body === "string" ? Buffer.from(body) : body;
    const req = http.request({
      host: "127.0.0.1",
      port: t.port,
      localAddress: t.localAddress,
      path,
      method: "POST",
      agent: false,
      headers: { ...headers, "content-length": String(buf.length) },
    });
    let answered = false;
    req.on("error", (err: NodeJS.ErrnoException) => {
      if (!answered) resolve({ status: -1, headers: {}, body: "", error: err.code ?? err.message });
    });
    req.on("response", (res) => {
      answered = true;
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("error", () => {});
      res.on("end", () => resolve({ status: res.statusCode!, headers: res.headers, body: Buffer.concat(chunks).toString() }));
    });
    req.end(buf);
  });
}

/** One Connect envelope: flags, then the length, then the JSON message. */
export function envelope(message: unknown, flags = 0): Buffer {
  const json = Buffer.from(JSON.stringify(message));
  const b = Buffer.alloc(5 + json.length);
  b[0] = flags;
  b.writeUInt32BE(json.length, 1);
  json.copy(b, 5);
  return b;
}

export interface ConnectStream {
  status: number;
  /** The messages, as they came. */
  messages: unknown[];
  /** The end-stream message ({} when the call ended well, { error } when not); undefined if the stream was cut. */
  end: { error?: { code: string; message: string } } | undefined;
}

/**
 * Opens a Connect server-streaming call over HTTP/1.1 (application/connect+json). `onMessage` sees
 * each message as it arrives (to act while the stream is open); the promise settles when it ends.
 */
export function connectStream(
  t: Target,
  path: string,
  headers: Record<string, string>,
  request: unknown,
  onMessage?: (m: unknown) => void,
): { done: Promise<ConnectStream>; cancel(): void } {
  const req = http.request({
    host: "127.0.0.1",
    port: t.port,
    localAddress: t.localAddress,
    path,
    method: "POST",
    agent: false,
    headers: { "content-type": "application/connect+json", ...headers },
  });
  const done = new Promise<ConnectStream>((resolve) => {
    const out: ConnectStream = { status: 0, messages: [], end: undefined };
    req.on("error", () => resolve(out));
    req.on("response", (res) => {
      out.status = res.statusCode!;
      let buf = Buffer.alloc(0);
      res.on("data", (c: Buffer) => {
        buf = Buffer.concat([buf, c]);
        while (buf.length >= 5 && buf.length >= 5 + buf.readUInt32BE(1)) {
          const len = buf.readUInt32BE(1);
          const m = JSON.parse(buf.subarray(5, 5 + len).toString()) as unknown;
          if (buf[0]! & 2) out.end = m as ConnectStream["end"];
          else {
            out.messages.push(m);
            onMessage?.(m);
          }
          buf = buf.subarray(5 + len);
        }
      });
      res.on("error", () => {});
      res.on("close", () => resolve(out));
    });
    req.end(envelope(request));
  });
  return { done, cancel: () => req.destroy() };
}
