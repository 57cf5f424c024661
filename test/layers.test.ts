/**
 * The layers hold: the daemon is built top down, wire → rpc → queue/engines → store → db, with a
 * shared floor every layer may use, and no module imports a value from a layer above its own. And no
 * two modules import each other, however indirectly (type imports count for cycles: a cycle of types
 * is still two modules that cannot be read, or moved, one without the other).
 *
 * Every src/**\/*.ts (and the SDK's and the wire package's sources, for cycles) is parsed with the
 * TypeScript parser; an import or re-export whose bindings are all `type` is a type import. Only
 * relative specifiers are followed: packages (@aiflow/wire, the SDK by name) are other builds.
 *
 * ALLOWED and ALLOWED_CYCLES hold what is known and not yet fixed (both empty since issue 53 part 3
 * moved the last ones); an entry that no longer matches fails the test too, so they only shrink.
 */
import fs from "node:fs";
import path from "node:path";
import ts from "typescript";
import { expect, it } from "vitest";

/**
 * Each module's layer, by the longest matching prefix of its path under src/ (a folder ends in "/").
 * A module may import values from its own layer and the ones below it.
 */
const LAYERS: [prefix: string, rank: number, layer: string][] = [
  // The top: the process (daemon.ts), the command lines, and the composition root that builds every
  // service and store and wires them together. Nothing imports these but each other.
  ["daemon.ts", 8, "top"],
  ["cli/", 8, "top"],
  ["services.ts", 8, "top"],
  // The wire: the HTTP/2 server, TLS, authentication, the gate, health, reflection, the console's
  // HTTP handler. It routes calls to the rpc layer's handlers.
  ["server/", 7, "wire"],
  // The daemon's settings: parsed from flags and files, read by the top and the wire; the layers
  // below take what they need as arguments (a type import of Config is no dependency).
  ["config.ts", 6, "settings"],
  ["config/", 6, "settings"],
  // The RPC handlers: a call's caller, its input checked, the call turned into queue, engine and
  // store operations, and the reply.
  ["rpc/", 5, "rpc"],
  // Metrics, spans and readiness the rpc layer and the top record and serve; readiness reads db.
  ["observability/", 4, "observability"],
  // The domain's machinery: the work queue and its claim, the engines (graph, state machine, DAG),
  // triggers, and the fleet of agents (liveness, directives, placement).
  ["queue/", 3, "queue/engines"],
  ["engines/", 3, "queue/engines"],
  ["triggers/", 3, "queue/engines"],
  ["fleet/", 3, "queue/engines"],
  // The store: each table group's statements. The maintenance scheduler runs its periodic tasks and
  // reads db's outage log, so it sits here, under every task it runs.
  ["store/", 2, "store"],
  ["maintenance.ts", 2, "store"],
  // The database: pool, migrations, prepared statements, SQLSTATE errors, NOTIFY.
  ["db/", 1, "db"],
  // The shared floor: domain rules and errors, input checks, names, small utilities, the clock, the
  // logger, the version, the audit log's interface.
  ["domain/", 0, "shared"],
  ["util/", 0, "shared"],
  ["clock.ts", 0, "shared"],
  ["log.ts", 0, "shared"],
  ["audit.ts", 0, "shared"],
];

/** Upward value imports not yet moved (from → to, paths from the repository root). */
const ALLOWED = new Set<string>([]);

/** Import cycles not yet broken (their modules, sorted, joined by " ⇄ "). */
const ALLOWED_CYCLES = new Set<string>([]);

const ROOT = path.resolve(import.meta.dirname, "..");
const SOURCES = ["src", "agent-sdk/src", "wire/src"];
const SKIP = new Set(["wire/src/gen", "src/db/migrations"]);

interface Edge {
  from: string;
  to: string;
  typeOnly: boolean;
}

function sourceFiles(): string[] {
  const files: string[] = [];
  const walk = (dir: string) => {
    for (const e of fs.readdirSync(path.join(ROOT, dir), { withFileTypes: true })) {
      const rel = `${dir}/${e.name}`;
      if (e.isDirectory()) {
        if (!SKIP.has(rel)) walk(rel);
      } else if (rel.endsWith(".ts") && !rel.endsWith(".d.ts")) files.push(rel);
    }
  };
  SOURCES.forEach(walk);
  return files.sort();
}

/** A relative specifier's module (./x.js is ./x.ts, ./x/index.ts, or a .d.ts beside JavaScript, not followed). */
function resolve(from: string, spec: string): string | undefined {
  const base = path.posix.normalize(path.posix.join(path.posix.dirname(from), spec)).replace(/\.js$/, "");
  for (const candidate of [`${base}.ts`, `${base}/index.ts`]) if (fs.existsSync(path.join(ROOT, candidate))) return candidate;
  if (fs.existsSync(path.join(ROOT, `${base}.d.ts`))) return undefined;
  throw new Error(`${from}: cannot resolve ${spec}`);
}

