/** Child process: the baseline's worker loops. Prints {"ready":true}; on SIGTERM prints its latencies. */
import { nowMs } from "./clock.js";
import { startBaselineWorkers } from "./baseline.js";

const [url, workers] = [process.argv[2]!, Number(process.argv[3] ?? 32)];
const latencies: number[] = [];
let handled = 0;
const pool = await startBaselineWorkers(url, workers, (payload) => {
  handled++;
  if (payload?.sentAt !== undefined && (payload as { measure?: boolean }).measure !== false) latencies.push(nowMs() - payload.sentAt);
});
process.once("SIGTERM", async () => {
  await pool.stop();
  console.log(JSON.stringify({ handled, latencies }));
  process.exit(0);
});
console.log(JSON.stringify({ ready: true }));
