/**
 * What every view shares: htm bound to Preact, a polling hook, small SVG charts, a confirmation
 * dialog (the native <dialog>: focus stays in it, Escape closes it), and formats.
 */
import { h, type ComponentChildren } from "preact";
import { useEffect, useRef, useState } from "preact/hooks";
import htm from "htm";
import { messageOf } from "./api.js";

export const html = htm.bind(h);

/** Calls `load` now and every `everyMs` while mounted and the tab is visible; the latest value or error, and a reload. */
export function usePoll<T>(
  load: () => Promise<T>,
  everyMs: number,
  deps: unknown[] = [],
): { data: T | undefined; error: string | undefined; reload: () => void } {
  const [data, setData] = useState<T | undefined>(undefined);
  const [error, setError] = useState<string | undefined>(undefined);
  const [tick, setTick] = useState(0);
  useEffect(() => {
    let live = true;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const run = async () => {
      // A tab nobody looks at costs the daemon nothing: it reads again once shown.
      if (document.hidden) {
        document.addEventListener("visibilitychange", () => live && void run(), { once: true });
        return;
      }
      try {
        const v = await load();
        if (!live) return;
        setData(v);
        setError(undefined);
      } catch (err) {
        if (live) setError(messageOf(err));
      }
      if (live) timer = setTimeout(run, everyMs);
    };
    void run();
    return () => {
      live = false;
      clearTimeout(timer);
    };
  }, [...deps, tick]);
  return { data, error, reload: () => setTick((t) => t + 1) };
}

/** A line of values 0..max over time, newest on the right; `label` is what a screen reader hears. */
/** `percent`: show the latest value as a share of `max` beside the line (the fleet's ratios). */
export function Sparkline({ values, max = 1, label, percent = true }: { values: readonly number[]; max?: number; label: string; percent?: boolean }) {
  const w = 96;
  const hgt = 24;
  // One reading is a level line; more spread over the width, newest at the right edge.
  const shown = values.length === 1 ? [values[0]!, values[0]!] : values;
  const n = Math.max(shown.length, 2);
  const pts = shown.map((v, i) => `${((i + (n - shown.length)) / (n - 1)) * w},${hgt - (Math.min(Math.max(v, 0), max) / max) * (hgt - 2) - 1}`).join(" ");
  const last = values.at(-1);
  return html`<span class="spark">
    <svg width=${w} height=${hgt} viewBox=${`0 0 ${w} ${hgt}`} role="img" aria-label=${label}><rect width=${w} height=${hgt} /><polyline points=${pts} /></svg>
    ${percent && html`<span class="spark-value">${last === undefined ? "–" : pct(last / max)}</span>`}
  </span>`;
}

/** A button that asks first: `title` and `body` in a modal dialog, `onConfirm` on yes; `onOpen` each time the dialog opens. */
export function ConfirmButton(props: {
  label: string;
  title: string;
  confirm?: string;
  danger?: boolean;
  onConfirm: () => Promise<unknown>;
  onOpen?: () => void;
  children?: ComponentChildren;
}) {
  const ref = useRef<HTMLDialogElement>(null);
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | undefined>(undefined);
  const submit = async (e: Event) => {
    e.preventDefault();
    setBusy(true);
    setError(undefined);
    try {
      await props.onConfirm();
      ref.current?.close();
    } catch (err) {
      setError(messageOf(err));
    } finally {
      setBusy(false);
    }
  };
  return html`<span>
    <button type="button" class=${props.danger ? "danger" : ""} onClick=${() => (ref.current?.showModal(), props.onOpen?.())}>${props.label}</button>
    <dialog ref=${ref} aria-label=${props.title}>
      <form method="dialog" onSubmit=${submit}>
        <h2>${props.title}</h2>
        ${props.children}
        ${error && html`<p class="error" role="alert">${error}</p>`}
        <div class="actions">
          <button type="button" onClick=${() => ref.current?.close()}>Cancel</button>
          <button type="submit" class=${props.danger ? "danger" : "primary"} disabled=${busy}>${props.confirm ?? props.label}</button>
        </div>
      </form>
    </dialog>
  </span>`;
}

export const pct = (r: number) => `${Math.round(r * 100)}%`;
export const bytes = (n: number) => (n >= 2 ** 30 ? `${(n / 2 ** 30).toFixed(1)} GiB` : n >= 2 ** 20 ? `${(n / 2 ** 20).toFixed(0)} MiB` : `${n} B`);
export const ago = (ms: number) =>
  ms < 1000 ? "now" : ms < 60_000 ? `${Math.round(ms / 1000)} s` : ms < 3_600_000 ? `${Math.round(ms / 60_000)} min` : `${(ms / 3_600_000).toFixed(1)} h`;
export const time = (ms: number | undefined) => (ms === undefined ? "–" : new Date(ms).toISOString().replace("T", " ").slice(0, 19));

export const ErrorLine = ({ error }: { error: string | undefined }) => (error ? html`<p class="error" role="alert">${error}</p>` : null);
