/**
 * The opt-in SIGTERM/SIGINT handling: the first signal drains; a second one exits the process at
 * once, with 128 + the signal's number (130 for SIGINT, 143 for SIGTERM) as a shell reports a
 * process a signal killed. The second signal is the operator's way out of a drain that takes too
 * long, whatever it waits for, so it must not go through the drain's machinery: it logs one line
 * and exits, leaving whatever still runs to the daemon (its leases expire, and the daemon marks
 * the agent inactive once its heartbeats stop).
 */
import { constants } from "node:os";
import type { Logger } from "pino";

const SIGNALS: readonly NodeJS.Signals[] = ["SIGTERM", "SIGINT"];

/** Where the signals come from and how the process exits: the process itself, or a test's stand-ins. */
export interface SignalTarget {
  on(signal: NodeJS.Signals, handler: (signal: NodeJS.Signals) => void): unknown;
  off(signal: NodeJS.Signals, handler: (signal: NodeJS.Signals) => void): unknown;
  exit(code: number): void;
}

/** The exit status for a process ended by `signal`. */
export const exitCodeFor = (signal: NodeJS.Signals) => 128 + (constants.signals[signal] ?? 0);

/** Installs the handlers; returns the function that removes them. */
export function onShutdownSignals(drain: (signal: NodeJS.Signals) => void, log: Logger, target: SignalTarget = process): () => void {
  let received = 0;
  const handler = (signal: NodeJS.Signals) => {
    if (received++ === 0) return drain(signal);
    const code = exitCodeFor(signal);
    log.warn({ signal, exitCode: code }, "second signal: exiting at once, without finishing the drain");
    target.exit(code);
  };
  for (const s of SIGNALS) target.on(s, handler);
  return () => {
    for (const s of SIGNALS) target.off(s, handler);
  };
}
