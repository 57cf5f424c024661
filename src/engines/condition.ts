/**
 * Conditions: the small expression language of graph edges (`when`) and state-machine guards
 * (`guard`), over JSON values.
 *
 *   result.score >= 0.8 && !(state.tries > 3)      result.label == "cat" || result.label in ["dog", "fox"]
 *
 * - Literals: numbers, strings in '…' or "…", true, false, null, and lists of literals [1, "a"].
 * - Paths: a root the engine offers (graph: result, state, steps, visits; machine: event, context)
 *   then `.name` or `[N]` steps; a path that is not there reads as null.
 * - Operators: == != (deep equality of JSON), < <= > >= (two numbers or two strings; anything else
 *   is false), `in` (an element of a list, a key of an object, a part of a string), ! && || and
 *   parentheses. A value stands for true unless it is null, false, 0 or "".
 *
 * Why a language of its own: a condition comes from whoever defines a graph or a machine and is
 * evaluated by the daemon, so it must not be able to run code, reach anything but the data it is
 * given, or take unbounded time. This grammar has no calls, no assignment and no loops; it is
 * parsed once when the definition is stored (an error names the position), it is bounded in length
 * and nesting, and evaluating it is a walk of its tree. The libraries that evaluate JavaScript-like
 * expressions compile them to functions or have had sandbox escapes; JSON Logic and CEL would do,
 * at the price of a dependency and, for JSON Logic, conditions nobody can read in a definition.
 */

export const CONDITION_MAX_CHARS = 1024;
const MAX_DEPTH = 32;

export class ConditionError extends Error {
  override name = "ConditionError";
}

type Op = "==" | "!=" | "<" | "<=" | ">" | ">=" | "in";
export type Node =
  | { t: "lit"; v: unknown }
  | { t: "path"; root: string; steps: (string | number)[] }
  | { t: "not"; e: Node }
  | { t: "and" | "or"; l: Node; r: Node }
  | { t: "cmp"; op: Op; l: Node; r: Node };

interface Token {
  k: "num" | "str" | "id" | "op" | "end";
  v: string;
  at: number;
}

const OPS = ["==", "!=", "<=", ">=", "&&", "||", "<", ">", "!", "(", ")", "[", "]", ".", ","];

function tokenize(src: string): Token[] {
  const out: Token[] = [];
  let i = 0;
  while (i < src.length) {
    const c = src[i]!;
    if (/\s/.test(c)) {
      i++;
      continue;
    }
    const num = /^-?\d+(\.\d+)?([eE][+-]?\d+)?/.exec(src.slice(i));
    // The language has no subtraction: a minus is a number's sign, where an operand may begin.
    const prev = out.at(-1);
    const afterOperand =
      prev !== undefined &&
      (prev.k === "num" || prev.k === "str" || (prev.k === "id" && prev.v !== "in") || (prev.k === "op" && (prev.v === ")" || prev.v === "]")));
    if (num && (c !== "-" || !afterOperand)) {
      out.push({ k: "num", v: num[0], at: i });
      i += num[0].length;
      continue;
    }
    if (c === '"' || c === "'") {
      let j = i + 1;
      let s = "";
      while (j < src.length && src[j] !== c) {
        if (src[j] === "\\" && j + 1 < src.length) {
          const e = src[j + 1]!;
          s += e === "n" ? "\n" : e === "t" ? "\t" : e;
          j += 2;
        } else s += src[j++];
      }
      if (j >= src.length) throw new ConditionError(`at ${i + 1}: the string is not closed`);
      out.push({ k: "str", v: s, at: i });
      i = j + 1;
      continue;
    }
    const id = /^[A-Za-z_][A-Za-z0-9_-]*/.exec(src.slice(i));
    if (id) {
      out.push({ k: "id", v: id[0], at: i });
      i += id[0].length;
      continue;
    }
    const op = OPS.find((o) => src.startsWith(o, i));
    if (!op) throw new ConditionError(`at ${i + 1}: '${c}' is not part of the language`);
    out.push({ k: "op", v: op, at: i });
    i += op.length;
  }
  out.push({ k: "end", v: "", at: src.length });
  return out;
}

