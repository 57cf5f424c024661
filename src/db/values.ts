/** Values bound into SQL the same way everywhere: clock milliseconds as timestamptz. */
import { sql } from "slonik";

/**
 * The seconds to_timestamp takes for clock milliseconds, whole milliseconds as a Date keeps them:
 * what ts() binds, and what a statement built once and bound later (src/db/statement-shapes.ts)
 * passes as a parameter and binds with tsAt.
 */
export const tsSeconds = (ms: number) => String(Math.trunc(ms) / 1000);
export const tsAt = (seconds: string) => sql.fragment`to_timestamp(${seconds})`;

/** Clock milliseconds as timestamptz (to_timestamp of a bound value, as slonik's sql.timestamp binds a Date). */
export const ts = (ms: number) => tsAt(tsSeconds(ms));
