/**
 * The kit the daemon's tests and the SDK's tests share:
 *
 * - `until(what, check)` waits for a condition by checking it every few milliseconds: it returns as
 *   soon as the condition holds, and fails, naming it, only after a timeout a working system never
 *   comes near. It is not a sleep: nothing waits for time to pass.
 * - `codeOf(call)` is the gRPC code a call was refused with ("ok" when it was not); `refusal(call)`
 *   is the error itself, and fails the test when the call succeeded (refusals.ts).
 * - `Connection` is one HTTP/2 connection to a daemon that connect-es clients share; `Session` is a
 *   client of one service on a connection of its own with the bearer header for its calls.
 * - `useTestDb(label)` and `useTestDaemon(options)` set up, before a file's tests, a migrated schema
 *   of the file's own and a daemon on it, and take down after them what the file opened, in reverse
 *   order: the connections, the daemons, then the schema. `useTestCluster(label, options)` is the
 *   same with several daemons on the schema, one per instance id.
 */
import type { DescService } from "@bufbuild/protobuf";
import { createClient, type Client, type Interceptor, type Transport } from "@connectrpc/connect";
import { createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";
import { afterAll, beforeAll } from "vitest";
import type { Daemon } from "../../src/daemon.js";
import { bearer, startTestDaemon, type TestDaemonOptions } from "./daemon.js";
import { createTestDb, type TestDb } from "./db.js";

/** Resolves once `check` holds (checked at once, then every `everyMs`); fails after `timeoutMs`. */
export async function until(what: string, check: () => boolean | Promise<boolean>, timeoutMs = 10_000, everyMs = 5): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs}ms waiting until ${what}`);
    await new Promise((resolve) => setTimeout(resolve, everyMs));
  }
}

export { codeOf, refusal } from "./refusals.js";

/** Sets a bearer token on every call. */
export const withToken =
  (token: string): Interceptor =>
  (next) =>
  (req) => {
    for (const [k, v] of Object.entries(bearer(token))) req.header.set(k, v);
    return next(req);
  };

/** One HTTP/2 connection to a daemon (gRPC over connect-node); every client made on it shares it. */
export class Connection {
  readonly #session: Http2SessionManager;
  readonly transport: Transport;

  /** With `token`, every call sends it; otherwise calls pass their own headers. */
  constructor(address: string, opts: { token?: string; interceptors?: Interceptor[] } = {}) {
    const baseUrl = `http://${address}`;
    this.#session = new Http2SessionManager(baseUrl);
    const interceptors = [...(opts.token === undefined ? [] : [withToken(opts.token)]), ...(opts.interceptors ?? [])];
    this.transport = createGrpcTransport({ baseUrl, sessionManager: this.#session, interceptors });
  }

  client<S extends DescService>(service: S): Client<S> {
    return createClient(service, this.transport);
  }

  close(): void {
    this.#session.abort();
  }
}

/** A client of one service on a connection of its own; `call` carries the bearer header for `token`. */
export class Session<S extends DescService> {
  readonly #conn: Connection;
  readonly client: Client<S>;
  readonly call: { headers: Record<string, string> };

  constructor(address: string, service: S, token: string) {
    this.#conn = new Connection(address);
    this.client = this.#conn.client(service);
    this.call = { headers: bearer(token) };
  }

  close(): void {
    this.#conn.close();
  }
}

/** What a test file opened: taken down after its tests, the last opened first. */
export class Closers {
  readonly #fns: (() => unknown)[] = [];

  /** Closes `x` with the rest; returns it. */
  add<T extends { close(): unknown }>(x: T): T {
    this.#fns.push(() => x.close());
    return x;
  }

  /** Runs `fn` with the rest. */
  defer(fn: () => unknown): void {
    this.#fns.push(fn);
  }

