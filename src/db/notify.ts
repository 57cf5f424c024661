/**
 * LISTEN/NOTIFY. One dedicated connection per daemon listens on every channel anyone subscribed to;
 * it reconnects with backoff when the database drops it, and then calls `onReconnect` handlers,
 * because notifications sent while it was away are lost and waiters must re-check the tables.
 *
 * A listening connection only reads, so one that went silent (a failover that left the old address
 * unanswered, a middlebox that dropped the flow, a server that hangs) would never fail by itself and
 * the daemon would hear nothing more, ever. It is pinged: a `SELECT 1` unanswered within the timeout
 * ends the connection, and the reconnect above follows.
 */
import { setTimeout as sleep } from "node:timers/promises";
import pg from "pg";
import { sql, type DatabasePool } from "slonik";
import type { Logger } from "../log.js";

type Handler = (payload: string) => void;

export interface ListenerOptions {
  /** The first reconnect's delay; each next one doubles, up to 5 s. */
  firstRetryMs?: number;
  /** How often the listening connection is checked for an answer. */
  pingEveryMs?: number;
  /** How long a check may go unanswered before the connection is given up and replaced. */
  pingTimeoutMs?: number;
}

export class PgListener {
  readonly #handlers = new Map<string, Set<Handler>>();
  readonly #reconnectHandlers = new Set<() => void>();
  #client: pg.Client | undefined;
  /** Aborted by stop(): no more reconnecting, and a reconnect's wait ends at once rather than after its backoff. */
  readonly #stop = new AbortController();
  #connecting: Promise<void> | undefined;

  readonly #firstRetryMs: number;
  readonly #pingEveryMs: number;
  readonly #pingTimeoutMs: number;

  constructor(
    private readonly url: string,
    private readonly log: Logger,
    opts: ListenerOptions = {},
  ) {
    this.#firstRetryMs = opts.firstRetryMs ?? 100;
    this.#pingEveryMs = opts.pingEveryMs ?? 15_000;
    this.#pingTimeoutMs = opts.pingTimeoutMs ?? 10_000;
  }

  async start(): Promise<void> {
    await this.#connect();
  }

  /** The listening connection is up (false while it is being made again, and after stop()). */
  get connected(): boolean {
    return this.#client !== undefined;
  }

  /** Subscribes to a channel; returns the unsubscribe function. */
  async on(channel: string, handler: Handler): Promise<() => void> {
    let set = this.#handlers.get(channel);
    if (!set) {
      set = new Set();
      this.#handlers.set(channel, set);
      await this.#client?.query(`LISTEN ${pg.escapeIdentifier(channel)}`);
    }
    set.add(handler);
    return () => set.delete(handler);
  }

  /** Called after the listening connection was re-established: notifications may have been missed. */
  onReconnect(handler: () => void): () => void {
    this.#reconnectHandlers.add(handler);
    return () => this.#reconnectHandlers.delete(handler);
  }

  async stop(): Promise<void> {
    this.#stop.abort();
    await this.#connecting?.catch(() => {});
    await this.#client?.end().catch(() => {});
    this.#client = undefined;
  }

  #connect(): Promise<void> {
    return (this.#connecting ??= (async () => {
      let delay = this.#firstRetryMs;
      for (;;) {
        if (this.#stop.signal.aborted) return;
        const client = new pg.Client({ connectionString: this.url, application_name: "aiflowd-listen" });
        try {
          await client.connect();
          client.on("notification", (n) => {
            for (const h of this.#handlers.get(n.channel) ?? []) {
              try {
                h(n.payload ?? "");
              } catch (err) {
                this.log.error({ err, channel: n.channel }, "notification handler failed");
              }
            }
          });
          client.on("error", (err) => this.log.warn({ err: err.message }, "listen connection error"));
          client.on("end", () => this.#lost(client));
          for (const channel of this.#handlers.keys()) await client.query(`LISTEN ${pg.escapeIdentifier(channel)}`);
          this.#client = client;
          this.#watch(client);
          return;
        } catch (err) {
          await client.end().catch(() => {});
          if (this.#stop.signal.aborted) return;
          this.log.warn({ err: (err as Error).message, retryInMs: delay }, "listen connection failed, retrying");
          await sleep(delay, undefined, { signal: this.#stop.signal }).catch(() => {});
          delay = Math.min(delay * 2, Math.max(5_000, this.#firstRetryMs));
        }
      }
    })().finally(() => (this.#connecting = undefined)));
  }

  /** Pings the listening connection until it ends; one that does not answer in time is destroyed (then #lost). */
  #watch(client: pg.Client): void {
    let pending = false;
    const timer = setInterval(() => {
      if (this.#client !== client) return clearInterval(timer);
      if (pending) return;
      pending = true;
      const deadline = setTimeout(() => {
        this.log.warn({ timeoutMs: this.#pingTimeoutMs }, "listen connection stopped answering, replacing it");
        client.connection.stream.destroy();
      }, this.#pingTimeoutMs);
      // A failed ping means the connection ended (then "end" reconnects and this timer stops).
      client
        .query("SELECT 1")
        .catch(() => {})
        .finally(() => {
          pending = false;
          clearTimeout(deadline);
        });
    }, this.#pingEveryMs);
    timer.unref();
    client.once("end", () => clearInterval(timer));
  }

  #lost(client: pg.Client): void {
    if (this.#stop.signal.aborted || this.#client !== client) return;
    this.#client = undefined;
    this.log.warn("listen connection lost, reconnecting");
    void this.#connect().then(() => {
      for (const h of this.#reconnectHandlers) h();
    });
  }
}

export async function notify(pool: DatabasePool, channel: string, payload: string): Promise<void> {
  await pool.query(sql.unsafe`SELECT pg_notify(${channel}, ${payload})`);
}
