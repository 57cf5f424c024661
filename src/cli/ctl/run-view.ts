/**
 * How aiflowctl shows DAG runs to people: the list's rows, one run with the tree of its nodes and
 * their attempts, and the progress lines of `run start --wait`. Times on the wire are epoch
 * nanoseconds; they are shown as ISO instants in UTC.
 */
import { timestampMs } from "@bufbuild/protobuf/wkt";
import { AttemptStatus, NodeStatus, RunStatus, type Attempt, type NodeState, type Run } from "@aiflow/wire/gen/aiflow/dag/v1/dag_pb.js";
import { enumName, humanDuration, status, table } from "./format.js";

/** A fan-out node with more attempts than this shows a summary and its failed and running ones. */
export const SUMMARY_OVER = 10;

export const runStatus = (s: RunStatus) => enumName(RunStatus, s, "");
const nodeStatus = (s: NodeStatus) => enumName(NodeStatus, s, "");
const attemptStatus = (s: AttemptStatus) => enumName(AttemptStatus, s, "");

const msOf = (ns: bigint) => Number(ns / 1_000_000n);
const iso = (ns: bigint | undefined) => (ns === undefined ? "-" : new Date(msOf(ns)).toISOString());
const span = (start: bigint | undefined, end: bigint | undefined) =>
  start !== undefined && end !== undefined ? humanDuration(Number(end - start) / 1e6) : "-";

/** How long the run took, or has been going (by this machine's clock) while it runs. */
function runDuration(r: Run): string {
  if (r.duration !== undefined) return humanDuration(Number(r.duration) / 1e6);
  if (r.status === RunStatus.RUNNING && r.startTime !== undefined) return `${humanDuration(Math.max(0, Date.now() - msOf(r.startTime)))} so far`;
  return "-";
}

/** When it started: its start time, else (not started yet) when it was created. */
const started = (r: Run) => (r.startTime !== undefined ? iso(r.startTime) : r.createdOn ? new Date(timestampMs(r.createdOn)).toISOString() : "-");

export function runRows(runs: readonly Run[]): string {
  return table(
    ["ID", "DEFINITION", "STATUS", "STARTED", "DURATION", "REASON"],
    runs.map((r) => [r.id, r.definitionId || "-", status(runStatus(r.status)), started(r), runDuration(r), oneLine(r.reason, 60) || "-"]),
  );
}

const oneLine = (text: string, max: number) => {
  const flat = text.replace(/\s+/g, " ").trim();
  return flat.length > max ? `${flat.slice(0, max - 1)}…` : flat;
};

/** "98 completed, 1 failed, 1 running": attempts counted by status, in the enum's order. */
function counts(attempts: readonly Attempt[]): string {
  const by = new Map<AttemptStatus, number>();
  for (const a of attempts) by.set(a.status, (by.get(a.status) ?? 0) + 1);
  return [...by.entries()]
    .sort(([a], [b]) => a - b)
    .map(([s, n]) => `${n} ${attemptStatus(s)}`)
    .join(", ");
}

const nodeCell = (n: NodeState) => status(nodeStatus(n.status)) + (n.iterations > 0 ? ` ${n.iterationsDone}/${n.iterations}` : "");

/**
 * The run's header, then a table of its nodes in definition order, each followed by its attempts
 * (indented). A fan-out node of more than SUMMARY_OVER attempts shows a line of counts by status and
 * only its failed and running attempts, unless `all`.
 */
export function runTree(r: Run, all: boolean): string {
  const head = [
    `run ${r.id}  definition ${r.definitionId || "-"}  ${status(runStatus(r.status))}  started ${started(r)}` +
      (r.endTime !== undefined ? `  ended ${iso(r.endTime)}` : "") +
      `  took ${runDuration(r)}` +
      (r.createdBy ? `  by ${r.createdBy}` : ""),
    ...(r.reason ? [`reason: ${r.reason}`] : []),
  ];
  if (r.nodes.length === 0) return head.join("\n");
  // Summary lines do not take part in the table's alignment: they go in after it is laid out.
  const rows: string[][] = [];
  const notes = new Map<number, string>();
  for (const n of r.nodes) {
    rows.push([n.name, nodeCell(n), "", "", "", "", oneLine(n.error, 80)]);
    const summarise = !all && n.iterations > 0 && n.attempts.length > SUMMARY_OVER;
    const shown = summarise ? n.attempts.filter((a) => a.status === AttemptStatus.FAILED || a.status === AttemptStatus.RUNNING) : n.attempts;
    if (summarise) {
      const which = shown.length ? `showing the ${shown.length} failed or running` : "none failed or running";
      notes.set(rows.length, `  ${n.attempts.length} attempts: ${counts(n.attempts)}; ${which} (--all: every attempt)`);
    }
    for (const a of shown)
      rows.push([
        `  ${a.name} #${a.attempt}`,
        status(attemptStatus(a.status)),
        a.worker || "-",
        iso(a.startTime),
        iso(a.endTime),
        span(a.startTime, a.endTime),
        oneLine(a.error, 80),
      ]);
  }
  const lines = table(["NODE / ATTEMPT", "STATUS", "WORKER", "STARTED", "ENDED", "DURATION", "ERROR"], rows).split("\n");
  const out = [lines[0]!];
  lines.slice(1).forEach((line, i) => {
    const note = notes.get(i);
    if (note !== undefined) out.push(note);
    out.push(line);
  });
  if (notes.has(rows.length)) out.push(notes.get(rows.length)!);
  return [...head, "", ...out].join("\n");
}

/**
 * The progress lines of one WatchRun message: a line for each node whose status differs from the
 * one `seen` last (a node not seen before counts as pending), and `seen` brought up to date.
 */
export function progressLines(r: Run, seen: Map<string, NodeStatus>): string[] {
  const lines: string[] = [];
  for (const n of r.nodes) {
    if ((seen.get(n.name) ?? NodeStatus.PENDING) !== n.status) lines.push(`${n.name}: ${nodeCell(n)}${n.error ? `: ${oneLine(n.error, 200)}` : ""}`);
    seen.set(n.name, n.status);
  }
  return lines;
}

/** The last line of `run start --wait`: how the run ended. */
export const endLine = (r: Run) => `run ${r.id} ${status(runStatus(r.status))} after ${runDuration(r)}${r.reason ? `: ${r.reason}` : ""}`;
