"""What the agent has (registered once, at start) and what it measures (every heartbeat).

What must stay true:
- Detection never fails and never hangs: without nvidia-smi there are no GPUs, and one that errs or
  does not answer within its timeout gives none (with a warning), rather than GPUs it could not see.
- The work directory's disk comes first, registered and reported under the same mount names in the
  same order: the daemon places a disk need that names no mount on the agent's first disk.
- Nothing is estimated: a mount that cannot be read is left out, not reported as zero.
"""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from ._wire import pb
from .options import Capacity, DiskCapacity, GpuCapacity, GpuMetrics, HeartbeatMetrics

MIB = 1024 * 1024
NVIDIA_TIMEOUT = 5.0


@dataclass(frozen=True)
class Detected:
    cpu_millis: int
    memory_mb: int
    gpus: Tuple[GpuCapacity, ...]
    disks: Tuple[DiskCapacity, ...]


def run_nvidia_smi(query: str, timeout: float, log: logging.Logger) -> Optional[str]:
    """nvidia-smi's CSV answer to ``query``; None when it is missing, errs or does not answer."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, f"--query-gpu={query}", "--format=csv,noheader,nounits"], capture_output=True, timeout=timeout, check=True, text=True)
        return out.stdout
    except (subprocess.SubprocessError, OSError) as e:
        log.warning("nvidia-smi gave no GPU list (%s): reporting no GPUs", e)
        return None


def parse_gpu_capacity(csv: str) -> List[GpuCapacity]:
    """``index,name,memory.total`` lines; a line whose numbers are "[N/A]" is skipped, and a model
    name with a comma in it is kept whole."""
    gpus = []
    for line in csv.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < 3 or not cells[0].isdigit() or not _number(cells[-1]):
            continue
        gpus.append(GpuCapacity(index=int(cells[0]), model=", ".join(cells[1:-1]), memory_mb=round(float(cells[-1]))))
    return sorted(gpus, key=lambda g: g.index)


def parse_gpu_metrics(csv: str) -> List[GpuMetrics]:
    """``index,name,utilization.gpu,memory.used,memory.total`` lines (MiB), as parse_gpu_capacity."""
    gpus = []
    for line in csv.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < 5 or not cells[0].isdigit() or not all(_number(c) for c in cells[-3:]):
            continue
        util, used, total = (float(c) for c in cells[-3:])
        gpus.append(
            GpuMetrics(
                index=int(cells[0]), model=", ".join(cells[1:-3]), utilization=min(100.0, util), memory_used_mb=round(used), memory_total_mb=round(total)
            )
        )
    return gpus


def _number(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def mount_point_of(path: str) -> str:
    """The mount point of the filesystem ``path`` is on (its highest ancestor on the same device)."""
    try:
        here = os.path.realpath(path)
        dev = os.stat(here).st_dev
    except OSError:
        return path
    while True:
        parent = os.path.dirname(here)
        if parent == here:
            return here
        try:
            if os.stat(parent).st_dev != dev:
                return here
        except OSError:
            return here
        here = parent


def disk_mounts(mounts: Sequence[str]) -> List[str]:
    """The work directory's mount point first, then ``mounts``, each once."""
    names: List[str] = []
    for m in [mount_point_of(os.getcwd()), *mounts]:
        if m not in names:
            names.append(m)
    return names


def _statvfs(mount: str) -> Optional[Tuple[int, int]]:
    """(free, total) bytes, or None when the mount cannot be read."""
    try:
        s = os.statvfs(mount)
    except OSError:
        return None
    return s.f_bavail * s.f_frsize, s.f_blocks * s.f_frsize


def _meminfo() -> Tuple[int, int]:
    """(total, available) bytes of the machine."""
    total = avail = 0
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key == "MemTotal":
                    total = int(rest.split()[0]) * 1024
                elif key == "MemAvailable":
                    avail = int(rest.split()[0]) * 1024
    except OSError:
        pass
    return total, avail


