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
  constructor(mounts: readonly string[], options?: { nvidiaSmi?: string });
  sample(): Promise<Metrics>;
}
