"""SQLite on a network filesystem is refused: its locking (and WAL's shared memory) is not safe there.

The classification reads mountinfo lines as the kernel writes them (proc(5)); these are real lines
from machines with NFS, CIFS, sshfs and WSL's 9p mounts.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from db import ResultsError
from db import filesystems
from db.filesystems import filesystem_type
from db.session import open_engine

MOUNTINFO = """\
22 1 253:1 / / rw,relatime shared:1 - ext4 /dev/mapper/vg-root rw,errors=remount-ro
25 22 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw
61 22 0:52 / /home rw,relatime shared:30 - nfs4 fs1.lab:/export/home rw,vers=4.2,rsize=1048576,hard,proto=tcp
62 61 253:2 / /home/alice/scratch rw,relatime shared:31 - ext4 /dev/sdb1 rw
70 22 0:60 / /mnt/share rw,relatime shared:40 - cifs //nas/share rw,vers=3.1.1,cache=strict
71 22 0:61 / /mnt/my\\040drive rw,relatime shared:41 - fuse.sshfs alice@box:/data rw,user_id=1000
72 22 0:62 / /mnt/c rw,noatime shared:42 - 9p drvfs rw,dirsync,aname=drvfs;path=C:\\
73 22 0:63 / /srv rw,relatime shared:43 - nfs old:/srv rw
74 22 253:3 / /srv rw,relatime shared:44 - xfs /dev/sdc1 rw
"""


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        ("/home/alice/results/loopeval.sqlite", "nfs4"),
        ("/home", "nfs4"),
        ("/home/alice/scratch/r.sqlite", "ext4"),  # a local disk mounted inside the NFS home
        ("/homework/r.sqlite", "ext4"),  # a prefix of the string is not a parent folder
        ("/mnt/share/team/r.sqlite", "cifs"),
        ("/mnt/my drive/r.sqlite", "fuse.sshfs"),  # mountinfo escapes the space as \040
        ("/mnt/c/Users/r.sqlite", "9p"),
        ("/srv/r.sqlite", "xfs"),  # mounted over the old NFS mount: the last line wins
        ("/tmp/r.sqlite", "ext4"),
    ],
)
def test_the_mount_holding_a_path_gives_its_filesystem(path: str, kind: str) -> None:
    assert filesystem_type(Path(path), MOUNTINFO) == kind


def test_a_sqlite_store_on_a_network_filesystem_is_refused_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text("22 1 0:52 / / rw,relatime - nfs4 fs1.lab:/export rw,vers=4.2\n")
    monkeypatch.setattr(filesystems, "MOUNTINFO", mountinfo)
    target = tmp_path / "results" / "loopeval.sqlite"
    with pytest.raises(ResultsError, match=r"network filesystem \(nfs4\).*Postgres URL") as refused:
        open_engine(str(target))
    assert len(str(refused.value).splitlines()) == 1
    assert not target.parent.exists()


def test_a_local_sqlite_store_opens(tmp_path: Path) -> None:
    """This machine's own mountinfo: pytest's tmp is local, so the store opens as before."""
    assert filesystems.network_filesystem(tmp_path) is None
    open_engine(str(tmp_path / "r.sqlite")).dispose()
