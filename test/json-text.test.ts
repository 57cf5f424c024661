/**
 * The edge's JSON check against the platform's parser: on valid documents and on thousands of
 * mutated ones it accepts exactly what JSON.parse accepts, except what it refuses on purpose
 * (depth, duplicate keys, \u0000, unpaired surrogates, numbers jsonb cannot hold).
 */
import { describe, expect, it } from "vitest";
import { AppError } from "../src/domain/errors.js";
import { jsonText, MAX_JSON_DEPTH, scanJson } from "../src/domain/json-text.js";

/** A small deterministic PRNG (mulberry32), so a failure replays. */
function rng(seed: number) {
  return () => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const accepts = (s: string) => {
  try {
    scanJson(s, "f");
    return true;
  } catch (err) {
    if (!(err instanceof AppError) || err.kind !== "invalid_argument") throw err;
    return false;
  }
};
const parses = (s: string) => {
  try {
    JSON.parse(s);
    return true;
  } catch {
    return false;
  }
};

const VALID = [
  "0",
  "-0",
  "1.5e-7",
  "6.02E+23",
  '"x"',
  '"\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9\\ud83d\\ude00"',
  "true",
  "false",
  "null",
  "[]",
  "{}",
  ' \t\r\n{ "a" : [ 1 , 2 , { "b" : null } ] , "c" : "d" } ',
  '{"a":{"a":{"a":1}},"b":[{"a":1},{"a":2}]}',
  "[1,[2,[3,[4,[]]]]]",
  '{"":0,"é":1,"\\u00e8":2}',
];
const INVALID = [
  "",
  " ",
  "[",
  "]",
  "{",
  '{"a"}',
  '{"a":}',
  "[1,]",
  '{"a":1,}',
  "01",
  "1.",
  ".5",
  "1e",
  "+1",
  "-",
  "tru",
  "nul",
  '"\\x"',
  '"\\u12"',
  '"a',
  "[1 2]",
  '{"a" 1}',
  "1 2",
  "[]]",
  "{}}",
  "NaN",
  "'a'",
  '"\t"',
];

describe("scanJson", () => {
  it("accepts valid JSON and refuses invalid JSON, as JSON.parse does", () => {
    for (const s of VALID) expect([s, accepts(s)]).toEqual([s, true]);
    for (const s of INVALID) expect([s, accepts(s)]).toEqual([s, parses(s)]);
  });

  it("agrees with JSON.parse on 20,000 mutations of valid documents", () => {
    const random = rng(27);
    const alphabet = ' {}[]":,.-+eE0123456789\\u"abtrufnl\t\n';
    let disagreements = 0;
    for (let n = 0; n < 20_000; n++) {
      let s = VALID[Math.floor(random() * VALID.length)]!;
      const edits = 1 + Math.floor(random() * 3);
      for (let k = 0; k < edits; k++) {
        const at = Math.floor(random() * (s.length + 1));
        const ch = alphabet[Math.floor(random() * alphabet.length)]!;
        const op = random();
        s = op < 0.4 ? s.slice(0, at) + ch + s.slice(at) : op < 0.8 ? s.slice(0, at) + s.slice(at + 1) : s.slice(0, at) + ch + s.slice(at + 1);
      }
      const ours = accepts(s);
      const theirs = parses(s);
      // What we refuse on purpose, JSON.parse takes; nothing else may differ.
      const onPurpose = theirs && !ours && /duplicate|surrogate|\\u0000|digits|nested/.test(reason(s));
      if (ours !== theirs && !onPurpose) {
        disagreements++;
        expect.soft({ s, ours, theirs }).toBeUndefined();
      }
    }
    expect(disagreements).toBe(0);
  });

  it(`refuses nesting past ${MAX_JSON_DEPTH} levels, in arrays and objects alike`, () => {
    expect(accepts("[".repeat(MAX_JSON_DEPTH) + "]".repeat(MAX_JSON_DEPTH))).toBe(true);
    expect(accepts("[".repeat(MAX_JSON_DEPTH + 1) + "]".repeat(MAX_JSON_DEPTH + 1))).toBe(false);
    const objects = (d: number) => `${'{"a":'.repeat(d)}1${"}".repeat(d)}`;
    expect(accepts(objects(MAX_JSON_DEPTH))).toBe(true);
    expect(reason(objects(MAX_JSON_DEPTH + 1))).toContain("nested more than");
  });

  it("refuses duplicate keys (after unescaping), but not the same key in sibling objects", () => {
    expect(reason('{"a":1,"b":2,"a":3}')).toContain("duplicate key 'a'");
    expect(reason('{"a":1,"\\u0061":2}')).toContain("duplicate key 'a'");
    expect(accepts('[{"a":1},{"a":2}]')).toBe(true);
    expect(accepts('{"a":{"a":1}}')).toBe(true);
  });

  it("counts exponents as the digits jsonb writes out, and refuses more than it can hold", () => {
    expect(scanJson("[1e300, 2.5E-10, 3]", "f")).toBe(310);
    expect(accepts("1e999")).toBe(true);
    expect(accepts("1e-1000")).toBe(true);
    expect(reason("1e1000")).toContain("digits");
    expect(reason("1e-1001")).toContain("digits");
    expect(reason("1e99999999999")).toContain("digits");
    expect(() => jsonText("[1e999]", "f", 500)).toThrow(/RESOURCE|bytes/);
  });

  it("gives a position and never quotes the text", () => {
    const r = reason('{"password":"hunter2" oops}');
    expect(r).toContain("position 22");
    expect(r).not.toContain("hunter2");
  });
});

function reason(s: string): string {
  try {
    scanJson(s, "f");
    return "";
  } catch (err) {
    return (err as Error).message;
  }
}
