// A child for the benchmark's process-lifecycle test: says it is ready, echoes lines, exits on SIGTERM.
// The handler goes in before the ready line: the parent may signal the moment it reads that line.
process.once("SIGTERM", () => {
  console.log(JSON.stringify({ bye: true }));
  process.exit(0);
});
console.log("starting");
console.log(JSON.stringify({ ready: true }));
console.log("after ready");
setInterval(() => {}, 1000);
