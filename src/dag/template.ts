/**
 * Payload templates over the run context. A template is JSON; a string in it that is exactly
 * "{{ path }}" becomes the value at the path (any JSON), and "{{ path }}" inside a longer string
 * becomes that value's text (a string as it is, anything else as JSON). Nothing else is evaluated:
 * no expressions, no calls, so a template cannot run code or reach past the data it is given.
 *
 * A path is a root (`context`, `item`, `index` or `run_id`) and then `.name` or `[N]` steps. A path
 * that is not there when the node starts reads as null.
 */

export type Root = "context" | "item" | "index" | "run_id";
export type Step = string | number;
export interface Path {
  root: Root;
  steps: Step[];
}

const ROOTS: readonly Root[] = ["context", "item", "index", "run_id"];
const MARK = /\{\{([^{}]*)\}\}/g;

export class TemplateError extends Error {
  override name = "TemplateError";
}

/** Parses `context.a[0].b`; throws TemplateError saying what is wrong. */
export function parsePath(raw: string): Path {
  const text = raw.trim();
  const m = /^([A-Za-z_]+)/.exec(text);
  if (!m || !(ROOTS as readonly string[]).includes(m[1]!)) throw new TemplateError(`'${text}' must start with ${ROOTS.join(", ")}`);
  const steps: Step[] = [];
  let rest = text.slice(m[1]!.length);
  while (rest.length > 0) {
    const field = /^\.([A-Za-z_][A-Za-z0-9_-]*)/.exec(rest);
    const index = /^\[(\d{1,9})\]/.exec(rest);
    if (field) {
      steps.push(field[1]!);
      rest = rest.slice(field[0].length);
    } else if (index) {
      steps.push(Number(index[1]));
      rest = rest.slice(index[0].length);
    } else throw new TemplateError(`'${text}' has '${rest}' where a .name or [N] step belongs`);
  }
  return { root: m[1] as Root, steps };
}

/** The value at a path, or null where it is not there. */
export function resolve(path: Path, scope: Scope): unknown {
  let v: unknown = scope[path.root] ?? null;
  for (const s of path.steps) {
    if (v === null || typeof v !== "object") return null;
    if (typeof s === "number") v = Array.isArray(v) ? (v[s] ?? null) : null;
    else v = Array.isArray(v) ? null : ((v as Record<string, unknown>)[s] ?? null);
  }
  return v;
}

export interface Scope {
  context: unknown;
  item?: unknown;
  index?: number;
  run_id: string;
}

/**
 * Checks every mark of a template (parsed JSON) and returns the roots it uses; throws TemplateError
 * on an unclosed mark or a bad path.
 */
export function checkTemplate(template: unknown): Set<Root> {
  const roots = new Set<Root>();
  walkStrings(template, (s) => {
    const stripped = s.replace(MARK, (_, inner: string) => {
      roots.add(parsePath(inner).root);
      return "";
    });
    if (stripped.includes("{{") || stripped.includes("}}")) throw new TemplateError(`'${s.length > 80 ? s.slice(0, 80) + "…" : s}' has an unclosed or nested {{ }}`);
  });
  return roots;
}

/** The template with its marks filled in from the scope. */
export function render(template: unknown, scope: Scope): unknown {
  if (typeof template === "string") {
    const whole = /^\{\{([^{}]*)\}\}$/.exec(template);
    if (whole) return resolve(parsePath(whole[1]!), scope);
    if (!template.includes("{{")) return template;
    return template.replace(MARK, (_, inner: string) => {
      const v = resolve(parsePath(inner), scope);
      return typeof v === "string" ? v : JSON.stringify(v);
    });
  }
  if (Array.isArray(template)) return template.map((t) => render(t, scope));
  if (template !== null && typeof template === "object") {
    const out: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(template)) out[k] = render(v, scope);
    return out;
  }
  return template;
}

function walkStrings(v: unknown, visit: (s: string) => void): void {
  if (typeof v === "string") visit(v);
  else if (Array.isArray(v)) for (const x of v) walkStrings(x, visit);
  else if (v !== null && typeof v === "object") for (const x of Object.values(v)) walkStrings(x, visit);
}
