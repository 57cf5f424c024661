/** Types of nvidia-smi.js (plain JavaScript so the heartbeat thread loads it without a TypeScript loader). */
export type NvidiaSmiResult = { ok: true; stdout: string } | { ok: false; missing: boolean; error: string };

/** Runs nvidia-smi; never rejects, and settles within `timeoutMs` (a run that did not answer is killed). */
export declare function runNvidiaSmi(executable: string, args: readonly string[], timeoutMs: number): Promise<NvidiaSmiResult>;
