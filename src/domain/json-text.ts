/**
 * JSON text from callers (payloads, results), checked once at the edge so that what Postgres stores
 * as jsonb comes back number for number and every read of it can be served:
 *
 * - valid JSON (RFC 8259), with errors that give a position and never echo the text (it may hold a
 *   caller's secrets);
 * - nested at most MAX_JSON_DEPTH levels: deeper documents cost every reader's parser its stack;
 * - no duplicate keys: jsonb keeps only the last, which would change the document silently;
 * - no `\u0000` and no unpaired surrogate escapes, which jsonb refuses;
 * - numbers jsonb can hold (numeric: at most MAX_NUMBER_DIGITS digits either side of the point once
 *   the exponent is applied). jsonb writes numbers out in full (`1e300` comes back as 301 digits),
 *   so the size a caller is held to counts each exponent as the digits it becomes.
 *
 * One pass, no recursion and no parse tree: it costs a few milliseconds per megabyte.
 */
import { invalidArgument, resourceExhausted } from "./errors.js";

export const MAX_JSON_DEPTH = 128;
export const MAX_NUMBER_DIGITS = 1000;

/**
 * Optional JSON text: empty is null; anything else must pass the checks above and be at most
 * `maxBytes` as stored (RESOURCE_EXHAUSTED above). Returns the text as given.
 */
export function jsonText(raw: string, field: string, maxBytes: number): string | null {
  if (raw.trim() === "") return null;
  const expansion = scanJson(raw, field);
  const size = Buffer.byteLength(raw) + expansion;
  if (size > maxBytes)
    throw resourceExhausted(
      `${field} is ${size} bytes${expansion > 0 ? " with its exponents written out, as they are stored" : ""}; the limit is ${maxBytes} bytes`,
    );
  return raw;
}

enum Ch {
  Tab = 0x09,
  Lf = 0x0a,
  Cr = 0x0d,
  Space = 0x20,
  Quote = 0x22,
  Comma = 0x2c,
  Minus = 0x2d,
  Plus = 0x2b,
  Dot = 0x2e,
  Zero = 0x30,
  Nine = 0x39,
  Colon = 0x3a,
  OpenBracket = 0x5b,
  Backslash = 0x5c,
  CloseBracket = 0x5d,
  LowerE = 0x65,
  UpperE = 0x45,
  LowerU = 0x75,
  OpenBrace = 0x7b,
  CloseBrace = 0x7d,
}

