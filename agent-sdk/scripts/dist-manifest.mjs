#!/usr/bin/env node
/**
 * Writes the package.json of the compiled SDK into the build's output directory (argument 1,
 * relative to the working directory; default agent-sdk/dist): the workspace's own manifest, whose
 * exports point at the TypeScript sources, with its entry points moved to the compiled files. The
 * directory is then a package that `npm pack` or `npm install <dir>` takes as it is.
 */
import { readFileSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = fileURLToPath(new URL("..", import.meta.url));
// Relative to the working directory, as tsc's --outDir is (npm runs the build script in agent-sdk/).
const out = process.argv[2] ? resolve(process.argv[2]) : join(here, "dist");
const src = JSON.parse(readFileSync(join(here, "package.json"), "utf8"));
const entry = (path) => ({ types: `./${path}.d.ts`, default: `./${path}.js` });
const manifest = {
  name: src.name,
  version: src.version,
  description: src.description,
  license: src.license,
  type: "module",
  engines: src.engines,
  main: "./index.js",
  types: "./index.d.ts",
  exports: { ".": entry("index") },
  dependencies: src.dependencies,
};
writeFileSync(join(out, "package.json"), `${JSON.stringify(manifest, null, 2)}\n`);
console.log(`wrote ${join(out, "package.json")}`);