def _cgroup_memory_limit() -> Optional[int]:
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit():
            return int(text)
    return None


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def detect_capacity(given: Capacity, mounts: Sequence[str], log: logging.Logger) -> Detected:
    """What ``given`` does not state, detected now; never raises."""
    memory = given.memory_mb
    if memory is None:
        total, _ = _meminfo()
        limit = _cgroup_memory_limit()
        memory = (limit if limit is not None and 0 < limit < total else total) // MIB
    gpus = given.gpus
    if gpus is None:
        csv = run_nvidia_smi("index,name,memory.total", NVIDIA_TIMEOUT, log)
        gpus = parse_gpu_capacity(csv) if csv is not None else []
    disks = given.disks
    if disks is None:
        found = []
        for m in disk_mounts(mounts):
            st = _statvfs(m)
            if st is not None:
                found.append(DiskCapacity(mount=m, size_mb=st[1] // MIB))
        disks = found
    return Detected(
        cpu_millis=given.cpu_millis if given.cpu_millis is not None else _cpus() * 1000,
        memory_mb=memory,
        gpus=tuple(sorted(gpus, key=lambda g: g.index)),
        disks=tuple(disks),
    )


def capacity_to_wire(c: Detected) -> pb.AgentCapacity:
    return pb.AgentCapacity(
        cpu_millis=c.cpu_millis,
        memory_mb=c.memory_mb,
        gpus=[pb.GpuCapacity(index=g.index, model=g.model, memory_mb=g.memory_mb) for g in c.gpus],
        disks=[pb.DiskCapacity(mount=d.mount, size_mb=d.size_mb) for d in c.disks],
    )


class Sampler:
    """Measures what heartbeats report: CPU (from /proc/stat, between one beat and the next),
    memory, the disks the agent registered, and GPUs (nvidia-smi, when there were any at start).
    Runs on the liveness thread only."""

    def __init__(self, mounts: Sequence[str], gpus: bool, given: Optional[HeartbeatMetrics], log: logging.Logger) -> None:
        self._mounts = list(mounts)
        self._gpus = gpus
        self._given = given or HeartbeatMetrics()
        self._log = log
        self._last_cpu: Optional[Tuple[int, int]] = self._cpu_times()

    @staticmethod
    def _cpu_times() -> Optional[Tuple[int, int]]:
        """(idle, total) jiffies of all cores."""
        try:
            with open("/proc/stat") as f:
                fields = [int(x) for x in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        return idle, sum(fields[:8])

    def _cpu_utilization(self) -> float:
        now = self._cpu_times()
        last, self._last_cpu = self._last_cpu, now
        if now is None or last is None or now[1] <= last[1]:
            return 0.0
        busy = 1 - (now[0] - last[0]) / (now[1] - last[1])
        return max(0.0, min(100.0, busy * 100))

    def sample(self) -> pb.AgentMetrics:
        g = self._given
        total, avail = _meminfo()
        m = pb.AgentMetrics(
            cpu_utilization=g.cpu_utilization if g.cpu_utilization is not None else self._cpu_utilization(),
            memory_used_bytes=g.memory_used_mb * MIB if g.memory_used_mb is not None else max(0, total - avail),
            memory_total_bytes=g.memory_total_mb * MIB if g.memory_total_mb is not None else total,
        )
        if g.disks is not None:
            m.disks.extend(pb.DiskMetrics(mount=d.mount, free_bytes=d.free_mb * MIB, total_bytes=d.total_mb * MIB) for d in g.disks)
        else:
            for mount in self._mounts:
                st = _statvfs(mount)
                if st is not None:
                    m.disks.append(pb.DiskMetrics(mount=mount, free_bytes=st[0], total_bytes=st[1]))
        gpus: Sequence[GpuMetrics] = ()
        if g.gpus is not None:
            gpus = g.gpus
        elif self._gpus:
            csv = run_nvidia_smi("index,name,utilization.gpu,memory.used,memory.total", 2.0, self._log)
            gpus = parse_gpu_metrics(csv) if csv is not None else ()
        m.gpus.extend(
            pb.GpuMetrics(
                index=x.index, model=x.model, utilization=x.utilization, memory_used_bytes=x.memory_used_mb * MIB, memory_total_bytes=x.memory_total_mb * MIB
            )
            for x in gpus
        )
        return m


__all__ = ["Detected", "detect_capacity", "capacity_to_wire", "Sampler", "parse_gpu_capacity", "parse_gpu_metrics", "disk_mounts"]
