/**
 * Payload templates over the run context. A template is JSON; a string in it that is exactly
 * "{{ path }}" becomes the value at the path (any JSON), and "{{ path }}" inside a longer string
 * becomes that value's text (a string as it is, anything else as JSON). Nothing else is evaluated:
 * no expressions, no calls, so a template cannot run code or reach past the data it is given.
 *
 * A path is a root (`context`, `item`, `index` or `run_id`) and then `.name` or `[N]` steps. A path
 * that is not there when the node starts reads as null.
 *
 * What must stay true, since templates come from whoever defines a run:
 * - A path reads the data's own keys only: `__proto__`, `constructor` and `prototype` are refused
 *   when the template is checked, and resolve() reads own properties, so no path reaches an
 *   object's prototype or its functions whatever the data holds.
 * - checkTemplate() refuses a template nested more than MAX_TEMPLATE_DEPTH levels, and walks it
 *   without recursion: render() recurses once per level, so only a checked template may reach it.
 */
import { MAX_JSON_DEPTH } from "../../domain/json-text.js";

export type Root = "context" | "item" | "index" | "run_id";
export type Step = string | number;
export interface Path {
  root: Root;
  steps: Step[];
}

const ROOTS: readonly Root[] = ["context", "item", "index", "run_id"];
/** Keys a path may not name: on a JavaScript object they lead to its prototype and its functions, not its data. */
const FORBIDDEN_STEPS: ReadonlySet<string> = new Set(["__proto__", "constructor", "prototype"]);
/** The deepest a template may nest: what a payload may (../domain/json-text.ts). */
export const MAX_TEMPLATE_DEPTH = MAX_JSON_DEPTH;
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
      if (FORBIDDEN_STEPS.has(field[1]!))
        throw new TemplateError(`'${text}' names '${field[1]}', which a path may not (it would read an object's prototype, not its data)`);
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
    else v = Array.isArray(v) || !Object.hasOwn(v, s) ? null : ((v as Record<string, unknown>)[s] ?? null);
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
 * on an unclosed mark, a bad path, or nesting deeper than MAX_TEMPLATE_DEPTH.
 */
export function checkTemplate(template: unknown): Set<Root> {
  const roots = new Set<Root>();
  walkStrings(template, (s) => {
    const stripped = s.replace(MARK, (_, inner: string) => {
      roots.add(parsePath(inner).root);
      return "";
    });
    if (stripped.includes("{{") || stripped.includes("}}"))
      throw new TemplateError(`'${s.length > 80 ? `${s.slice(0, 80)}…` : s}' has an unclosed or nested {{ }}`);
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

/** Visits every string of a parsed JSON value, with a stack of its own (no recursion), refusing one nested too deep. */
function walkStrings(root: unknown, visit: (s: string) => void): void {
  const todo: { v: unknown; depth: number }[] = [{ v: root, depth: 0 }];
  while (todo.length > 0) {
    const { v, depth } = todo.pop()!;
    if (typeof v === "string") visit(v);
    else if (v !== null && typeof v === "object") {
      if (depth >= MAX_TEMPLATE_DEPTH) throw new TemplateError(`nests deeper than ${MAX_TEMPLATE_DEPTH} levels of objects and lists`);
      const children = Array.isArray(v) ? v : Object.values(v);
      for (let i = children.length - 1; i >= 0; i--) todo.push({ v: children[i], depth: depth + 1 });
    }
  }
}
