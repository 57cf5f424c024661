/** Chooses the handler of an item by engine kind and task name (precedence documented on `Handlers`). */
import type { AnyHandler, Handlers, TaskHandlers } from "./types.js";

const WILDCARD = "*";

function fromEntry(entry: AnyHandler | TaskHandlers | undefined, task: string | undefined): AnyHandler | undefined {
  if (entry === undefined) return undefined;
  if (typeof entry === "function") return entry;
  return (task !== undefined ? entry[task] : undefined) ?? entry[WILDCARD];
}

export function resolveHandler(handlers: Handlers, engineKind: string, taskName: string | undefined): AnyHandler | undefined {
  return fromEntry(handlers[engineKind], taskName) ?? fromEntry(handlers[WILDCARD], taskName);
}

/** For the error of an item nothing handles: what this agent does handle, e.g. `dag{resize,*}, test`. */
export function describeHandlers(handlers: Handlers): string {
  return Object.entries(handlers)
    .map(([kind, h]) => (typeof h === "function" ? kind : `${kind}{${Object.keys(h).join(",")}}`))
    .join(", ");
}
