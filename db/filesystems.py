"""Which filesystem a path lies on, from the kernel's mount table: SQLite's locking is not safe on a network one.

`db.session` refuses a SQLite store there before anything is written; a Postgres URL is the way to share a store
between machines.
"""

from __future__ import annotations

from pathlib import Path

# Where the kernel lists this process's mounts (a module constant so tests can give sample lines).
MOUNTINFO = Path("/proc/self/mountinfo")
# Filesystems whose locking SQLite cannot rely on (and where WAL's shared memory does not work
# between machines): https://www.sqlite.org/wal.html and https://www.sqlite.org/lockingv3.html.
NETWORK_FILESYSTEMS = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "9p",
        "afs",
        "ceph",
        "glusterfs",
        "lustre",
        "gpfs",
        "beegfs",
        "fuse.sshfs",
        "fuse.glusterfs",
        "fuse.cephfs",
        "fuse.s3fs",
        "fuse.gcsfuse",
        "fuse.rclone",
        "davfs",
        "fuse.davfs2",
    }
)


def _unescape_mount(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash in paths as octal escapes (\\040 ...)."""
    for code in ("040", "011", "012", "134"):
        field = field.replace(f"\\{code}", chr(int(code, 8)))
    return field


def filesystem_type(path: Path, mountinfo: str) -> str | None:
    """The filesystem type of the mount holding `path` (absolute, resolved), from mountinfo lines.

    The deepest mount point containing the path wins; of equal ones the last listed, which is the
    one mounted over the others.
    """
    best: tuple[int, str] | None = None
    for line in mountinfo.splitlines():
        fields, _, rest = line.partition(" - ")
        parts = fields.split()
        if len(parts) < 5 or not rest:
            continue
        mount = Path(_unescape_mount(parts[4]))
        if (mount == path or mount in path.parents) and (best is None or len(mount.parts) >= best[0]):
            best = (len(mount.parts), rest.split()[0])
    return best[1] if best else None


def network_filesystem(path: Path) -> str | None:
    """The network filesystem type `path` lies on (nfs4, cifs, ...), or None when local or unknown."""
    try:
        mountinfo = MOUNTINFO.read_text(encoding="utf-8", errors="replace")
    except OSError:  # not Linux: nothing to tell
        return None
    kind = filesystem_type(path.resolve(), mountinfo)
    return kind if kind in NETWORK_FILESYSTEMS else None
