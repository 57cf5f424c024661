// A child for the benchmark's process-lifecycle test: says it is ready, echoes lines, exits on SIGTERM.
console.log("starting");
console.log(JSON.stringify({ ready: true }));
console.log("after ready");
process.once("SIGTERM", () => {
  console.log(JSON.stringify({ bye: true }));
  process.exit(0);
});
setInterval(() => {}, 1000);
