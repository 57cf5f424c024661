/**
 * How the fleet recovers from a fault, read from the database while it happens: the first item
 * completed after the fault was lifted, when the completion rate (items completed over the last
 * 1 s, by completed_at) is back to half of what it was before the fault, and when
 * every agent is active again. A fault after which nothing completed within the timeout while work
 * was open (or still coming) is unrecovered, which fails the run.
 */
import type pg from "pg";

export type Query = <T extends pg.QueryResultRow>(text: string) => Promise<T[] | undefined>;

const RATE_WINDOW_MS = 1000;
/**
 * How long after the first completion the rate is waited for. The rate before can be a backlog's
 * burst that the offered load after the fault never matches; a rate not back by then is left null
 * (a figure, not a failure), so that it does not hold up the schedule.
 */
const RATE_WAIT_MS = 5000;
const ns = (ms: number) => BigInt(Math.round(ms)) * 1_000_000n;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/**
 * The completion rate before `at`: the median of the five 1 s windows before it (a median, so that
 * a backlog's burst after the previous fault does not set it); null while Postgres does not answer.
 */
export async function rateBefore(query: Query, at: number): Promise<number | null> {
  const windows = 5;
  const r = await query<{ w: number; n: string }>(
    `SELECT floor((${ns(at)} - completed_at) / ${ns(RATE_WINDOW_MS)})::int AS w, count(*) AS n FROM aiflow_work_item
      WHERE completed_at >= ${ns(at - windows * RATE_WINDOW_MS)} AND completed_at < ${ns(at)} GROUP BY 1`,
  );
  if (!r) return null;
  const counts = Array.from({ length: windows }, (_, w) => Number(r.find((x) => x.w === w)?.n ?? 0)).sort((a, b) => a - b);
  return counts[Math.floor(windows / 2)]!;
}

export interface Recovery {
  /** From the fault to its lift (the outage, the restart). */
  downMs: number;
  /** Items completed a second before the fault (the median of five 1 s windows). */
  rateBefore: number | null;
  /** From the lift to the first completion after it (by the row's completed_at). */
  firstCompletionMs: number | null;
  /** From the lift to when a second's completions are back to half the rate before (at least one); null: not within 5 s of the first completion. */
  rateHalfMs: number | null;
  /** From the lift to every agent active again. */
  allAgentsActiveMs: number | null;
  /** Nothing was left to do (every item enqueued and finished) before anything completed: nothing to measure. */
  nothingLeft: boolean;
  /** No completion within the timeout while work was open or still coming. */
  unrecovered: boolean;
  /** Items pending or dispatched at the last look. */
  open: number;
}

export async function recovery(
  query: Query,
  o: { agents: number; faultAt: number; liftedAt: number; timeoutMs: number; rateBefore: number | null; producing: () => boolean },
): Promise<Recovery> {
  const need = Math.max(1, Math.ceil((o.rateBefore ?? 0) / 2));
  let firstCompletionMs: number | null = null;
  let rateHalfMs: number | null = null;
  let allAgentsActiveMs: number | null = null;
  let nothingLeft = false;
  let open = -1;
  const deadline = o.liftedAt + o.timeoutMs;
  while (Date.now() < deadline) {
    const now = Date.now();
    const r = await query<{ first: string | null; recent: string; active: string; open: string }>(
      `SELECT (SELECT min(completed_at) FROM aiflow_work_item WHERE completed_at > ${ns(o.liftedAt)}) AS first,
              (SELECT count(*) FROM aiflow_work_item WHERE completed_at >= ${ns(Math.max(o.liftedAt, now - RATE_WINDOW_MS))}) AS recent,
              (SELECT count(*) FROM aiflow_agent WHERE status = 'active') AS active,
              (SELECT count(*) FROM aiflow_work_item WHERE status IN ('pending', 'dispatched')) AS open`,
    );
    if (r) {
      const row = r[0]!;
      open = Number(row.open);
      if (firstCompletionMs === null && row.first !== null) firstCompletionMs = Math.max(0, Number(BigInt(row.first) / 1_000_000n) - o.liftedAt);
      if (rateHalfMs === null && Number(row.recent) >= need) rateHalfMs = now - o.liftedAt;
      if (allAgentsActiveMs === null && Number(row.active) >= o.agents) allAgentsActiveMs = now - o.liftedAt;
      const rateSettled = rateHalfMs !== null || (firstCompletionMs !== null && now - o.liftedAt > firstCompletionMs + RATE_WAIT_MS);
      if (firstCompletionMs !== null && rateSettled && allAgentsActiveMs !== null) break;
      // Everything enqueued is finished: no completion is coming, and none is owed.
      if (open === 0 && !o.producing()) {
        nothingLeft = firstCompletionMs === null;
        if (allAgentsActiveMs !== null) break;
      }
    }
    await sleep(50);
  }
  return {
    downMs: o.liftedAt - o.faultAt,
    rateBefore: o.rateBefore,
    firstCompletionMs,
    rateHalfMs,
    allAgentsActiveMs,
    nothingLeft,
    unrecovered: firstCompletionMs === null && !nothingLeft,
    open,
  };
}

export interface KindRecovery {
  count: number;
  unrecovered: number;
  /** The slowest of the kind's faults (null: one of them never got there). */
  maxDownMs: number | null;
  maxFirstCompletionMs: number | null;
  maxRateHalfMs: number | null;
  maxAllAgentsActiveMs: number | null;
  /** Faults of the kind that found nothing left to do, so measured nothing. */
  nothingLeft: number;
}

/** Per fault kind, the slowest recovery of its faults (those with nothing left to do measured nothing). */
export function byKind(kinds: readonly string[], rs: readonly (Recovery & { kind: string })[]): Record<string, KindRecovery> {
  return Object.fromEntries(
    kinds.map((k) => {
      const of = rs.filter((r) => r.kind === k);
      const measured = of.filter((r) => !r.nothingLeft);
      const max = (f: (r: Recovery) => number | null) =>
        measured.length === 0 || measured.some((r) => f(r) === null) ? null : Math.max(...measured.map((r) => f(r)!));
      return [
        k,
        {
          count: of.length,
          unrecovered: of.filter((r) => r.unrecovered).length,
          maxDownMs: of.length === 0 ? null : Math.max(...of.map((r) => r.downMs)),
          maxFirstCompletionMs: max((r) => r.firstCompletionMs),
          maxRateHalfMs: max((r) => r.rateHalfMs),
          maxAllAgentsActiveMs: max((r) => r.allAgentsActiveMs),
          nothingLeft: of.length - measured.length,
        },
      ];
    }),
  );
}