function edgesOf(file: string): Edge[] {
  const source = ts.createSourceFile(file, fs.readFileSync(path.join(ROOT, file), "utf8"), ts.ScriptTarget.Latest, false);
  const edges: Edge[] = [];
  for (const s of source.statements) {
    let spec: ts.Expression | undefined;
    let typeOnly = false;
    if (ts.isImportDeclaration(s)) {
      spec = s.moduleSpecifier;
      const clause = s.importClause;
      // `import "x"` (no clause) runs x: a value import.
      if (clause) {
        const named = clause.namedBindings;
        typeOnly =
          clause.isTypeOnly || (!clause.name && !!named && ts.isNamedImports(named) && named.elements.length > 0 && named.elements.every((e) => e.isTypeOnly));
      }
    } else if (ts.isExportDeclaration(s) && s.moduleSpecifier) {
      spec = s.moduleSpecifier;
      const clause = s.exportClause;
      typeOnly = s.isTypeOnly || (!!clause && ts.isNamedExports(clause) && clause.elements.length > 0 && clause.elements.every((e) => e.isTypeOnly));
    }
    if (!spec || !ts.isStringLiteral(spec) || !spec.text.startsWith(".")) continue;
    const to = resolve(file, spec.text);
    if (to) edges.push({ from: file, to, typeOnly });
  }
  return edges;
}

function layerOf(file: string): { rank: number; layer: string } | undefined {
  if (!file.startsWith("src/")) return undefined;
  const rel = file.slice("src/".length);
  let best: [string, number, string] | undefined;
  for (const entry of LAYERS) {
    const [prefix] = entry;
    const hit = prefix.endsWith("/") ? rel.startsWith(prefix) : rel === prefix;
    if (hit && (!best || prefix.length > best[0].length)) best = entry;
  }
  if (!best) throw new Error(`${file} has no layer: add its folder to LAYERS`);
  return { rank: best[1], layer: best[2] };
}

/** Strongly connected components of more than one module (Tarjan), each sorted. */
function cycles(edges: Edge[]): string[][] {
  const next = new Map<string, Set<string>>();
  for (const e of edges) {
    if (!next.has(e.from)) next.set(e.from, new Set());
    next.get(e.from)!.add(e.to);
  }
  const index = new Map<string, number>();
  const low = new Map<string, number>();
  const stack: string[] = [];
  const onStack = new Set<string>();
  const found: string[][] = [];
  const visit = (v: string) => {
    index.set(v, index.size);
    low.set(v, index.get(v)!);
    stack.push(v);
    onStack.add(v);
    for (const w of next.get(v) ?? []) {
      if (!index.has(w)) {
        visit(w);
        low.set(v, Math.min(low.get(v)!, low.get(w)!));
      } else if (onStack.has(w)) low.set(v, Math.min(low.get(v)!, index.get(w)!));
    }
    if (low.get(v) === index.get(v)) {
      const component: string[] = [];
      let w: string;
      do {
        w = stack.pop()!;
        onStack.delete(w);
        component.push(w);
      } while (w !== v);
      if (component.length > 1 || next.get(v)?.has(v)) found.push(component.sort());
    }
  };
  for (const v of [...next.keys()].sort()) if (!index.has(v)) visit(v);
  return found;
}

const edges = sourceFiles().flatMap(edgesOf);

it("imports no value from a layer above", () => {
  const upward: string[] = [];
  for (const e of edges) {
    if (e.typeOnly) continue;
    const from = layerOf(e.from);
    const to = layerOf(e.to);
    if (from && to && to.rank > from.rank) upward.push(`${e.from} -> ${e.to}`);
  }
  const seen = new Set(upward);
  const report = {
    upward: upward
      .filter((u) => !ALLOWED.has(u))
      .map(
        (u) =>
          `${u} (${u
            .split(" -> ")
            .map((f) => layerOf(f)!.layer)
            .join(" -> ")})`,
      ),
    staleAllowed: [...ALLOWED].filter((a) => !seen.has(a)),
  };
  if (process.env.LAYERS_PRINT) console.log(`upward value imports allowed for now: ${ALLOWED.size}\n${[...ALLOWED].join("\n")}`);
  expect(report).toEqual({ upward: [], staleAllowed: [] });
});

it("has no import cycle", () => {
  const found = cycles(edges).map((c) => c.join(" ⇄ "));
  const seen = new Set(found);
  expect({ cycles: found.filter((c) => !ALLOWED_CYCLES.has(c)), staleAllowed: [...ALLOWED_CYCLES].filter((c) => !seen.has(c)) }).toEqual({
    cycles: [],
    staleAllowed: [],
  });
});

it("finds an upward import and a cycle when there is one", () => {
  expect(layerOf("src/store/agents.ts")!.rank).toBeLessThan(layerOf("src/rpc/ops-service.ts")!.rank);
  expect(
    cycles([
      { from: "a", to: "b", typeOnly: true },
      { from: "b", to: "c", typeOnly: false },
      { from: "c", to: "a", typeOnly: false },
      { from: "c", to: "d", typeOnly: false },
    ]),
  ).toEqual([["a", "b", "c"]]);
});
