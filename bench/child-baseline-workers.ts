/** Child process: the baseline's worker loops. Prints {"ready":true}; on SIGTERM prints its latencies. */
import { nowMs } from "./clock.js";
import { startBaselineWorkers } from "./baseline.js";
import { exitWith } from "./child-exit.js";

const [url, workers] = [process.argv[2]!, Number(process.argv[3] ?? 32)];
const latencies: number[] = [];
let handled = 0;
const pool = await startBaselineWorkers(url, workers, (payload) => {
  handled++;
  if (payload?.sentAt !== undefined && (payload as { measure?: boolean }).measure !== false) latencies.push(nowMs() - payload.sentAt);
});
process.once("SIGTERM", async () => {
  await pool.stop();
  exitWith({ handled, latencies });
});
console.log(JSON.stringify({ ready: true }));
