/** The opt-in SIGTERM/SIGINT handling: the first signal drains, a second one stops at once. */

const SIGNALS: readonly NodeJS.Signals[] = ["SIGTERM", "SIGINT"];

/** Installs the handlers; returns the function that removes them. */
export function onShutdownSignals(drain: (signal: NodeJS.Signals) => void, stopNow: (signal: NodeJS.Signals) => void): () => void {
  let received = 0;
  const handler = (signal: NodeJS.Signals) => (received++ === 0 ? drain(signal) : stopNow(signal));
  for (const s of SIGNALS) process.on(s, handler);
  return () => {
    for (const s of SIGNALS) process.off(s, handler);
  };
}
