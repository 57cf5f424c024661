/**
 * The standard gRPC health service (grpc.health.v1.Health), so stock probes — grpc_health_probe,
 * Kubernetes gRPC liveness/readiness probes, load balancers — can check aiflowd without knowing its API.
 * Semantics follow https://github.com/grpc/grpc/blob/master/doc/health-checking.md.
 */
import type { ConnectRouter, HandlerContext } from "@connectrpc/connect";
import { Code, ConnectError } from "@connectrpc/connect";
import { Health, HealthCheckResponse_ServingStatus as ServingStatus } from "@aiflow/wire/gen/grpc/health/v1/health_pb.js";

/** Told about every status change, and once when the state shuts down (after which nothing more is sent). */
export interface HealthListener {
  change(service: string, status: ServingStatus): void;
  shutdown(): void;
}

/**
 * Serving status per service name; "" is the server as a whole. Owned by the daemon, read by the RPCs.
 * Push-based (listeners) rather than polled, so Watch answers the moment something changes.
 */
export class HealthState {
  readonly #statuses = new Map<string, ServingStatus>();
  readonly #listeners = new Set<HealthListener>();
  #shutDown = false;

  /** Like grpc-go, the overall server starts SERVING unless told otherwise. */
  constructor(overall: ServingStatus = ServingStatus.SERVING) {
    this.#statuses.set("", overall);
  }

  /**
   * Ignored after shutdown(): a draining server must not flip back to SERVING because some component
   * reported in late — that would pull traffic back to a process that is going away.
   */
  set(service: string, status: ServingStatus): void {
    if (this.#shutDown) return;
    this.#update(service, status);
  }

  /** undefined means the service was never registered (Check turns that into NOT_FOUND). */
  get(service: string): ServingStatus | undefined {
    return this.#statuses.get(service);
  }

  all(): ReadonlyMap<string, ServingStatus> {
    return new Map(this.#statuses);
  }

  get isShutDown(): boolean {
    return this.#shutDown;
  }

  /** Marks everything NOT_SERVING (so watchers see it) and then ends every Watch stream. Idempotent. */
  shutdown(): void {
    if (this.#shutDown) return;
    this.#shutDown = true;
    for (const service of this.#statuses.keys()) this.#update(service, ServingStatus.NOT_SERVING);
    for (const listener of [...this.#listeners]) listener.shutdown();
    this.#listeners.clear();
  }

  /** Returns the unsubscribe function. Subscribing after shutdown gets an immediate shutdown() call. */
  subscribe(listener: HealthListener): () => void {
    if (this.#shutDown) {
      listener.shutdown();
      return () => {};
    }
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }

  #update(service: string, status: ServingStatus): void {
    if (this.#statuses.get(service) === status) return;
    this.#statuses.set(service, status);
    // Copy: a listener may unsubscribe itself while we iterate.
    for (const listener of [...this.#listeners]) listener.change(service, status);
  }
}

/**
 * The status of one service as a stream: the current value at once (SERVICE_UNKNOWN if unregistered),
 * then each distinct new value. Changes that arrive while the consumer is slow are coalesced to the
 * latest, which the health spec allows. Ends on shutdown (after yielding NOT_SERVING) or on abort.
 */
export async function* watchHealth(state: HealthState, service: string, signal: AbortSignal): AsyncGenerator<ServingStatus, void, undefined> {
  let latest = state.get(service) ?? ServingStatus.SERVICE_UNKNOWN;
  let sent: ServingStatus | undefined;
  let ended = false;
  let wake: (() => void) | undefined;
  const poke = () => {
    wake?.();
    wake = undefined;
  };
  const unsubscribe = state.subscribe({
    change(changed, status) {
      if (changed !== service) return;
      latest = status;
      poke();
    },
    shutdown() {
      ended = true;
      poke();
    },
  });
  // Without this the generator would sit on its promise forever after the client disconnects.
  signal.addEventListener("abort", poke, { once: true });
  try {
    for (;;) {
      if (signal.aborted) return;
      if (latest !== sent) {
        sent = latest;
        yield latest;
        // Re-check before honouring `ended`: shutdown's NOT_SERVING may have landed while we were suspended.
        continue;
      }
      if (ended) return;
      await new Promise<void>((resolve) => (wake = resolve));
    }
  } finally {
    unsubscribe();
    signal.removeEventListener("abort", poke);
  }
}

export function healthRoutes(state: HealthState): (router: ConnectRouter) => void {
  return (router) =>
    router.service(Health, {
      check(req) {
        const status = state.get(req.service);
        if (status === undefined) throw new ConnectError(`unknown service "${req.service}"`, Code.NotFound);
        return { status };
      },
      list() {
        const statuses: Record<string, { status: ServingStatus }> = {};
        for (const [service, status] of state.all()) statuses[service] = { status };
        return { statuses };
      },
      async *watch(req, ctx) {
        for await (const status of watchHealth(state, req.service, ctx.signal)) yield { status };
      },
    });
}

/**
 * Ends every Health.Watch stream `maxLifetimeMs` after it began, cleanly (status OK): a watcher
 * watches again, as the health-checking spec has clients do when a stream ends, and a client that
 * opened watches and walked away holds them for at most this long. Wraps the routes (the health
 * service is mounted with the others) rather than the service, so the lifetime is the server's setting.
 */
export function limitWatchLifetime(routes: (router: ConnectRouter) => void, maxLifetimeMs: number): (router: ConnectRouter) => void {
  return (router) =>
    routes(
      Object.assign(Object.create(router) as ConnectRouter, {
        service(...args: Parameters<ConnectRouter["service"]>) {
          const [service, impl, opts] = args;
          if (service.typeName !== Health.typeName || typeof (impl as { watch?: unknown }).watch !== "function") return router.service(...args);
          const watch = (impl as unknown as { watch: (req: unknown, ctx: HandlerContext) => AsyncIterable<unknown> }).watch.bind(impl);
          const limited = {
            ...impl,
            async *watch(req: unknown, ctx: HandlerContext) {
              // A timer of our own, not AbortSignal.timeout: a timeout signal that only a composite
              // signal refers to may be collected before it fires, and the watch would never end.
              const lifetime = new AbortController();
              const timer = setTimeout(() => lifetime.abort(new DOMException("the watch reached --health-watch-lifetime", "TimeoutError")), maxLifetimeMs);
              timer.unref();
              try {
                const signal = AbortSignal.any([ctx.signal, lifetime.signal]);
                yield* watch(req, Object.create(ctx, { signal: { value: signal } }) as HandlerContext);
              } finally {
                clearTimeout(timer);
              }
            },
          };
          return router.service(service, limited as never, opts);
        },
      }),
    );
}
