/**
 * The Grafana dashboard (deploy/grafana/aiflowd-dashboard.json) holds to Grafana's own JSON schema
 * (test/support/grafana-schema/: the dashboard's, and the timeseries, stat and Prometheus plugins'
 * for what the dashboard schema leaves open), and cannot drift from the daemon's metrics: every
 * query parses as PromQL with Prometheus' own grammar, names only documented metrics (prom-client's
 * default metrics as prom-client itself names them), matches and groups by labels those metrics
 * have, and is filtered by `$instance`; every documented daemon metric is on the dashboard, and the
 * daemon's code defines exactly the documented metrics with their labels (test/support/metrics.ts).
 */
import { readFileSync } from "node:fs";
import { join } from "node:path";
import type { SyntaxNode } from "@lezer/common";
import { parser } from "@prometheus-io/lezer-promql";
import { Ajv, type ValidateFunction } from "ajv";
import addFormats from "ajv-formats";
import { collectDefaultMetrics, Registry } from "prom-client";
import { describe, expect, it } from "vitest";
import { FakeClock } from "../src/clock.js";
import { silentLogger } from "../src/log.js";
import { FleetGauges } from "../src/observability/fleet-gauges.js";
import { DaemonMetrics } from "../src/observability/metrics.js";
import { rpcMetricsInterceptor } from "../src/observability/rpc-metrics.js";
import { newServerStats } from "../src/server/stats.js";
import { DAEMON_METRICS } from "./support/metrics.js";

const ROOT = new URL("..", import.meta.url).pathname;
const readJson = (path: string): unknown => JSON.parse(readFileSync(join(ROOT, path), "utf8"));
const schema = (name: string) => readJson(`test/support/grafana-schema/${name}.jsonschema.json`) as Record<string, unknown>;

/** prom-client's default metrics and their labels, from prom-client itself (on a registry of this test's own). */
function defaultMetrics(): Record<string, readonly string[]> {
  const registry = new Registry();
  collectDefaultMetrics({ register: registry });
  return Object.fromEntries(registry.getMetricsAsArray().map((m) => [m.name, (m as unknown as { labelNames: string[] }).labelNames]));
}

const KNOWN: Record<string, readonly string[]> = { ...DAEMON_METRICS, ...defaultMetrics() };
const SERIES_SUFFIX = /_(bucket|sum|count)$/;
/** The documented metric a series name belongs to (a histogram's `_bucket`, `_sum` and `_count` are its own). */
const metricOf = (series: string) => (series in KNOWN ? series : series.replace(SERIES_SUFFIX, ""));

interface Target {
  refId: string;
  expr: string;
  datasource?: { type?: string; uid?: string };
  [k: string]: unknown;
}
interface Panel {
  type: string;
  id: number;
  title?: string;
  datasource?: { type?: string; uid?: string };
  targets?: Target[];
  options?: Record<string, unknown>;
  fieldConfig?: { defaults: { custom?: Record<string, unknown> } };
  panels?: Panel[];
  gridPos: { h: number; w: number; x: number; y: number };
}
interface Variable {
  type: string;
  name: string;
  query?: unknown;
  datasource?: { type?: string; uid?: string };
}
interface Dashboard {
  schemaVersion: number;
  templating: { list: Variable[] };
  panels: Panel[];
}

const dashboard = readJson("deploy/grafana/aiflowd-dashboard.json") as Dashboard;
const allPanels = dashboard.panels.flatMap((p) => [p, ...(p.panels ?? [])]);
const queryPanels = allPanels.filter((p) => p.type !== "row");
const targets = queryPanels.flatMap((p) => (p.targets ?? []).map((t) => ({ panel: p.title ?? String(p.id), target: t })));

function validator(name: string, definition?: string): ValidateFunction {
  const ajv = new Ajv({ allErrors: true, strict: true });
  addFormats.default(ajv);
  const s = schema(name);
  return definition ? ajv.compile({ ...s, $ref: `#/definitions/${definition}` }) : ajv.compile(s);
}

/** Ajv's errors in a form a failing expectation can show. */
const errors = (v: ValidateFunction) => (v.errors ?? []).map((e) => `${e.instancePath || "/"} ${e.message} ${JSON.stringify(e.params)}`);