  /** Runs every closer, even after one failed; then fails with the first failure. */
  async closeAll(): Promise<void> {
    const failures: unknown[] = [];
    for (const f of this.#fns.splice(0).reverse())
      await Promise.resolve()
        .then(f)
        .catch((err: unknown) => failures.push(err));
    if (failures.length > 0) throw failures[0];
  }
}

const notYet = (what: string): never => {
  throw new Error(`${what} is set up in beforeAll: use it inside a test or a hook`);
};

/** A migrated schema of the file's own (see useTestDb), and what runs on it. */
export interface DbFixture {
  readonly db: TestDb;
  /** Taken down after the file's tests (connections before the daemons they talk to). */
  readonly closers: Closers;
  /** Starts a daemon on the file's schema; it is stopped after the file's tests. */
  startDaemon(opts?: Omit<TestDaemonOptions, "schema">): Promise<Daemon>;
  /** A client of `service` at `address` on a connection of its own (sending `token` on every call when given), closed after the file's tests. */
  clientAt<S extends DescService>(address: string, service: S, token?: string): Client<S>;
}

export interface TestDbOptions {
  /** The table prefix (default aiflow_). */
  prefix?: string;
  /** false: the schema is left empty, for a daemon to migrate when it starts. */
  migrate?: boolean;
}

/** Before the file's tests: a migrated schema of its own. After them: what it opened, then the schema. */
export function useTestDb(label: string, opts: TestDbOptions = {}): DbFixture {
  let db: TestDb | undefined;
  const closers = new Closers();
  beforeAll(async () => {
    db = await createTestDb({ label, prefix: opts.prefix, migrate: opts.migrate });
  });
  afterAll(async () => {
    try {
      await closers.closeAll();
    } finally {
      await db?.drop();
    }
  });
  const fixture: DbFixture = {
    get db() {
      return db ?? notYet("the test database");
    },
    closers,
    async startDaemon(o = {}) {
      const daemon = await startTestDaemon({ prefix: opts.prefix, ...o, schema: fixture.db.schema });
      closers.defer(() => daemon.stop());
      return daemon;
    },
    clientAt(address, service, token) {
      return closers.add(new Connection(address, { token })).client(service);
    },
  };
  return fixture;
}

export interface DaemonFixture extends DbFixture {
  readonly daemon: Daemon;
  /** The daemon's host:port. */
  readonly address: string;
  /** A client of `service` on a connection of its own to the daemon (sending `token` on every call when given), closed after the file's tests. */
  client<S extends DescService>(service: S, token?: string): Client<S>;
}

export interface DaemonFixtureOptions extends Omit<TestDaemonOptions, "schema" | "config">, Pick<TestDbOptions, "migrate"> {
  /** Names the schema (`<label>_<random>`). */
  label: string;
  /** The daemon's configuration; a function is called when the daemon starts. */
  config?: TestDaemonOptions["config"] | (() => TestDaemonOptions["config"]);
}

/** Before the file's tests: a migrated schema of its own and a daemon on it; both gone after them. */
export function useTestDaemon(opts: DaemonFixtureOptions): DaemonFixture {
  const { label, config, migrate, ...rest } = opts;
  const base = useTestDb(label, { prefix: opts.prefix, migrate });
  let daemon: Daemon | undefined;
  beforeAll(async () => {
    daemon = await base.startDaemon({ ...rest, config: typeof config === "function" ? config() : config });
  });
  return {
    get db() {
      return base.db;
    },
    closers: base.closers,
    startDaemon: base.startDaemon,
    clientAt: base.clientAt,
    get daemon() {
      return daemon ?? notYet("the test daemon");
    },
    get address() {
      return (daemon ?? notYet("the test daemon")).address;
    },
    client(service, token) {
      return base.clientAt((daemon ?? notYet("the test daemon")).address, service, token);
    },
  };
}

export interface ClusterOptions extends TestDbOptions, Pick<TestDaemonOptions, "clock"> {
  /** The daemons' instance ids: one daemon each, on the file's schema, started in this order. */
  instances: readonly string[];
  /** Each daemon's configuration but its instance id: the same for all, or made from the id. */
  config?: TestDaemonOptions["config"] | ((instanceId: string) => TestDaemonOptions["config"]);
  /** Each daemon's logger (silent when not given). */
  log?: (instanceId: string) => TestDaemonOptions["log"];
}

export interface ClusterFixture extends DbFixture {
  /** The daemons, in the order of `instances`. */
  readonly daemons: readonly [Daemon, Daemon, ...Daemon[]];
}

/**
 * Before the file's tests: a migrated schema of its own and a daemon for each of `instances` on it
 * (a cluster: one database, several daemons, a clock they may share); all gone after them.
 */
export function useTestCluster(label: string, opts: ClusterOptions): ClusterFixture {
  const { instances, clock, config, log, ...dbOpts } = opts;
  if (instances.length < 2) throw new Error("a cluster has two daemons at least");
  const base = useTestDb(label, dbOpts);
  const daemons: Daemon[] = [];
  beforeAll(async () => {
    for (const instanceId of instances) {
      const own = typeof config === "function" ? config(instanceId) : config;
      daemons.push(await base.startDaemon({ clock, log: log?.(instanceId), config: { ...own, instanceId } }));
    }
  });
  return {
    get db() {
      return base.db;
    },
    closers: base.closers,
    startDaemon: base.startDaemon,
    clientAt: base.clientAt,
    get daemons() {
      if (daemons.length < instances.length) notYet("the cluster's daemons");
      return daemons as unknown as readonly [Daemon, Daemon, ...Daemon[]];
    },
  };
}
