/**
 * The database: its URL or the embedded Postgres, the schema and table prefix, the pool and the
 * wait for it at start.
 */
import { text, postgresUrl, int, duration, identifier, type Setting } from "./parsers.js";

export const DATABASE_SETTINGS = {
  databaseUrl: {
    flag: "--database-url",
    env: ["AIFLOW_DATABASE_URL", "DATABASE_URL"],
    default: undefined,
    help: "Postgres URL (a Unix socket: postgresql://USER@/DB?host=/run/postgresql); when unset an embedded Postgres is started under --data-dir",
    parse: postgresUrl,
  },
  dataDir: { flag: "--data-dir", env: ["AIFLOW_DATA_DIR"], default: "./.aiflowd/pg", help: "data directory of the embedded Postgres", parse: text },
  embeddedPort: {
    flag: "--embedded-port",
    env: ["AIFLOW_EMBEDDED_PORT"],
    default: "7432",
    help: "port of the embedded Postgres (loopback only)",
    parse: int(1024, 65535),
  },
  schema: { flag: "--schema", env: ["AIFLOW_SCHEMA"], default: "public", help: "Postgres schema that holds the tables", parse: identifier },
  tablePrefix: { flag: "--table-prefix", env: ["AIFLOW_TABLE_PREFIX"], default: "aiflow_", help: "prefix of every table and index name", parse: identifier },
  dbPoolSize: {
    flag: "--db-pool-size",
    env: ["AIFLOW_DB_POOL_SIZE"],
    default: "10",
    help: "Postgres connections of each of this instance's two pools (queries, and the queue's prepared statements): it opens up to twice this, plus one for LISTEN",
    parse: int(2, 500),
  },
  dbConnectTimeout: {
    flag: "--db-connect-timeout",
    env: ["AIFLOW_DB_CONNECT_TIMEOUT"],
    default: "2m",
    help: "how long start-up retries an unreachable database (with backoff) before giving up",
    parse: duration(0),
  },
} satisfies Record<string, Setting<unknown>>;
