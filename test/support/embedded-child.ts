/**
 * Starts an embedded Postgres and prints its URL on stdout, then stays up until killed. The embedded
 * test kills this process with SIGKILL to leave an orphaned Postgres behind, as a crashed daemon would.
 *
 * Usage: node --import tsx test/support/embedded-child.ts <dataDir> <port>
 */
import { pino } from "pino";
import { startEmbeddedPostgres } from "../../src/db/embedded.js";

const [dataDir, port] = process.argv.slice(2);
if (dataDir === undefined || port === undefined) throw new Error("usage: embedded-child.ts <dataDir> <port>");

const server = await startEmbeddedPostgres({ dataDir, port: Number(port), log: pino({ level: "info" }, pino.destination(2)) });
process.stdout.write(`${server.url}\n`);
// Nothing more to do: the Postgres child process keeps the event loop, and so this process, alive.
