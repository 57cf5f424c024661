// Loads an entry point of the compiled daemon (dist/), or says how to make it when it is missing.
import { existsSync } from "node:fs";

export async function runCompiled(entry) {
  const url = new URL(`../dist/${entry}`, import.meta.url);
  if (!existsSync(url)) {
    process.stderr.write(`aiflowd is not built: run \`npm run build\` in ${new URL("..", import.meta.url).pathname} first (${url.pathname} is missing)\n`);
    process.exit(1);
  }
  await import(url.href);
}