describe("Grafana's schema", () => {
  it("the dashboard is valid against Grafana 11.6's dashboard schema", () => {
    const validate = validator("dashboard");
    const valid = validate(dashboard);
    expect(errors(validate)).toEqual([]);
    expect(valid).toBe(true);
    expect(dashboard.schemaVersion).toBe(41);
  });

  it("the schema is strict enough to refuse a broken dashboard", () => {
    const validate = validator("dashboard");
    const broken = structuredClone(dashboard) as unknown as { panels: Record<string, unknown>[]; colour?: string };
    broken.colour = "blue";
    broken.panels[1]!.gridPos = { h: 4, w: 25, x: 0, y: 0 };
    expect(validate(broken)).toBe(false);
    expect(errors(validate).join("\n")).toMatch(/must NOT have additional properties.*colour/);
  });

  it("each panel's options, custom field config and queries are valid against its plugin's schema", () => {
    const options = { timeseries: validator("timeseries", "Options"), stat: validator("stat", "Options") };
    const custom = { timeseries: validator("timeseries", "FieldConfig") };
    const query = validator("prometheus");
    const problems: string[] = [];
    for (const p of queryPanels) {
      const type = p.type as keyof typeof options;
      expect(Object.keys(options), `panel '${p.title}' is of a type this test has no schema for`).toContain(type);
      if (!options[type](p.options)) problems.push(`${p.title} options: ${errors(options[type])}`);
      const c = custom[type as keyof typeof custom];
      if (c && !c(p.fieldConfig?.defaults.custom ?? {})) problems.push(`${p.title} fieldConfig.defaults.custom: ${errors(c)}`);
      for (const t of p.targets ?? []) {
        const { refId } = t;
        if (!query(t)) problems.push(`${p.title} target ${refId}: ${errors(query)}`);
      }
    }
    expect(problems).toEqual([]);
  });

  it("panel ids are unique and panels fit the 24-column grid without overlapping", () => {
    const ids = allPanels.map((p) => p.id);
    expect(new Set(ids).size).toBe(ids.length);
    const cells = new Set<string>();
    for (const p of allPanels) {
      const { h, w, x, y } = p.gridPos;
      expect(x + w, `panel '${p.title}'`).toBeLessThanOrEqual(24);
      for (let i = x; i < x + w; i++)
        for (let j = y; j < y + h; j++) {
          expect(cells.has(`${i},${j}`), `panel '${p.title}' overlaps another at ${i},${j}`).toBe(false);
          cells.add(`${i},${j}`);
        }
    }
  });
});

