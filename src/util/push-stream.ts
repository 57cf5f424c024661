import { onAbort } from "./on-abort.js";

/**
 * Turns a push subscription into an async generator for a server stream: values are queued as they
 * arrive and the generator ends when any of the signals aborts (client gone, daemon shutting down).
 */
export async function* pushStream<T>(subscribe: (push: (value: T) => void) => () => void, signals: readonly AbortSignal[]): AsyncGenerator<T> {
  const queue: T[] = [];
  let wake: (() => void) | undefined;
  const poke = () => {
    wake?.();
    wake = undefined;
  };
  const unsubscribe = subscribe((v) => {
    queue.push(v);
    poke();
  });
  const offs = signals.map((s) => onAbort(s, poke));
  try {
    for (;;) {
      while (queue.length > 0) yield queue.shift()!;
      if (signals.some((s) => s.aborted)) return;
      await new Promise<void>((r) => (wake = r));
    }
  } finally {
    unsubscribe();
    for (const off of offs) off();
  }
}
