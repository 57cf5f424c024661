#!/usr/bin/env node
// gRPC health probe for aiflowd with no dependencies: one grpc.health.v1.Health/Check call over h2c
// or TLS, using only node:http2, so the production image needs neither grpc_health_probe nor
// @grpc/grpc-js.
//
//   node scripts/healthcheck.mjs [HOST:PORT] [SERVICE]
//
// HOST:PORT defaults to $AIFLOW_LISTEN (a wildcard host such as 0.0.0.0 or :: is probed on loopback),
// else 127.0.0.1:7400. SERVICE defaults to "" (the server as a whole). The call gives up after
// $AIFLOW_HEALTHCHECK_TIMEOUT (milliseconds, default 3000).
// TLS: $AIFLOW_HEALTHCHECK_CA (a PEM file) makes the probe speak TLS and trust that CA; under mutual
// TLS give it a client certificate too, $AIFLOW_HEALTHCHECK_CERT and $AIFLOW_HEALTHCHECK_KEY.
// Exit 0: the answer was SERVING. Exit 1: anything else; one line on stderr says why.
import { readFileSync } from "node:fs";
import http2 from "node:http2";

const STATUS = ["UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN"];
const timeoutMs = Number(process.env.AIFLOW_HEALTHCHECK_TIMEOUT) || 3000;
const target = process.argv[2] || process.env.AIFLOW_LISTEN || "127.0.0.1:7400";
const service = process.argv[3] ?? "";
const tls = Boolean(process.env.AIFLOW_HEALTHCHECK_CA);

function fail(reason) {
  process.stderr.write(`unhealthy: ${reason}\n`);
  process.exit(1);
}

/** HOST:PORT or [V6]:PORT -> an http:// authority, with wildcard listen hosts swapped for loopback. */
function authority(addr) {
  const m = /^(?:\[([^\]]+)\]|([^:]+)):(\d{1,5})$/.exec(addr.trim());
  if (!m) fail(`'${addr}' is not HOST:PORT`);
  let host = m[1] ?? m[2];
  if (host === "0.0.0.0") host = "127.0.0.1";
  if (host === "::" || host === "0:0:0:0:0:0:0:0") host = "::1";
  return `${tls ? "https" : "http"}://${host.includes(":") ? `[${host}]` : host}:${m[3]}`;
}

/** HealthCheckRequest { string service = 1; } in a gRPC length-prefixed frame (uncompressed). */
function requestFrame(name) {
  const s = Buffer.from(name, "utf8");
  if (s.length > 127) fail("service name longer than 127 bytes");
  const msg = s.length ? Buffer.concat([Buffer.from([0x0a, s.length]), s]) : Buffer.alloc(0);
  const head = Buffer.alloc(5);
  head.writeUInt32BE(msg.length, 1);
  return Buffer.concat([head, msg]);
}

function readVarint(buf, pos) {
  let value = 0;
  for (let shift = 0; shift < 35; shift += 7) {
    if (pos >= buf.length) throw new Error("truncated varint");
    const b = buf[pos++];
    value += (b & 0x7f) * 2 ** shift;
    if (!(b & 0x80)) return [value, pos];
  }
  throw new Error("varint too long");
}

/** HealthCheckResponse { ServingStatus status = 1; } -> the status number (0 when absent, as proto3 says). */
function servingStatus(msg) {
  let status = 0;
  let pos = 0;
  while (pos < msg.length) {
    let key;
    [key, pos] = readVarint(msg, pos);
    const wire = key & 7;
    if (wire === 0) {
      let v;
      [v, pos] = readVarint(msg, pos);
      if (key >>> 3 === 1) status = v;
    } else if (wire === 2) {
      let len;
      [len, pos] = readVarint(msg, pos);
      pos += len;
    } else if (wire === 1) pos += 8;
    else if (wire === 5) pos += 4;
    else throw new Error(`unsupported wire type ${wire}`);
  }
  if (pos > msg.length) throw new Error("truncated message");
  return status;
}

function tlsOptions() {
  const file = (env) => {
    try {
      return readFileSync(process.env[env]);
    } catch (err) {
      fail(`$${env}: cannot read ${process.env[env]}: ${err.code ?? err.message}`);
    }
  };
  const opts = { ca: file("AIFLOW_HEALTHCHECK_CA") };
  if (process.env.AIFLOW_HEALTHCHECK_CERT) Object.assign(opts, { cert: file("AIFLOW_HEALTHCHECK_CERT"), key: file("AIFLOW_HEALTHCHECK_KEY") });
  return opts;
}

const timer = setTimeout(() => fail(`no answer from ${target} within ${timeoutMs}ms`), timeoutMs);
timer.unref();

const session = http2.connect(authority(target), tls ? tlsOptions() : {});
session.on("error", (err) => fail(`${target}: ${err.code ?? err.message}`));
session.setTimeout(timeoutMs, () => fail(`${target}: session idle for ${timeoutMs}ms`));

const req = session.request({
  ":method": "POST",
  ":path": "/grpc.health.v1.Health/Check",
  "content-type": "application/grpc",
  te: "trailers",
  "user-agent": "aiflowd-healthcheck",
});
// A refused connection cancels the stream first; its cause is the session error (ECONNREFUSED etc.).
req.on("error", (err) => fail(`${target}: ${err.cause?.code ?? err.code ?? err.message}`));

let headers = {};
let trailers = {};
const chunks = [];
req.on("response", (h) => (headers = h));
req.on("trailers", (t) => (trailers = t));
req.on("data", (c) => chunks.push(c));
req.on("end", () => {
  session.close();
  if (headers[":status"] !== 200) fail(`HTTP status ${headers[":status"]}`);
  // A trailers-only answer (typical for errors) carries grpc-status in the headers.
  const grpcStatus = trailers["grpc-status"] ?? headers["grpc-status"];
  if (grpcStatus !== "0") {
    const message = decodeURIComponent(trailers["grpc-message"] ?? headers["grpc-message"] ?? "");
    fail(`grpc-status ${grpcStatus ?? "missing"}${message ? `: ${message}` : ""}`);
  }
  const body = Buffer.concat(chunks);
  if (body.length < 5) fail("response has no message");
  if (body[0] !== 0) fail("response message is compressed");
  const len = body.readUInt32BE(1);
  if (body.length < 5 + len) fail("response message is truncated");
  let status;
  try {
    status = servingStatus(body.subarray(5, 5 + len));
  } catch (err) {
    fail(`cannot decode response: ${err.message}`);
  }
  if (status !== 1) fail(`status ${STATUS[status] ?? status}`);
  process.stdout.write("SERVING\n");
  process.exit(0);
});
req.end(requestFrame(service));
