/**
 * The condition language of graph edges and machine guards (src/engines/condition.ts): what it
 * accepts and how it evaluates, and the refusals that name the position.
 */
import { describe, expect, it } from "vitest";
import { ConditionError, CONDITION_MAX_CHARS, holds, parseCondition } from "../src/engines/condition.js";

const ROOTS = ["result", "state", "steps", "visits"];
const check = (src: string, scope: Record<string, unknown>) => holds(parseCondition(src, ROOTS), scope);

describe("conditions", () => {
  const scope = { result: { score: 0.91, label: "cat", tags: ["a", "b"], nested: { ok: true } }, state: { tries: 2 }, steps: 7, visits: { review: 3 } };

  it.each([
    ["result.score >= 0.8", true],
    ["result.score > 0.95", false],
    ['result.label == "cat"', true],
    ["result.label == 'dog' || result.label in ['cat', 'fox']", true],
    ["!(state.tries > 3) && steps < 10", true],
    ["visits.review >= 3 && !result.nested.ok", false],
    ['"b" in result.tags', true],
    ['"z" in result.tags', false],
    ['"sc" in "score"', true],
    ['"score" in result', true],
    ["result.tags == ['a', 'b']", true],
    ["result.missing == null", true],
    ["result.missing", false],
    ["result.tags[1] == 'b' && result.tags[5] == null", true],
    ["steps == 7 && state.tries != -2", true],
    ["result.label < 5", false],
    ["'abc' < 'abd'", true],
    ["true && (false || 1)", true],
    ["0 || ''", false],
  ])("%s is %s", (src, expected) => {
    expect(check(src, scope)).toBe(expected);
  });

  it("reads a property the data does not have as null, never the object's prototype", () => {
    expect(check("result.constructor == null && result.__proto__ == null", { result: {} })).toBe(true);
    expect(check("'toString' in result", { result: {} })).toBe(false);
  });

  it.each([
    ["result.score >", /at 15: expected a value before the end/],
    ["(result.score > 1", /expected '\)' before the end/],
    ["context.x == 1", /at 1: 'context' is not a value here: paths start at result, state, steps, visits/],
    ["result.x = 1", /at 10: '=' is not part of the language/],
    ["result.f()", /at 9: '\(' after a complete condition/],
    ["'open", /at 1: the string is not closed/],
    ["result[x]", /expected an index \[N\]/],
    ["steps 3", /'3' after a complete condition/],
  ])("refuses %j naming where", (src, message) => {
    expect(() => parseCondition(src, ROOTS)).toThrow(ConditionError);
    expect(() => parseCondition(src, ROOTS)).toThrow(message);
  });

  it("bounds length and nesting", () => {
    expect(() => parseCondition(`${"1 == 1 && ".repeat(200)}true`, ROOTS)).toThrow(`the limit is ${CONDITION_MAX_CHARS}`);
    expect(() => parseCondition(`${"(".repeat(40)}true${")".repeat(40)}`, ROOTS)).toThrow(/nests deeper than 32/);
    expect(() => parseCondition(`${"!".repeat(40)}true`, ROOTS)).toThrow(/nests deeper than 32/);
  });
});
