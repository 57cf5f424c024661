/** Values bound into SQL the same way everywhere: clock milliseconds as timestamptz. */
import { sql } from "slonik";

export const ts = (ms: number) => sql.timestamp(new Date(ms));

/**
 * What ts() binds (the seconds to_timestamp takes), for statements built once and bound later
 * (src/db/statement-shapes.ts): bind it with tsAt.
 */
export const tsSeconds = (ms: number) => String(ms / 1000);
export const tsAt = (seconds: string) => sql.fragment`to_timestamp(${seconds})`;
