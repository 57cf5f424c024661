/**
 * The fast tier's setup file, run in its worker before each test file: the tier does not isolate
 * files (vitest.config.ts), so a worker runs file after file and keeps what Node loaded from
 * node_modules, the bulk of a file's start; but the repository's own modules (src/, wire/src/,
 * test/support/) are evaluated afresh for each file, so no module state passes from one file to
 * the next: the ULID factory's last time (src/util/ids.ts), caches, counters.
 */
import { vi } from "vitest";

vi.resetModules();
