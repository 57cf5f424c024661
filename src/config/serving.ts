/**
 * Where the daemon serves: its gRPC and HTTP addresses, /metrics and the web console, and transport
 * security (TLS, mutual TLS, or plaintext).
 */
import { fileURLToPath } from "node:url";
import { DEFAULT_MAX_LABEL_VALUES } from "../observability/label-values.js";
import { text, bool, trustDomain, int, duration, listen, secret, type Setting } from "./parsers.js";

/** Where `npm run build` puts the web console, from src/ or dist/ alike (the console's HTTP handler is ../server/console.ts). */
const DEFAULT_CONSOLE_DIR = fileURLToPath(new URL("../../dist/console/", import.meta.url));

export const SERVING_SETTINGS = {
  listen: {
    flag: "--listen",
    env: ["AIFLOW_LISTEN"],
    default: "127.0.0.1:7400",
    help: "gRPC address to serve (TLS with --tls-cert; h2c without, on loopback or with --insecure-plaintext)",
    parse: listen,
  },
  // Transport security (src/server/tls.ts): HTTP/2 over TLS 1.2+ (ALPN h2), files re-read on change and SIGHUP.
  httpListen: {
    flag: "--http-listen",
    env: ["AIFLOW_HTTP_LISTEN"],
    default: "127.0.0.1:9464",
    help: "HTTP address of /metrics, /healthz and /readyz (HTTPS with --tls-cert); off: none",
    parse: (raw, flag) => (raw === "off" ? null : listen(raw, flag)),
  },
  metricsListen: {
    flag: "--metrics-listen",
    env: ["AIFLOW_METRICS_LISTEN"],
    default: undefined,
    help: "HTTP address of /metrics (and the probes) apart from --http-listen, which then serves no /metrics: keep the scrape off the port that faces the internet; default: on --http-listen",
    parse: listen,
  },
  consoleDir: {
    flag: "--console-dir",
    env: ["AIFLOW_CONSOLE_DIR"],
    default: DEFAULT_CONSOLE_DIR,
    help: "the built web console served at /console/ on --http-listen (npm run build makes it)",
    parse: text,
  },
  metricsToken: {
    flag: "--metrics-token",
    env: ["AIFLOW_METRICS_TOKEN"],
    default: undefined,
    help: "bearer token /metrics requires (prefer the env var: flags show in ps); at least 16 characters",
    parse: secret(16),
  },
  metricsMaxLabelValues: {
    flag: "--metrics-max-label-values",
    env: ["AIFLOW_METRICS_MAX_LABEL_VALUES"],
    default: String(DEFAULT_MAX_LABEL_VALUES),
    help: 'distinct values each of the tenant and engine_kind labels takes on /metrics (the first seen keep theirs); later ones are counted as "other"',
    parse: int(1, 100_000),
  },
  metricsMaxAgents: {
    flag: "--metrics-max-agents",
    env: ["AIFLOW_METRICS_MAX_AGENTS"],
    default: "1000",
    help: "agents with series of their own on /metrics (the first by name); the rest count in aggregates only",
    parse: int(0, 100_000),
  },
  metricsRefresh: {
    flag: "--metrics-refresh",
    env: ["AIFLOW_METRICS_REFRESH"],
    default: "5s",
    help: "how old the queue and fleet gauges on /metrics may be: scrapes within it share one read of the database",
    parse: duration(0, 600_000),
  },
  tlsCert: { flag: "--tls-cert", env: ["AIFLOW_TLS_CERT"], default: undefined, help: "PEM certificate chain of the gRPC port (with --tls-key)", parse: text },
  tlsKey: { flag: "--tls-key", env: ["AIFLOW_TLS_KEY"], default: undefined, help: "PEM private key of --tls-cert", parse: text },
  tlsClientCa: {
    flag: "--tls-client-ca",
    env: ["AIFLOW_TLS_CLIENT_CA"],
    default: undefined,
    help: "PEM CA bundle: mutual TLS, a client without a certificate it signed is refused in the handshake; a URI SAN spiffe://DOMAIN/ROLE/NAME is the caller's identity",
    parse: text,
  },
  tlsTrustDomain: {
    flag: "--tls-trust-domain",
    env: ["AIFLOW_TLS_TRUST_DOMAIN"],
    default: "aiflow",
    help: "trust domain of the spiffe:// URIs in client certificates that name a caller",
    parse: trustDomain,
  },
  insecurePlaintext: {
    flag: "--insecure-plaintext",
    env: ["AIFLOW_INSECURE_PLAINTEXT"],
    default: "false",
    help: "serve h2c on a non-loopback address (behind a TLS-terminating proxy); tokens then cross that network in clear",
    parse: bool,
    switch: true,
  },
} satisfies Record<string, Setting<unknown>>;
