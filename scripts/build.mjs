#!/usr/bin/env node
/**
 * Compiles a package of this repository to JavaScript that runs on plain `node`, with the private
 * wire package (wire/) bundled inside it, so that what ships is one package:
 *
 *   node scripts/build.mjs daemon        -> dist/            (bin/aiflowd.js and bin/aiflowctl.js run it;
 *                                          dist/console is the web console, built by Vite from console/)
 *   node scripts/build.mjs sdk [OUT]     -> agent-sdk/dist/  (or OUT; the SDK's prepack runs this)
 *
 * Steps: wire/src is compiled to wire/dist; the package is compiled against wire/dist's
 * declarations (tsc `paths` made here from wire/package.json's exports, so the export map stays the
 * one list of what wire offers); wire/dist is copied to OUT/wire; and every `@aiflow/wire/...`
 * specifier in OUT's .js and .d.ts files becomes a relative path into OUT/wire. Compiles are
 * incremental (tsbuildinfo under .tmp/), so a build with nothing changed takes a second or two.
 * A finished daemon build leaves OUT/.build-stamp, the fingerprint of the sources it was built from
 * (scripts/build-stamp.mjs), by which the test setup sees that it need not build again.
 */
import { execFileSync } from "node:child_process";
import { cpSync, existsSync, mkdirSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join, relative, resolve, sep } from "node:path";
import { fileURLToPath } from "node:url";
import { clearStamp, fingerprint, writeStamp } from "./build-stamp.mjs";

const ROOT = fileURLToPath(new URL("..", import.meta.url));
const TMP = join(ROOT, ".tmp", "build");
const TSC = createRequire(import.meta.url).resolve("typescript/bin/tsc");

const TARGETS = {
  daemon: { config: join(ROOT, "tsconfig.build.json"), out: join(ROOT, "dist"), assets: [["src/db/migrations", "db/migrations"]] },
  sdk: { config: join(ROOT, "agent-sdk", "tsconfig.build.json"), out: join(ROOT, "agent-sdk", "dist"), assets: [] },
};

const [which, outArg] = process.argv.slice(2);
const target = TARGETS[which];
if (!target) {
  console.error("usage: node scripts/build.mjs daemon|sdk [OUT_DIR]");
  process.exit(2);
}
const out = outArg ? resolve(outArg) : target.out;
const WIRE_DIST = join(ROOT, "wire", "dist");
// Taken before anything is read, so that a source changed during the build makes the stamp stale.
const sources = which === "daemon" ? fingerprint(ROOT) : undefined;
if (sources && existsSync(out)) clearStamp(out);

/**
 * Compiles `base` into `outDir` through a config made here. An incremental compile does not notice
 * outputs deleted behind its back, so its build info goes when the output directory is gone.
 */
function tsc(name, base, outDir, extra = {}) {
  const info = join(TMP, `${name}-${Buffer.from(outDir).toString("base64url")}.tsbuildinfo`);
  if (!existsSync(outDir)) rmSync(info, { force: true });
  const config = join(TMP, `tsconfig.${name}.json`);
  writeFileSync(config, JSON.stringify({ extends: base, compilerOptions: { outDir, incremental: true, tsBuildInfoFile: info, ...extra } }, null, 2));
  execFileSync(process.execPath, [TSC, "-p", config], { stdio: "inherit", cwd: ROOT });
}
const posix = (p) => p.split(sep).join("/");

