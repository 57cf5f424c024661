/**
 * The settings table: every setting's flag, AIFLOW_* environment variables, default, help line and
 * parser, by area (one file each beside this one), in the order `aiflowd --help` prints them.
 * ../config.ts reads argv and the environment through it.
 */
import { SERVING_SETTINGS } from "./serving.js";
import { DATABASE_SETTINGS } from "./database.js";
import { INSTANCE_SETTINGS } from "./instance.js";
import { QUEUE_SETTINGS } from "./queue.js";
import { ENGINES_SETTINGS } from "./engines.js";
import { INTAKE_SETTINGS } from "./intake.js";
import { LIMITS_SETTINGS } from "./limits.js";

export type { Setting } from "./parsers.js";

export const SETTINGS = {
  ...SERVING_SETTINGS,
  ...DATABASE_SETTINGS,
  ...INSTANCE_SETTINGS,
  ...QUEUE_SETTINGS,
  ...ENGINES_SETTINGS,
  ...INTAKE_SETTINGS,
  ...LIMITS_SETTINGS,
};