/** Where a string stops being plain: its closing quote, an escape, or a control character (invalid). */
const STRING_STOP = /["\\\u0000-\u001f]/g;
const SIMPLE_ESCAPES = new Set(['"', "\\", "/", "b", "f", "n", "r", "t"]);
const HEX4 = /^[0-9A-Fa-f]{4}$/;

// The scan's state. scanJson() runs to completion without calling out, so one set serves every
// call; plain functions over it cost no closures per call, which small payloads would notice.
let s = "";
let n = 0;
let i = 0;
let where = "";

function fail(why: string, at = i): never {
  throw invalidArgument(where, `is not valid JSON: ${why} at position ${at}`);
}

function skipSpace(): void {
  for (; i < n; i++) {
    const c = s.charCodeAt(i);
    if (c !== Ch.Space && c !== Ch.Lf && c !== Ch.Cr && c !== Ch.Tab) return;
  }
}

/** A string starting at i (its opening quote); leaves i after it. Returns its value when asked to. */
function string(decode: boolean): string {
  const start = i;
  let j = i + 1;
  let escaped = false;
  for (;;) {
    STRING_STOP.lastIndex = j;
    const m = STRING_STOP.exec(s);
    if (!m) return fail("unterminated string", start);
    j = m.index;
    const c = s.charCodeAt(j);
    if (c === Ch.Quote) break;
    if (c !== Ch.Backslash) return fail("control character in a string (escape it)", j);
    escaped = true;
    const e = s[j + 1];
    if (e !== undefined && SIMPLE_ESCAPES.has(e)) {
      j += 2;
      continue;
    }
    if (e !== "u" || !HEX4.test(s.slice(j + 2, j + 6))) return fail("invalid escape", j);
    const unit = parseInt(s.slice(j + 2, j + 6), 16);
    if (unit === 0) return fail("\\u0000 cannot be stored", j);
    if (unit >= 0xdc00 && unit <= 0xdfff) return fail("unpaired surrogate escape", j);
    if (unit >= 0xd800 && unit <= 0xdbff) {
      const low = s.charCodeAt(j + 7) === Ch.LowerU && s[j + 6] === "\\" && HEX4.test(s.slice(j + 8, j + 12)) ? parseInt(s.slice(j + 8, j + 12), 16) : -1;
      if (low < 0xdc00 || low > 0xdfff) return fail("unpaired surrogate escape", j);
      j += 12;
    } else j += 6;
  }
  i = j + 1;
  if (!decode) return "";
  return escaped ? (JSON.parse(s.slice(start, i)) as string) : s.slice(start + 1, j);
}

function digits(): number {
  const from = i;
  while (i < n) {
    const c = s.charCodeAt(i);
    if (c < Ch.Zero || c > Ch.Nine) break;
    i++;
  }
  return i - from;
}

/** A number at i; returns the bytes its exponent adds when written out in full. */
function number(): number {
  const start = i;
  if (s.charCodeAt(i) === Ch.Minus) i++;
  const first = s.charCodeAt(i);
  if (first === Ch.Zero) i++;
  else if (first > Ch.Zero && first <= Ch.Nine) digits();
  else return fail("invalid number", start);
  const whole = i - start - (s.charCodeAt(start) === Ch.Minus ? 1 : 0);
  let fraction = 0;
  if (s.charCodeAt(i) === Ch.Dot) {
    i++;
    fraction = digits();
    if (fraction === 0) return fail("invalid number", start);
  }
  let exponent = 0;
  const e = s.charCodeAt(i);
  if (e === Ch.LowerE || e === Ch.UpperE) {
    i++;
    const sign = s.charCodeAt(i);
    if (sign === Ch.Minus || sign === Ch.Plus) i++;
    const from = i;
    const count = digits();
    if (count === 0) return fail("invalid number", start);
    // Past 7 digits the exponent is out of range whatever they are (and would lose precision here).
    exponent = count > 7 ? Number.MAX_SAFE_INTEGER : Number(s.slice(from, i));
    if (sign === Ch.Minus) exponent = -exponent;
  }
  if (whole + Math.max(exponent, 0) > MAX_NUMBER_DIGITS || fraction + Math.max(-exponent, 0) > MAX_NUMBER_DIGITS)
    return fail(`number with more than ${MAX_NUMBER_DIGITS} digits either side of the point`, start);
  return Math.abs(exponent);
}

function literal(word: string): void {
  if (!s.startsWith(word, i)) fail("expected a value");
  i += word.length;
}

/** A member's key and its colon, in the innermost object. */
function key(keys: Set<string>): void {
  skipSpace();
  if (s.charCodeAt(i) !== Ch.Quote) fail("expected a property name in double quotes");
  const at = i;
  const k = string(true);
  if (keys.has(k)) fail(`duplicate key '${k.length > 40 ? `${k.slice(0, 40)}…` : k}'`, at);
  keys.add(k);
  skipSpace();
  if (s.charCodeAt(i) !== Ch.Colon) fail("expected ':' after a property name");
  i++;
}

/**
 * Validates `text` as described in the module comment; returns how many bytes jsonb's writing out
 * of exponents adds. Throws INVALID_ARGUMENT naming `field` and a position.
 */
export function scanJson(text: string, field: string): number {
  s = text;
  n = text.length;
  i = 0;
  where = field;
  try {
    return scanValue();
  } finally {
    s = "";
  }
}

function scanValue(): number {
  let expansion = 0;
  // One entry per open container: the keys seen so far for an object, null for an array.
  const open: (Set<string> | null)[] = [];
  for (;;) {
    // A value starts here.
    skipSpace();
    const c = s.charCodeAt(i);
    if (c === Ch.OpenBrace || c === Ch.OpenBracket) {
      if (open.length >= MAX_JSON_DEPTH) fail(`nested more than ${MAX_JSON_DEPTH} levels deep`);
      i++;
      skipSpace();
      if (c === Ch.OpenBrace) {
        if (s.charCodeAt(i) !== Ch.CloseBrace) {
          const keys = new Set<string>();
          open.push(keys);
          key(keys);
          continue;
        }
      } else if (s.charCodeAt(i) !== Ch.CloseBracket) {
        open.push(null);
        continue;
      }
      i++;
    } else if (c === Ch.Quote) string(false);
    else if (c === Ch.Minus || (c >= Ch.Zero && c <= Ch.Nine)) expansion += number();
    else if (c === 0x74) literal("true");
    else if (c === 0x66) literal("false");
    else if (c === 0x6e) literal("null");
    else fail(i >= n ? "unexpected end" : "expected a value");

    // After a value: close what ends here, then either the next value or the end of the text.
    for (;;) {
      skipSpace();
      if (open.length === 0) {
        if (i < n) fail("unexpected text after the value");
        return expansion;
      }
      const top = open[open.length - 1]!;
      const d = s.charCodeAt(i);
      if (d === Ch.Comma) {
        i++;
        if (top) key(top);
        break;
      }
      if (d === (top ? Ch.CloseBrace : Ch.CloseBracket)) {
        i++;
        open.pop();
        continue;
      }
      fail(i >= n ? "unexpected end" : top ? "expected ',' or '}'" : "expected ',' or ']'");
    }
  }
}
