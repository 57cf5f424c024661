/**
 * What the run services (DagService, GraphService, MachineService) share: the caller's scope (tenant
 * checked against the token), run ids, the source of a run's definition (inline or stored), keyset
 * pages of the caller's runs, newest first, and the WatchRun loop.
 */
import type { HandlerContext } from "@connectrpc/connect";
import { z } from "zod";
import { invalidArgument } from "../domain/errors.js";
import type { Scope } from "../engines/engine.js";
import type { RunWatch } from "../engines/run-watch.js";
import type { RunCursor } from "../store/owned-runs.js";
import { assertTenant, callerOf } from "./caller.js";
import { onAbort } from "../util/on-abort.js";
import { decodeCursor, encodeCursor } from "./input/page-tokens.js";
import { identifier, optionalText } from "../domain/input.js";

const PAGE_DEFAULT = 50;
const PAGE_MAX = 500;
const listCursor = z.object({ u: z.string().regex(/^\d{1,19}$/), i: z.string().max(64), q: z.string() });

export function scopeOf(tenantRaw: string, ctx: HandlerContext): Scope {
  const caller = callerOf(ctx);
  const tenantKey = identifier(tenantRaw, "tenant_key");
  assertTenant(caller, tenantKey);
  return { by: caller.principal, tenantKey };
}

export const runIdOf = (raw: string) => identifier(raw, "run_id");

/** A StartRun's plan: of its inline definition, or of the stored one it names. */
export async function planFrom<D, P>(
  source: { case: "definition"; value: D } | { case: "definitionId"; value: string } | { case: undefined; value?: undefined },
  inline: (def: D) => P,
  stored: (id: string) => Promise<P>,
): Promise<P> {
  if (source.case === "definition") return inline(source.value);
  if (source.case === "definitionId") {
    const id = optionalText(source.value, "definition_id", 256);
    if (!id) throw invalidArgument("definition_id", "is required");
    return stored(id);
  }
  throw invalidArgument("source", "give a definition or a definition_id");
}

/**
 * One page of the caller's runs, read by `read(cursor, limit)`, and the token of the next. `query`
 * is what the list is of (tenant, filters): a token names it, and one issued for another is refused.
 */
export async function pageOf<R extends RunCursor>(
  req: { pageSize: number; pageToken: string },
  query: readonly unknown[],
  read: (cursor: RunCursor | null, limit: number) => Promise<readonly R[]>,
): Promise<{ rows: readonly R[]; nextPageToken: string }> {
  if (req.pageSize < 0) throw invalidArgument("page_size", `${req.pageSize} is negative`);
  const size = Math.min(req.pageSize || PAGE_DEFAULT, PAGE_MAX);
  const q = JSON.stringify(query);
  const cursor = req.pageToken ? decodeCursor(req.pageToken, listCursor) : null;
  if (cursor && cursor.q !== q) throw invalidArgument("page_token", "was issued for a different tenant or different filters");
  const rows = await read(cursor && { createdUs: BigInt(cursor.u), id: cursor.i }, size + 1);
  const page = rows.slice(0, size);
  const last = page.at(-1);
  return { rows: page, nextPageToken: rows.length > size && last ? encodeCursor({ u: last.createdUs.toString(), i: last.id, q }) : "" };
}

/**
 * A WatchRun stream: the run now, then again after every save (on any daemon) until `ended` says it
 * is over or the call or the daemon stops. Saves that come while a message is being read and sent
 * are covered by the next read.
 */
export async function* watchRun<R>(
  watches: Pick<RunWatch, "watch">,
  runId: string,
  read: () => Promise<R>,
  ended: (r: R) => boolean,
  signals: readonly AbortSignal[],
): AsyncGenerator<R> {
  let changed = true;
  let wake: (() => void) | undefined;
  const unwatch = watches.watch(runId, () => {
    changed = true;
    wake?.();
  });
  const stops = signals.map((signal) => onAbort(signal, () => wake?.()));
  const stopped = () => signals.some((s) => s.aborted);
  try {
    for (;;) {
      if (changed) {
        changed = false;
        const run = await read();
        yield run;
        if (ended(run)) return;
      }
      if (stopped()) return;
      await new Promise<void>((resolve) => (changed || stopped() ? resolve() : (wake = resolve)));
      wake = undefined;
    }
  } finally {
    unwatch();
    for (const stop of stops) stop();
  }
}
