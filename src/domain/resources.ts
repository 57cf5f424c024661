/**
 * What work needs and what agents have, as the daemon stores them (worker_params.requirements and
 * aiflow_agent.metadata.capacity: these shapes, written only by the validators in
 * ./resource-input.ts), and the one question asked of them outside the claim: could this
 * agent ever run this item, whatever else it runs? (`fitsCapacity`, and `unplaceableReason` for
 * the fleet). What is *free* at a moment is the claim's question, asked in SQL in the claim's own
 * statement (../store/work-items/placement.ts) against the same shapes; the two agree on every
 * rule here: a GPU need is met by `gpus` distinct GPUs each matching the model and holding
 * gpu_memory_mb (or, with none given, reserved whole); a disk need by the named mount, or the
 * agent's first disk when none is named.
 */

/** An item's needs; an absent field is no need. Memory and disk in MiB, CPU in thousandths of a core. */
export interface Requirements {
  gpus?: number;
  gpuMemoryMb?: number;
  gpuModel?: string;
  cpuMillis?: number;
  memoryMb?: number;
  diskMb?: number;
  diskMount?: string;
}

export interface GpuCapacity {
  index: number;
  model: string;
  memoryMb: number;
}

/** An agent's resources as it registered them. */
export interface Capacity {
  cpuMillis: number;
  memoryMb: number;
  gpus: GpuCapacity[];
  disks: { mount: string; sizeMb: number }[];
}

/** A GPU model need is met by a model name that holds it, ignoring case. */
export const modelMatches = (need: string | undefined, model: string): boolean => !need || model.toLowerCase().includes(need.toLowerCase());

/** The disk a need is placed on: the named mount, else the agent's first disk. */
export function diskFor(c: Capacity, mount: string | undefined): { mount: string; sizeMb: number } | undefined {
  return mount ? c.disks.find((d) => d.mount === mount) : c.disks[0];
}

/**
 * GPUs of the agent that could hold one of the item's GPU shares: the model matches and the memory
 * is there. A need with no gpuMemoryMb takes a GPU whole, and the claim (place() in SQL) marks a GPU
 * taken by its free memory reaching 0, so a GPU registered with 0 MB can never be placed: it counts
 * for no need here either (test/placement-parity.test.ts holds the two rules to each other).
 */
const gpusFor = (c: Capacity, r: Requirements) => c.gpus.filter((g) => modelMatches(r.gpuModel, g.model) && g.memoryMb >= (r.gpuMemoryMb ?? 1));

/** Whether an agent with this capacity, and nothing else running, could take the item. */
export function fitsCapacity(c: Capacity | null, r: Requirements): boolean {
  if (c === null) return false;
  if ((r.gpus ?? 0) > 0 && gpusFor(c, r).length < r.gpus!) return false;
  if ((r.cpuMillis ?? 0) > c.cpuMillis || (r.memoryMb ?? 0) > c.memoryMb) return false;
  if ((r.diskMb ?? 0) > 0 && (diskFor(c, r.diskMount)?.sizeMb ?? -1) < r.diskMb!) return false;
  return true;
}

const mib = (mb: number) => (mb >= 1024 && mb % 1024 === 0 ? `${mb / 1024} GB` : mb >= 10_240 ? `${(mb / 1024).toFixed(1)} GB` : `${mb} MB`);
const cores = (millis: number) => `${millis / 1000} CPU${millis === 1000 ? "" : "s"}`;
const most = (xs: number[]) => (xs.length === 0 ? 0 : Math.max(...xs));

/**
 * Why no agent of `fleet` (the registered agents that serve the item's tenant and engine kind)
 * could take the item, naming the first need that none meets and the most any agent has of it;
 * null when one could.
 */
export function unplaceableReason(r: Requirements, fleet: readonly (Capacity | null)[]): string | null {
  const agents = fleet.filter((c): c is Capacity => c !== null);
  if (agents.some((c) => fitsCapacity(c, r))) return null;
  if (agents.length === 0)
    return fleet.length === 0 ? "no registered agent serves its tenant and engine kind" : "no agent serving its tenant and engine kind registered a capacity";
  const gpus = r.gpus ?? 0;
  if (gpus > 0) {
    const model = r.gpuModel ? ` ${r.gpuModel}` : "";
    const ofModel = agents.flatMap((c) => c.gpus.filter((g) => modelMatches(r.gpuModel, g.model)));
    if (ofModel.length === 0) return `needs${model} GPUs, no agent has one`;
    const need = r.gpuMemoryMb ?? 0;
    if (need > most(ofModel.map((g) => g.memoryMb)))
      return `needs ${mib(need)} per${model} GPU, the largest agent GPU has ${mib(most(ofModel.map((g) => g.memoryMb)))}`;
    const best = most(agents.map((c) => gpusFor(c, r).length));
    if (best < gpus) return `needs ${gpus}${model} GPUs${need > 0 ? ` with ${mib(need)} each` : ""}, the most any agent has is ${best}`;
  }
  const cpu = r.cpuMillis ?? 0;
  if (cpu > most(agents.map((c) => c.cpuMillis))) return `needs ${cores(cpu)}, the largest agent has ${cores(most(agents.map((c) => c.cpuMillis)))}`;
  const mem = r.memoryMb ?? 0;
  if (mem > most(agents.map((c) => c.memoryMb))) return `needs ${mib(mem)} of memory, the largest agent has ${mib(most(agents.map((c) => c.memoryMb)))}`;
  const disk = r.diskMb ?? 0;
  if (disk > 0) {
    const where = r.diskMount ? ` on ${r.diskMount}` : "";
    const sizes = agents.map((c) => diskFor(c, r.diskMount)?.sizeMb ?? -1).filter((s) => s >= 0);
    if (sizes.length === 0) return `needs disk${where}, no agent has that mount`;
    if (disk > most(sizes)) return `needs ${mib(disk)} of disk${where}, the largest agent has ${mib(most(sizes))}`;
  }
  return "no single agent meets all of its needs at once";
}
