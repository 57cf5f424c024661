// @ts-check
/**
 * Runs nvidia-smi, for the heartbeat's GPU metrics (metrics.js, in the heartbeat thread) and for the
 * GPUs the agent registers at start (capacity.ts, in the main thread).
 *
 * What must stay true: it never rejects and never outlasts its timeout, whatever nvidia-smi does. A
 * GPU driver that hangs leaves nvidia-smi stuck, possibly in a state no signal ends at once, and a
 * wrapper script's children can hold its output open after it was killed: so the answer is settled
 * by a timer of its own rather than by the process's exit, the process runs in a group of its own
 * that the timeout kills whole, and nothing of it keeps the event loop alive afterwards. A missing
 * nvidia-smi (no NVIDIA driver, the common case) is told apart from one that failed, so that callers
 * stop looking for the first but may try the second again.
 *
 * Plain JavaScript (types in nvidia-smi.d.ts) because the heartbeat thread loads it with Node itself.
 */
import { spawn } from "node:child_process";

/** More output than any GPU list: a run that prints this much is not answering the query. */
const MAX_OUTPUT = 4 * 1024 * 1024;

/** @typedef {{ ok: true, stdout: string } | { ok: false, missing: boolean, error: string }} NvidiaSmiResult */

/**
 * @param {string} executable a path, or a name looked up on PATH
 * @param {readonly string[]} args
 * @param {number} timeoutMs
 * @returns {Promise<NvidiaSmiResult>}
 */
export function runNvidiaSmi(executable, args, timeoutMs) {
  return new Promise((resolve) => {
    let settled = false;
    /** @type {import("node:child_process").ChildProcess | undefined} */
    let child;
    /** @param {NvidiaSmiResult} result */
    const settle = (result) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      resolve(result);
    };
    /** @param {string} error */
    const giveUp = (error) => {
      settle({ ok: false, missing: false, error });
      if (child) abandon(child);
    };
    const timer = setTimeout(() => giveUp(`no answer within ${timeoutMs} ms`), timeoutMs);
    try {
      // detached: a process group of its own (POSIX), which abandon() kills with all it started.
      child = spawn(executable, args, { detached: process.platform !== "win32", windowsHide: true, stdio: ["ignore", "pipe", "ignore"] });
    } catch (err) {
      settle({ ok: false, missing: false, error: err instanceof Error ? err.message : String(err) });
      return;
    }
    /** @type {Buffer[]} */
    const chunks = [];
    let size = 0;
    child.stdout?.on("data", (/** @type {Buffer} */ chunk) => {
      size += chunk.length;
      if (size > MAX_OUTPUT) giveUp(`more than ${MAX_OUTPUT} bytes of output`);
      else chunks.push(chunk);
    });
    // Not found or not executable: nothing runs.
    child.on("error", (err) => settle({ ok: false, missing: /** @type {NodeJS.ErrnoException} */ (err).code === "ENOENT", error: err.message }));
    // "close": the process exited and its output is all read.
    child.on("close", (code, signal) => {
      if (code === 0) settle({ ok: true, stdout: Buffer.concat(chunks).toString("utf8") });
      else settle({ ok: false, missing: false, error: signal ? `killed by ${signal}` : `exited with code ${code}` });
    });
  });
}

/**
 * Kills a run that did not answer, with its process group (what it started may hold the output open
 * after it exited), and lets go of its pipe and handle.
 * @param {import("node:child_process").ChildProcess} child
 */
function abandon(child) {
  try {
    if (child.pid !== undefined && process.platform !== "win32") process.kill(-child.pid, "SIGKILL");
    else child.kill("SIGKILL");
  } catch {
    // The group is gone already.
  }
  child.stdout?.destroy();
  child.unref();
}
