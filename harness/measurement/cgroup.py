"""The memory the cgroups holding this process still allow it: a container's limit, not the host's free RAM.

Inside a memory-limited cgroup (a container, a Slurm job, `systemd-run -p MemoryMax=`) the host's available RAM
(`psutil.virtual_memory().available`) says nothing of the limit: a job that fits the host but not the cgroup passes
every check and is then killed by the kernel (exit -9, its run left `running`). `cgroup_available` reads what the
kernel enforces, in both layouts:

- cgroup v1: the `memory` controller's hierarchy; each group's `memory.limit_in_bytes` and `memory.usage_in_bytes`;
- cgroup v2: the unified hierarchy; each group's `memory.max` ("max": none) and `memory.current`.

The process's group is found from `/proc/self/cgroup` and the hierarchy's mount from `/proc/self/mountinfo`. A limit
binds at every level from the process's group up to the mount's root, so the tightest wins. Usage counts the page
cache, which the kernel reclaims before it kills, so a group's inactive file pages (`memory.stat`) are taken as
free, as `psutil`'s available memory takes the host's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc/self")
UNLIMITED = 1 << 62  # v1 writes its "no limit" as 9223372036854771712 (the page counter's maximum): anything above


@dataclass(frozen=True)
class Layout:
    """How one cgroup version names a group's limit, its usage and, in its `memory.stat`, its reclaimable cache."""

    limit: str
    usage: str
    inactive_file: str


V1 = Layout("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
V2 = Layout("memory.max", "memory.current", "inactive_file")


def cgroup_available(proc: Path = PROC) -> int | None:
    """Bytes the process may still allocate under its cgroups' memory limits (the tightest, less what each group
    uses), or None where no group limits memory or none can be read (not Linux, no cgroup fs mounted)."""
    try:
        found = _memory_group(proc)
    except OSError:
        return None
    if found is None:
        return None
    group, top, layout = found
    left = [room for folder in _up_to(group, top) if (room := _room(folder, layout)) is not None]
    return min(left) if left else None


def _memory_group(proc: Path) -> tuple[Path, Path, Layout] | None:
    """The folder of the process's memory cgroup, the folder of its hierarchy's root, and that hierarchy's layout:
    v1's memory controller where it is mounted, else v2's unified hierarchy."""
    paths: dict[str, str] = {}  # "memory" (v1) or "" (v2) -> the process's group in that hierarchy
    for line in (proc / "cgroup").read_text().splitlines():
        hierarchy, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if hierarchy == "0" and controllers == "":
            paths.setdefault("", path)
        elif "memory" in controllers.split(","):
            paths["memory"] = path
    for fields in _mounts(proc):
        root, mountpoint, fstype, options = fields
        if fstype == "cgroup" and "memory" in options.split(",") and "memory" in paths:
            return _inside(Path(mountpoint), root, paths["memory"]), Path(mountpoint), V1
    for fields in _mounts(proc):
        root, mountpoint, fstype, _ = fields
        if fstype == "cgroup2" and "" in paths:
            return _inside(Path(mountpoint), root, paths[""]), Path(mountpoint), V2
    return None


def _mounts(proc: Path) -> list[tuple[str, str, str, str]]:
    """(root, mount point, filesystem type, super options) of each mount in `mountinfo`."""
    mounts = []
    for line in (proc / "mountinfo").read_text().splitlines():
        before, _, after = line.partition(" - ")
        fields, tail = before.split(), after.split()
        if len(fields) >= 5 and len(tail) >= 3:
            mounts.append((_unescaped(fields[3]), _unescaped(fields[4]), tail[0], tail[2]))
    return mounts


def _unescaped(field: str) -> str:
    """A mountinfo path field: spaces, tabs and newlines are written as octal escapes."""
    return field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def _inside(mountpoint: Path, root: str, group: str) -> Path:
    """The folder of `group` (a path in the hierarchy) under a mount of the hierarchy's `root` (a container's mount
    shows only its own subtree: its root is then the container's group)."""
    relative = group[len(root) :] if root != "/" and group.startswith(root) else group
    return mountpoint / relative.lstrip("/")


def _up_to(group: Path, top: Path) -> list[Path]:
    """`group` and each folder above it, up to and including the hierarchy's root `top`."""
    folders = [group]
    while folders[-1] != top and top in folders[-1].parents:
        folders.append(folders[-1].parent)
    return folders


def _room(folder: Path, layout: Layout) -> int | None:
    """What the group at `folder` still allows: its limit less its usage (less its inactive page cache); None where it
    sets no limit or its files cannot be read."""
    try:
        limit_text = (folder / layout.limit).read_text().strip()
        if limit_text == "max" or int(limit_text) >= UNLIMITED:
            return None
        usage = int((folder / layout.usage).read_text().strip())
        stat = dict(line.split() for line in (folder / "memory.stat").read_text().splitlines() if line.count(" ") == 1)
    except (OSError, ValueError):
        return None
    cache = int(stat.get(layout.inactive_file, 0))
    return max(0, int(limit_text) - max(0, usage - cache))
