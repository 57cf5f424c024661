/** Values bound into SQL the same way everywhere: clock milliseconds as timestamptz. */
import { sql } from "slonik";

export const ts = (ms: number) => sql.timestamp(new Date(ms));
