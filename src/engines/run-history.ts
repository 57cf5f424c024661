/**
 * The bound on a run's step list: a graph run's `path`, a state machine's `history`. Each save
 * rewrites the run's row, so a list that grew with every step made every step dearer. A run keeps
 * its latest --run-history-max entries and counts those it dropped from the front.
 *
 * What must stay true: dropped + the list's length is every entry the run ever appended, and the
 * list is the latest of them in order; so entry i of the whole walk (from 0) is list[i - dropped]
 * while i >= dropped.
 */

/** Drops entries from the front of `list` until it holds at most `max`; returns how many it dropped. */
export function keepLatest(list: unknown[], max: number): number {
  const over = list.length - max;
  if (over <= 0) return 0;
  list.splice(0, over);
  return over;
}