describe("templating", () => {
  it("has a Prometheus $datasource variable and an $instance variable, and every panel and query uses the data source through it", () => {
    const vars = Object.fromEntries(dashboard.templating.list.map((v) => [v.name, v]));
    expect(vars.datasource).toMatchObject({ type: "datasource", query: "prometheus" });
    expect(vars.instance).toMatchObject({ type: "query", datasource: { type: "prometheus", uid: "${datasource}" } });
    expect(vars.instance!.query).toMatch(/^label_values\((\w+), instance\)$/);
    expect(KNOWN).toHaveProperty(String(vars.instance!.query).match(/^label_values\((\w+),/)![1]!);
    for (const p of queryPanels) expect(p.datasource, `panel '${p.title}'`).toEqual({ type: "prometheus", uid: "${datasource}" });
    for (const { panel, target } of targets)
      expect(target.datasource, `panel '${panel}' target ${target.refId}`).toEqual({ type: "prometheus", uid: "${datasource}" });
  });
});

describe("provisioning (deploy/grafana/provisioning, docker-compose.yml)", () => {
  const read = (path: string) => readFileSync(join(ROOT, path), "utf8");

  it("provisions the data source the dashboard's $datasource starts on", () => {
    const uid = read("deploy/grafana/provisioning/datasources/prometheus.yml").match(/^\s+uid: (\S+)$/m)?.[1];
    const datasource = dashboard.templating.list.find((v) => v.name === "datasource") as { current?: { value?: string } };
    expect(uid).toBe("prometheus");
    expect(datasource.current?.value).toBe(uid);
  });

  it("loads the dashboard from where the compose file mounts it", () => {
    const path = read("deploy/grafana/provisioning/dashboards/aiflowd.yml").match(/^\s+path: (\S+)$/m)?.[1];
    expect(read("docker-compose.yml")).toContain(`./deploy/grafana/aiflowd-dashboard.json:${path}/aiflowd-dashboard.json:ro`);
  });
});

/** A query as Prometheus receives it once Grafana has put in its interval variable. */
const asSent = (expr: string) => expr.replaceAll("$__rate_interval", "1m");

interface Selector {
  series: string;
  matchers: { label: string; op: string; value: string }[];
}

/** `node` and every node under it, in document order. */
function descendants(node: SyntaxNode): SyntaxNode[] {
  const out = [node];
  for (let child = node.firstChild; child; child = child.nextSibling) out.push(...descendants(child));
  return out;
}

/** Every node named `name` at or under `root` ("⚠" for the parser's error nodes). */
const nodesNamed = (root: SyntaxNode, name: string) => descendants(root).filter((n) => n.name === name);

/** The vector selectors at or under `node` of the parsed `text`, with their label matchers. */
function selectors(text: string, node: SyntaxNode): Selector[] {
  const slice = (n: SyntaxNode | null) => (n ? text.slice(n.from, n.to) : "");
  return nodesNamed(node, "VectorSelector").map((sel) => ({
    series: slice(sel.getChild("Identifier")),
    matchers: (sel.getChild("LabelMatchers")?.getChildren("UnquotedLabelMatcher") ?? []).map((m) => ({
      label: slice(m.getChild("LabelName")),
      op: slice(m.getChild("MatchOp")),
      value: slice(m.getChild("StringLiteral")).slice(1, -1),
    })),
  }));
}

/** The labels a series of `series` can carry in Prometheus. */
const labelsOf = (series: string) => [...(KNOWN[metricOf(series)] ?? []), "instance", "job", ...(series.endsWith("_bucket") ? ["le"] : [])];

describe("the queries", () => {
  it("the dashboard has queries", () => {
    expect(targets.length).toBeGreaterThan(40);
  });

  it("parse as PromQL with Prometheus' own grammar", () => {
    const broken = targets.filter(({ target }) => nodesNamed(parser.parse(asSent(target.expr)).topNode, "⚠").length > 0);
    expect(broken.map(({ panel, target }) => `${panel} ${target.refId}: ${target.expr}`)).toEqual([]);
    // The grammar does report errors: one it must refuse.
    expect(nodesNamed(parser.parse("sum by (le (rate(x[1m]))").topNode, "⚠").length).toBeGreaterThan(0);
  });

  it("name only documented metrics, by the names the parser finds and by any name-shaped text in the query", () => {
    const unknown = new Set<string>();
    for (const { target } of targets) {
      const text = asSent(target.expr);
      for (const s of selectors(text, parser.parse(text).topNode)) if (!(metricOf(s.series) in KNOWN)) unknown.add(s.series);
      for (const name of text.match(/\b(?:aiflow_\w+|grpc_server_\w+|nodejs_\w+|process_\w+)/g) ?? []) if (!(metricOf(name) in KNOWN)) unknown.add(name);
    }
    expect([...unknown]).toEqual([]);
  });

  it("select every series by name, filtered by $instance, and match only labels the metric has", () => {
    const problems: string[] = [];
    for (const { panel, target } of targets) {
      const text = asSent(target.expr);
      for (const s of selectors(text, parser.parse(text).topNode)) {
        if (!s.series) problems.push(`${panel}: a selector without a metric name`);
        if (!s.matchers.some((m) => m.label === "instance" && m.op === "=~" && m.value === "$instance"))
          problems.push(`${panel}: ${s.series} is not filtered by instance=~"$instance"`);
        for (const m of s.matchers) if (!labelsOf(s.series).includes(m.label)) problems.push(`${panel}: ${s.series} has no label '${m.label}'`);
      }
    }
    expect(problems).toEqual([]);
  });

  it("group only by labels that every series under the aggregation has", () => {
    const problems: string[] = [];
    for (const { panel, target } of targets) {
      const text = asSent(target.expr);
      for (const agg of nodesNamed(parser.parse(text).topNode, "AggregateExpr")) {
        const grouping = agg.getChild("AggregateModifier")?.getChild("GroupingLabels")?.getChildren("LabelName") ?? [];
        const series = selectors(text, agg).map((s) => s.series);
        for (const g of grouping) {
          const label = text.slice(g.from, g.to);
          for (const s of series) if (!labelsOf(s).includes(label)) problems.push(`${panel}: groups by '${label}', which ${s} does not have`);
        }
      }
    }
    expect(problems).toEqual([]);
  });

  it("every documented daemon metric is on the dashboard", () => {
    const used = new Set(
      targets.flatMap(({ target }) => selectors(asSent(target.expr), parser.parse(asSent(target.expr)).topNode).map((s) => metricOf(s.series))),
    );
    expect(Object.keys(DAEMON_METRICS).filter((m) => !used.has(m))).toEqual([]);
  });
});

describe("the daemon's code", () => {
  it("defines exactly the documented daemon metrics, each with its documented labels", () => {
    const metrics = new DaemonMetrics();
    rpcMetricsInterceptor(metrics.registry);
    new FleetGauges(
      metrics.registry,
      { queue: async () => [], fleet: async () => ({ byStatus: [], agents: [] }) },
      { clock: new FakeClock(), refreshMs: 0, maxAgents: 0, log: silentLogger() },
    );
    metrics.watchPools({});
    metrics.watchServer(newServerStats());
    const defined = Object.fromEntries(
      metrics.registry.getMetricsAsArray().map((m) => [m.name, [...(m as unknown as { labelNames: string[] }).labelNames].sort()]),
    );
    expect(defined).toEqual(Object.fromEntries(Object.entries(DAEMON_METRICS).map(([name, labels]) => [name, [...labels].sort()])));
  });
});
