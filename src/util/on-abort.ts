/**
 * Abort listeners that cost a shared signal one listener, however many wait on it. Every long-poll
 * claim, Wait call and directive stream waits on the daemon's one shutdown signal; as a listener
 * each, a few dozen connected agents trip Node's MaxListenersExceededWarning (a leak's symptom, and
 * noise in every daemon's log). Here a signal gets one real listener, which calls the callbacks
 * registered for it; the function `onAbort` returns unregisters one, and the real listener goes
 * with the last.
 */
interface Listeners {
  fns: Set<() => void>;
  fire: () => void;
}

const bySignal = new WeakMap<AbortSignal, Listeners>();

/** Calls `fn` once when `signal` aborts (not at all if it already has); returns the unregister. */
export function onAbort(signal: AbortSignal, fn: () => void): () => void {
  let l = bySignal.get(signal);
  if (!l) {
    const fns = new Set<() => void>();
    const fire = () => {
      bySignal.delete(signal);
      for (const f of [...fns]) f();
      fns.clear();
    };
    l = { fns, fire };
    bySignal.set(signal, l);
    signal.addEventListener("abort", fire, { once: true });
  }
  // A registration of its own, so that one function registered twice is called twice.
  const entry = () => fn();
  const listeners = l;
  listeners.fns.add(entry);
  return () => {
    if (!listeners.fns.delete(entry) || listeners.fns.size > 0) return;
    if (bySignal.get(signal) === listeners) bySignal.delete(signal);
    signal.removeEventListener("abort", listeners.fire);
  };
}
