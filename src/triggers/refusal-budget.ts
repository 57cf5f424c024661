/**
 * How many refusals of deliveries that proved nothing this daemon writes to the firing log: at most
 * REFUSALS_RECORDED_PER_MINUTE per key a minute (fixed windows on the injected clock), the key being
 * a known trigger, or a tenant for all its unknown trigger names (an attacker picks a new name per
 * request, so names cannot be the key). Past it a refusal is answered and counted, not stored, and
 * logged once per key and window with how many the window held back.
 *
 * Why per key and not per address: an address throttle (../server/auth-failures.ts) is escaped by
 * holding many addresses; this bound holds whoever sends. With the 30-day retention a trigger's
 * refusals can occupy at most REFUSALS_RECORDED_PER_MINUTE × minutes kept rows of about a KiB
 * (./payload.ts), per daemon.
 *
 * The map holds one entry per key that refused this window; keys are triggers and tenants that exist
 * (an unserved tenant is never recorded, so never a key), and past MAX_KEYS expired windows are
 * dropped, then the oldest, so memory stays bounded whatever arrives.
 */
import type { Clock } from "../clock.js";
import type { Logger } from "../log.js";

export const REFUSALS_RECORDED_PER_MINUTE = 10;
const WINDOW_MS = 60_000;
const MAX_KEYS = 50_000;

interface Window {
  startMs: number;
  recorded: number;
  dropped: number;
}

export class RefusalBudget {
  readonly #windows = new Map<string, Window>();

  constructor(
    private readonly clock: Clock,
    private readonly log: Logger,
    private readonly perMinute = REFUSALS_RECORDED_PER_MINUTE,
  ) {}

  /** True when a refusal under `key` may be written now (and counts it); false: count it, do not store it. */
  take(key: { tenantKey: string; trigger: string | null }): boolean {
    const id = `${key.tenantKey}\u0000${key.trigger ?? ""}`;
    const now = this.clock.nowMs();
    let w = this.#windows.get(id);
    if (w && now - w.startMs >= WINDOW_MS) {
      this.#close(key, w);
      this.#windows.delete(id);
      w = undefined;
    }
    if (!w) {
      if (this.#windows.size >= MAX_KEYS) this.#prune(now);
      w = { startMs: now, recorded: 0, dropped: 0 };
      this.#windows.set(id, w);
    }
    if (w.recorded < this.perMinute) {
      w.recorded++;
      return true;
    }
    if (w.dropped++ === 0)
      this.log.warn(
        { tenant: key.tenantKey, trigger: key.trigger ?? "(unknown names)", perMinute: this.perMinute },
        'webhook refusals over the firing log\'s limit a minute: further ones this minute are answered and counted (aiflow_webhook_refusals_total{recorded="false"}), not recorded',
      );
    return false;
  }

  #close(key: { tenantKey: string; trigger: string | null }, w: Window): void {
    if (w.dropped > 0)
      this.log.warn(
        { tenant: key.tenantKey, trigger: key.trigger ?? "(unknown names)", dropped: w.dropped },
        "webhook refusals not recorded in the last window",
      );
  }

  #prune(now: number): void {
    for (const [id, w] of this.#windows) if (now - w.startMs >= WINDOW_MS) this.#windows.delete(id);
    if (this.#windows.size >= MAX_KEYS) this.#windows.delete(this.#windows.keys().next().value!);
  }
}
