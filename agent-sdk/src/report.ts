/**
 * The one report an item's run makes, which the reporter sends and the tracing span records; its own
 * module so that the run (./run.ts) and the spans (./tracing.ts) both depend on it, not on each other.
 */

/** What to tell the daemon about an item. */
export type Report =
  | { kind: "complete"; id: string; token: string; resultJson: string }
  | { kind: "fail"; id: string; token: string; error: string; retryable: boolean; retryDelayMs: number | undefined }
  /** `drainDeadline`: given back because a drain deadline passed (the daemon counts it in the drain's result). */
  | { kind: "release"; id: string; token: string; drainDeadline?: boolean };
