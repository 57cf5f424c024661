/**
 * A wait with a bound: what `p` settles with, or LATE once `ms` pass first. `p` is not stopped
 * (nothing here can stop it); its outcome is dropped when it comes late, a rejection included.
 * The timer is cleared either way, so a bounded wait never holds the process open.
 */
export const LATE: unique symbol = Symbol("late");

export async function within<T>(p: Promise<T>, ms: number): Promise<T | typeof LATE> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<typeof LATE>((resolve) => (timer = setTimeout(() => resolve(LATE), ms)));
  try {
    return await Promise.race([p, late]);
  } finally {
    clearTimeout(timer);
  }
}
