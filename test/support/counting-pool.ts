/**
 * A slonik pool (built by our own openPool, so it behaves like the daemon's) that records the text of
 * every statement it executes, so a test can assert how many statements an operation cost.
 */
import type { DatabasePool, Interceptor } from "slonik";
import { openPool } from "../../src/db/pool.js";

export interface CountingPool {
  pool: DatabasePool;
  /** SQL text of every statement executed since the last reset. */
  readonly statements: string[];
  reset(): void;
  end(): Promise<void>;
}

export async function openCountingPool(url: string, maxConnections = 8): Promise<CountingPool> {
  const statements: string[] = [];
  const counter: Interceptor = {
    name: "statement-counter",
    beforeQueryExecution: (_ctx, query) => {
      statements.push(query.sql);
      return null;
    },
  };
  const pool = await openPool({ url, maxConnections, applicationName: "aiflowd-test-counting", interceptors: [counter] });
  return {
    pool,
    statements,
    reset: () => void statements.splice(0),
    end: () => pool.end(),
  };
}
