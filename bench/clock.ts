/** Wall-clock milliseconds with sub-millisecond precision, comparable across processes on one machine. */
export const nowMs = (): number => performance.timeOrigin + performance.now();
