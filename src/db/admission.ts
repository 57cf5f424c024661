/**
 * The limit on the slonik pool's connections, kept by us instead of by slonik. slonik 47's pool
 * never wakes a client queued for a connection when a connection attempt fails (the database
 * restarting or away), and a connection whose query failed as its socket closed stays counted as
 * "pending destroy" for good: after an outage, calls queued in the pool hang until their deadline,
 * and each such connection takes one slot from the pool for the rest of the process's life.
 *
 * So the pool is created with room it never uses (`SLONIK_ROOM`), and every operation that takes a
 * connection first takes one of `limit` places here, in arrival order. slonik then always has a slot
 * free and never queues a client; what was queued waits here, where a failed operation (a refused
 * connection fails it at once) hands its place on like any other. Live server connections stay at
 * most `limit`: a dead connection holds none. Such a connection also makes slonik's end() fail
 * (its failed destroy is reported again), which here ends quietly: there is nothing left to close.
 */
import type { DatabasePool } from "slonik";
import { databaseAway } from "./errors.js";

/** slonik's own maximum: far above any limit, so dead connections it keeps counting never fill it. */
export const SLONIK_ROOM = 10_000;

/** Pool methods that take a connection for their duration (the rest only read the pool's state). */
const TAKES_CONNECTION: ReadonlySet<string | symbol> = new Set([
  "any",
  "anyFirst",
  "connect",
  "copyFromBinary",
  "exists",
  "many",
  "manyFirst",
  "maybeOne",
  "maybeOneFirst",
  "one",
  "oneFirst",
  "query",
  "stream",
  "transaction",
]);

/**
 * What an operation is answered when its connection's path to the server went silent (a dropped
 * flow, a hung host): nothing else ends it, because the client side of pg has no read timeout here
 * and the server's statement timeout cannot reach a client that does not hear it. The operation is
 * abandoned to its dead connection, and its place handed on.
 */
export class DatabaseSilentError extends Error {
  override name = "DatabaseSilentError";
  constructor(ms: number) {
    super(`Query read timeout: the database did not answer within ${ms} ms`);
  }
}

export class Admission {
  #active = 0;
  readonly #queue: (() => void)[] = [];

  /** `silentMs`: how long an operation may go unanswered before it is abandoned (see DatabaseSilentError). */
  constructor(
    readonly limit: number,
    readonly silentMs: number,
  ) {}

  async run<T>(fn: () => Promise<T>): Promise<T> {
    if (this.#active >= this.limit) await new Promise<void>((resolve) => this.#queue.push(resolve));
    else this.#active++;
    let timer: NodeJS.Timeout | undefined;
    try {
      return await Promise.race([
        fn(),
        new Promise<never>((_, reject) => {
          timer = setTimeout(() => reject(new DatabaseSilentError(this.silentMs)), this.silentMs);
        }),
      ]);
    } finally {
      clearTimeout(timer);
      // The place goes straight to the next in line (the count stays), or is given back.
      const next = this.#queue.shift();
      if (next) next();
      else this.#active--;
    }
  }

  /** Operations holding a place, and operations waiting for one. */
  get state(): { active: number; waiting: number } {
    return { active: this.#active, waiting: this.#queue.length };
  }
}

/** The admission of each pool admitted() made, for poolUsage. */
const admissions = new WeakMap<DatabasePool, { admission: Admission; slonik: DatabasePool }>();

/**
 * A pool's connections for /metrics: in use and waiting are this admission's (what callers see),
 * idle is slonik's. Undefined for a pool admitted() did not make.
 */
export function poolUsage(pool: DatabasePool): { inUse: number; idle: number; waiting: number } | undefined {
  const a = admissions.get(pool);
  if (!a) return undefined;
  const { active, waiting } = a.admission.state;
  return { inUse: active, idle: a.slonik.state().idleConnections, waiting };
}

/** `pool`, with every operation that takes a connection admitted through `admission` first. */
export function admitted(pool: DatabasePool, admission: Admission): DatabasePool {
  const proxy = new Proxy(pool, {
    get(target, prop, receiver) {
      const value = Reflect.get(target, prop, receiver) as unknown;
      if (prop === "end") return () => target.end().catch(quietIfConnectionLost);
      if (typeof value !== "function" || !TAKES_CONNECTION.has(prop)) return value;
      const method = value as (...args: unknown[]) => Promise<unknown>;
      return (...args: unknown[]) => admission.run(() => method.apply(target, args));
    },
  });
  admissions.set(proxy, { admission, slonik: pool });
  return proxy;
}

/** Rethrows `err` unless it says a connection was lost (the database away): nothing is left to end. */
function quietIfConnectionLost(err: unknown): void {
  if (!databaseAway(err)) throw err;
}
