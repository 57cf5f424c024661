/**
 * Hot statements built once per shape. slonik builds a statement's text from its fragments on every
 * call: for the claim (a dozen CTEs, a hundred lines) that was about a fifth of a busy daemon's
 * allocations, with the garbage collections that follow, and a few percent of its CPU. Here a
 * statement is built the first time its shape is seen, with a marker in place of each parameter,
 * and the markers' positions among the token's bound values are recorded; later calls of that shape
 * reuse the text and only put their parameters in those positions.
 *
 * The build function must bind each parameter as it is: a parameter used inside an expression
 * evaluated while building (arithmetic, `new Date(p)`, string concatenation) would be frozen into
 * the first call's text or values. Building refuses that: a marker found inside another value, a
 * value that is not a number any more (NaN), or a parameter bound nowhere is an error at the first
 * call, which every test of the statement makes. Whatever changes the text (a LIMIT literal, an
 * optional CTE) belongs in the shape's key.
 */
import type { QuerySqlToken } from "slonik";

const MARK = "\u0000aiflow-param:";

type Slot = { param: string } | { value: unknown };

/** What a shape's build function gets for each parameter. */
export type Markers<P> = { readonly [K in keyof P]: P[K] extends readonly unknown[] ? readonly string[] : string };

interface Shape {
  token: QuerySqlToken;
  slots: readonly Slot[];
}

export class StatementShapes {
  readonly #shapes = new Map<string, Shape>();

  /**
   * The statement of shape `key` with `params` bound. `build` gets each parameter's marker: a string,
   * or for an array parameter an array holding one string. Bind it with `${p.name}` or
   * `sql.array(p.name, type)`, nothing else.
   */
  token<P extends Record<string, unknown>>(key: string, params: P, build: (p: Markers<P>) => QuerySqlToken): QuerySqlToken {
    let shape = this.#shapes.get(key);
    if (!shape) {
      shape = compile(key, params, build as (p: Record<string, unknown>) => QuerySqlToken);
      this.#shapes.set(key, shape);
    }
    const values = shape.slots.map((s) => ("param" in s ? params[s.param] : s.value));
    return { ...shape.token, values: values as QuerySqlToken["values"] };
  }

  /**
   * The text of shape `key` as built, and what each of its placeholders ($1, $2, …) binds: a
   * parameter's name, or a value fixed when it was built. For the printed copies under docs/sql/
   * (test/sql-snapshots.test.ts); undefined before the shape's first call.
   */
  built(key: string): { sql: string; binds: readonly ({ param: string } | { value: unknown })[] } | undefined {
    const shape = this.#shapes.get(key);
    return shape && { sql: shape.token.sql, binds: shape.slots };
  }

  /** Shapes built so far (tests check that calls share them). */
  get size(): number {
    return this.#shapes.size;
  }
}

function compile(key: string, params: Record<string, unknown>, build: (p: Record<string, unknown>) => QuerySqlToken): Shape {
  const names = Object.keys(params);
  const markers = Object.fromEntries(names.map((n) => [n, Array.isArray(params[n]) ? [`${MARK}${n}`] : `${MARK}${n}`]));
  const token = build(markers);
  const used = new Set<string>();
  const nameOf = (v: unknown): string | undefined => {
    const m = Array.isArray(v) && v.length === 1 ? v[0] : v;
    const name = typeof m === "string" && m.startsWith(MARK) ? m.slice(MARK.length) : undefined;
    return name !== undefined && names.includes(name) && Array.isArray(v) === Array.isArray(params[name]) ? name : undefined;
  };
  const slots = token.values.map((v): Slot => {
    const name = nameOf(v);
    if (name !== undefined) {
      used.add(name);
      return { param: name };
    }
    const marked = (x: unknown) => typeof x === "string" && x.includes(MARK);
    if (marked(v) || (Array.isArray(v) && v.some(marked)) || (typeof v === "number" && Number.isNaN(v)) || v === "NaN")
      throw new Error(`statement ${key}: a parameter was used in an expression while the statement was built (value ${JSON.stringify(v)}); bind it as it is`);
    return { value: v };
  });
  const unbound = names.filter((n) => !used.has(n));
  if (unbound.length > 0) throw new Error(`statement ${key}: parameters ${unbound.join(", ")} are bound nowhere`);
  return { token, slots };
}
