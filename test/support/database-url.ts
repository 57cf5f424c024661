import { inject } from "vitest";

/** The Postgres URL that test/support/global-setup.ts provides to every test file. */
export function databaseUrl(): string {
  return inject("databaseUrl");
}
