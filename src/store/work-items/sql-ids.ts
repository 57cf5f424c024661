/**
 * Ids a statement makes for the rows it creates, from one ULID drawn per statement.
 *
 * The n-th id (n from 1, at most 32,767) is the seed with the three leading characters of its
 * random part replaced by n in Crockford base 32, so a statement draws one ULID rather than one for
 * every row it might create (it cannot know beforehand how many, and drawing the most it could was
 * about a tenth of a busy daemon's allocations). Still a ULID of the seed's time; distinct within
 * the statement by n, and from other statements' ids by the time and the remaining 65 random bits
 * (a monotonic factory's ids of one millisecond differ in their last characters, which stay).
 */
import { sql, type FragmentSqlToken, type ValueExpression } from "slonik";

const CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";

/** The n-th id (an SQL expression) a statement makes from `seed` (a bound ULID). */
export const nthId = (seed: ValueExpression, n: FragmentSqlToken): FragmentSqlToken =>
  sql.fragment`overlay(${seed}::text placing substr(${CROCKFORD}, (${n} / 1024 % 32)::int + 1, 1) || substr(${CROCKFORD}, (${n} / 32 % 32)::int + 1, 1) || substr(${CROCKFORD}, (${n} % 32)::int + 1, 1) from 11 for 3)`;
