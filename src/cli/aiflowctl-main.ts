import { main } from "./aiflowctl.js";

// A reader that stops reading (`aiflowctl … | head`) ends aiflowctl quietly with status 0, as
// other Unix tools end, not with an EPIPE stack trace: what it would still print has no reader.
process.stdout.on("error", (err: NodeJS.ErrnoException) => {
  if (err.code === "EPIPE") process.exit(0);
  throw err;
});
// A closed stderr loses the message, not the exit status the command ends with.
process.stderr.on("error", (err: NodeJS.ErrnoException) => {
  if (err.code !== "EPIPE") throw err;
});

process.exitCode = await main(process.argv.slice(2));