/** wire/package.json's exports as [specifier prefix, source path under wire/src without .ts, is pattern]. */
function wireExports() {
  const { exports } = JSON.parse(readFileSync(join(ROOT, "wire", "package.json"), "utf8"));
  return Object.entries(exports).map(([key, value]) => {
    const spec = `@aiflow/wire/${key.slice(2)}`;
    const file = value.replace(/^\.\/src\//, "").replace(/\.ts$/, "");
    return spec.includes("*") ? { spec: spec.replace(/\*\.js$/, ""), file: file.replace(/\*$/, ""), pattern: true } : { spec, file, pattern: false };
  });
}

// 1. wire/src -> wire/dist.
mkdirSync(TMP, { recursive: true });
tsc("wire", join(ROOT, "wire", "tsconfig.build.json"), WIRE_DIST);

// 2. The package, against wire/dist's declarations.
const exportsList = wireExports();
const paths = Object.fromEntries(
  exportsList.map((e) => (e.pattern ? [`${e.spec}*`, [`${posix(join(WIRE_DIST, e.file))}*`]] : [e.spec, [`${posix(join(WIRE_DIST, e.file))}.d.ts`]])),
);
tsc(which, target.config, out, { paths });

// 3. wire/dist -> OUT/wire, and the package's own non-TypeScript files.
const bundled = join(out, "wire");
cpSync(WIRE_DIST, bundled, { recursive: true, filter: (p) => !p.endsWith(".tsbuildinfo") });
for (const [from, to] of target.assets) cpSync(join(ROOT, from), join(out, to), { recursive: true });

// 4. @aiflow/wire/... -> relative paths into OUT/wire.
const SPECIFIER = /(["'])(@aiflow\/wire\/[^"']+)\1/g;
function rewrite(file) {
  const text = readFileSync(file, "utf8");
  if (!text.includes("@aiflow/wire/")) return;
  const next = text.replace(SPECIFIER, (_whole, quote, spec) => {
    const hit = exportsList.find((e) => (e.pattern ? spec.startsWith(e.spec) : spec === e.spec));
    if (!hit) throw new Error(`${file}: ${spec} is not among wire/package.json's exports`);
    const inWire = hit.pattern ? hit.file + spec.slice(hit.spec.length) : `${hit.file}.js`;
    let rel = posix(relative(dirname(file), join(bundled, inWire)));
    if (!rel.startsWith(".")) rel = `./${rel}`;
    return quote + rel + quote;
  });
  writeFileSync(file, next);
}
/** Every file under `dir`, recursively. */
function files(dir) {
  return readdirSync(dir, { recursive: true, withFileTypes: true })
    .filter((d) => d.isFile())
    .map((d) => join(d.parentPath, d.name));
}

/**
 * Keeps of OUT/wire only the modules the package reaches (following the relative imports of its
 * .js and .d.ts files), with their maps and declarations: the SDK ships no server code, and the
 * daemon none of the client transport.
 */
function pruneBundle() {
  const IMPORT = /(?:from|import)\s*\(?\s*["'](\.{1,2}\/[^"']+)["']/g;
  const reached = new Set();
  const todo = files(out).filter((f) => !f.startsWith(bundled + sep) && /\.(js|d\.ts)$/.test(f));
  while (todo.length > 0) {
    const file = todo.pop();
    for (const [, spec] of readFileSync(file, "utf8").matchAll(IMPORT)) {
      const target = resolve(dirname(file), spec);
      for (const f of file.endsWith(".d.ts") ? [target.replace(/\.js$/, ".d.ts")] : [target]) {
        if (f.startsWith(bundled + sep) && !reached.has(f) && existsSync(f)) {
          reached.add(f);
          todo.push(f);
        }
      }
    }
  }
  for (const f of files(bundled)) {
    const module = f.replace(/\.js\.map$/, ".js").replace(/\.d\.ts$/, ".js");
    if (!reached.has(module) && !reached.has(f)) rmSync(f);
  }
  const dirs = readdirSync(bundled, { recursive: true, withFileTypes: true }).filter((d) => d.isDirectory());
  for (const d of dirs
    .map((d) => join(d.parentPath, d.name))
    .sort()
    .reverse())
    if (readdirSync(d).length === 0) rmSync(d, { recursive: true });
}

function walk(dir) {
  for (const name of readdirSync(dir)) {
    const p = join(dir, name);
    if (statSync(p).isDirectory()) {
      if (p !== bundled) walk(p);
    } else if (/\.(js|d\.ts)$/.test(name)) rewrite(p);
  }
}
walk(out);
pruneBundle();
if (!existsSync(join(bundled, "codec", "index.js"))) throw new Error("the wire bundle is incomplete");

// 5. The daemon's web console: a browser bundle of console/ (Vite), served from OUT/console.
if (which === "daemon") {
  const { build } = await import("vite");
  await build({ configFile: join(ROOT, "console", "vite.config.ts"), build: { outDir: join(out, "console"), emptyOutDir: true } });
}
if (sources) writeStamp(out, sources);
console.log(`built ${which} -> ${posix(relative(process.cwd(), out)) || "."}`);