/** Parses a condition; `roots` are the path roots the engine offers. Throws ConditionError naming the position. */
export function parseCondition(src: string, roots: readonly string[]): Node {
  if (src.length > CONDITION_MAX_CHARS) throw new ConditionError(`is ${src.length} characters; the limit is ${CONDITION_MAX_CHARS}`);
  const toks = tokenize(src);
  let p = 0;
  let depth = 0;
  const peek = () => toks[p]!;
  const isOp = (v: string) => peek().k === "op" && peek().v === v;
  const expect = (v: string) => {
    if (!isOp(v)) throw new ConditionError(`at ${peek().at + 1}: expected '${v}'${peek().k === "end" ? " before the end" : ` where '${peek().v}' is`}`);
    p++;
  };
  const nest = <T>(fn: () => T): T => {
    if (++depth > MAX_DEPTH) throw new ConditionError(`nests deeper than ${MAX_DEPTH}`);
    try {
      return fn();
    } finally {
      depth--;
    }
  };
  const or = (): Node =>
    nest(() => {
      let l = and();
      while (isOp("||")) {
        p++;
        l = { t: "or", l, r: and() };
      }
      return l;
    });
  const and = (): Node => {
    let l = not();
    while (isOp("&&")) {
      p++;
      l = { t: "and", l, r: not() };
    }
    return l;
  };
  const not = (): Node => {
    if (isOp("!")) {
      p++;
      return nest(() => ({ t: "not", e: not() }));
    }
    return cmp();
  };
  const cmp = (): Node => {
    const l = primary();
    const t = peek();
    const op = t.k === "op" && ["==", "!=", "<", "<=", ">", ">="].includes(t.v) ? t.v : t.k === "id" && t.v === "in" ? "in" : null;
    if (op === null) return l;
    p++;
    return { t: "cmp", op: op as Op, l, r: primary() };
  };
  const literal = (): unknown => {
    const t = peek();
    if (t.k === "num") return (p++, Number(t.v));
    if (t.k === "str") return (p++, t.v);
    if (t.k === "id" && ["true", "false", "null"].includes(t.v)) return (p++, t.v === "true" ? true : t.v === "false" ? false : null);
    if (isOp("[")) {
      p++;
      const xs: unknown[] = [];
      while (!isOp("]")) {
        xs.push(nest(literal));
        if (!isOp("]")) expect(",");
      }
      p++;
      return xs;
    }
    throw new ConditionError(`at ${t.at + 1}: expected a value${t.k === "end" ? " before the end" : ` where '${t.v}' is`}`);
  };
  const primary = (): Node => {
    const t = peek();
    if (isOp("(")) {
      p++;
      const e = or();
      expect(")");
      return e;
    }
    if (t.k === "id" && !["true", "false", "null", "in"].includes(t.v)) {
      if (!roots.includes(t.v)) throw new ConditionError(`at ${t.at + 1}: '${t.v}' is not a value here: paths start at ${roots.join(", ")}`);
      p++;
      const steps: (string | number)[] = [];
      for (;;) {
        if (isOp(".")) {
          p++;
          const f = peek();
          if (f.k !== "id") throw new ConditionError(`at ${f.at + 1}: expected a field name after '.'`);
          steps.push(f.v);
          p++;
        } else if (isOp("[")) {
          p++;
          const n = peek();
          if (n.k !== "num" || !/^\d{1,9}$/.test(n.v)) throw new ConditionError(`at ${n.at + 1}: expected an index [N]`);
          steps.push(Number(n.v));
          p++;
          expect("]");
        } else break;
      }
      return { t: "path", root: t.v, steps };
    }
    return { t: "lit", v: literal() };
  };
  const tree = or();
  if (peek().k !== "end") throw new ConditionError(`at ${peek().at + 1}: '${peek().v}' after a complete condition`);
  return tree;
}

/** Whether a parsed condition holds over `scope` (its roots' values). Never throws. */
export function holds(tree: Node, scope: Readonly<Record<string, unknown>>): boolean {
  return truthy(evaluate(tree, scope));
}

function evaluate(n: Node, scope: Readonly<Record<string, unknown>>): unknown {
  switch (n.t) {
    case "lit":
      return n.v;
    case "path": {
      let v: unknown = scope[n.root] ?? null;
      for (const s of n.steps) {
        if (v === null || typeof v !== "object") return null;
        if (typeof s === "number") v = Array.isArray(v) ? (v[s] ?? null) : null;
        else v = Array.isArray(v) || !Object.hasOwn(v, s) ? null : ((v as Record<string, unknown>)[s] ?? null);
      }
      return v;
    }
    case "not":
      return !truthy(evaluate(n.e, scope));
    case "and":
      return truthy(evaluate(n.l, scope)) && truthy(evaluate(n.r, scope));
    case "or":
      return truthy(evaluate(n.l, scope)) || truthy(evaluate(n.r, scope));
    case "cmp":
      return compare(n.op, evaluate(n.l, scope), evaluate(n.r, scope));
  }
}

const truthy = (v: unknown) => !(v === null || v === undefined || v === false || v === 0 || v === "");

function compare(op: Op, a: unknown, b: unknown): boolean {
  if (op === "==") return same(a, b);
  if (op === "!=") return !same(a, b);
  if (op === "in") {
    if (Array.isArray(b)) return b.some((x) => same(a, x));
    if (typeof b === "string") return typeof a === "string" && b.includes(a);
    if (b !== null && typeof b === "object") return typeof a === "string" && Object.hasOwn(b, a);
    return false;
  }
  if (!((typeof a === "number" && typeof b === "number") || (typeof a === "string" && typeof b === "string"))) return false;
  return op === "<" ? a < b : op === "<=" ? a <= b : op === ">" ? a > b : a >= b;
}

function same(a: unknown, b: unknown): boolean {
  if (a === b) return true;
  if (a === null || b === null || typeof a !== "object" || typeof b !== "object") return false;
  if (Array.isArray(a) !== Array.isArray(b)) return false;
  if (Array.isArray(a)) return a.length === (b as unknown[]).length && a.every((x, i) => same(x, (b as unknown[])[i]));
  const ka = Object.keys(a);
  const kb = Object.keys(b);
  return ka.length === kb.length && ka.every((k) => Object.hasOwn(b, k) && same((a as Record<string, unknown>)[k], (b as Record<string, unknown>)[k]));
}
