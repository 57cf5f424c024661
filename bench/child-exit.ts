/**
 * How a benchmark child ends: its last line (the figures the parent reads) written out in full, then
 * exit. `console.log` then `process.exit` loses what the pipe has not taken yet: an agent's
 * latencies for a 30 s steady phase are a few hundred KB, and arrived cut short (and unreadable).
 */
export function exitWith(figures: unknown): void {
  process.stdout.write(`${JSON.stringify(figures)}\n`, () => process.exit(0));
}
