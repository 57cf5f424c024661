/** Types of metrics.js (plain JavaScript so the heartbeat thread loads it without a TypeScript loader). */
export interface Disk {
  mount: string;
  freeBytes: bigint;
  totalBytes: bigint;
}

export interface Gpu {
  index: number;
  model: string;
  utilization: number;
  memoryUsedBytes: bigint;
  memoryTotalBytes: bigint;
}

export interface Metrics {
  cpuUtilization: number;
  memoryUsedBytes: bigint;
  memoryTotalBytes: bigint;
  disks: Disk[];
  gpus: Gpu[];
}

export declare function parseNvidiaSmi(csv: string): Gpu[];

export declare class MetricsSampler {
  readonly mounts: readonly string[];
  readonly nvidiaSmi: string;
  /** Reported in place of what is measured; a field given is not measured (`gpus`: nvidia-smi is not run). */
  readonly override: Partial<Metrics>;
  constructor(mounts: readonly string[], options?: { nvidiaSmi?: string; override?: Partial<Metrics> });
  sample(): Promise<Metrics>;
}
