/** This package's version, from its package.json: what `--version` prints and the daemon logs at start. */
import { readFileSync } from "node:fs";

export const VERSION = (JSON.parse(readFileSync(new URL("../../package.json", import.meta.url), "utf8")) as { version: string }).version;
