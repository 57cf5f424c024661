/** Output for people: aligned tables, colour only on a terminal (and never with NO_COLOR). */
export const useColor = () => process.stdout.isTTY === true && !process.env.NO_COLOR;

const CODES = { red: 31, green: 32, yellow: 33, blue: 34, dim: 2, bold: 1 } as const;
export type Color = keyof typeof CODES;

export const paint = (text: string, color: Color) => (useColor() ? `\u001b[${CODES[color]}m${text}\u001b[0m` : text);

const STATUS_COLORS: Record<string, Color> = {
  active: "green",
  completed: "green",
  draining: "yellow",
  dispatched: "blue",
  running: "blue",
  waiting: "yellow",
  pending: "dim",
  queued: "dim",
  skipped: "dim",
  inactive: "red",
  failed: "red",
  cancelled: "dim",
};
export const status = (s: string) => paint(s, STATUS_COLORS[s] ?? "bold");

/** Visible width, ignoring colour escapes. */
const width = (s: string) => s.replace(/\u001b\[[0-9;]*m/g, "").length;

export function table(headers: readonly string[], rows: readonly (readonly string[])[]): string {
  const widths = headers.map((h, c) => Math.max(width(h), ...rows.map((r) => width(r[c] ?? ""))));
  const line = (cells: readonly string[]) =>
    cells
      .map((cell, c) => (c === cells.length - 1 ? cell : cell + " ".repeat(widths[c]! - width(cell))))
      .join("  ")
      .trimEnd();
  return [paint(line(headers), "bold"), ...rows.map(line)].join("\n");
}

export function humanDuration(ms: number): string {
  if (ms < 1000) return `${Math.round(ms)}ms`;
  const s = Math.round(ms / 1000);
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m${s % 60 ? `${s % 60}s` : ""}`;
  return `${Math.floor(s / 3600)}h${Math.floor((s % 3600) / 60)}m`;
}

export const enumName = (e: Record<number, string>, v: number, prefix: string) => (e[v] ?? "UNSPECIFIED").replace(prefix, "").toLowerCase();
