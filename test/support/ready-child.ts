// A child for the benchmark's process-lifecycle tests: says it is ready, echoes lines, exits on SIGTERM.
// The handler goes in before the ready line: the parent may signal the moment it reads that line.
import { exitWith } from "../../bench/child-exit.js";

// With the argument "big", the goodbye is a line of about a megabyte (as an agent's latencies are).
const pad = process.argv[2] === "big" ? "x".repeat(1 << 20) : "";
// With "named", the process takes a name of its own (/proc/PID/comm), for the name lookup's test.
if (process.argv[2] === "named") process.title = "aiflow-named";
process.once("SIGTERM", () => exitWith({ bye: true, pad }));
console.log("starting");
console.log(JSON.stringify({ ready: true }));
console.log("after ready");
setInterval(() => {}, 1000);
