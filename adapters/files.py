"""Files a user hands loopeval, read with limits, and files loopeval keeps, written whole or not at all.

Reading: `read_text` refuses what is not a regular file before opening it (a FIFO would block the
open, /dev/zero would fill memory), reads at most a stated number of bytes and decodes UTF-8, each
failure one AdapterError naming the file. `parse_json` refuses NaN and Infinity, which Python's json
reads but no JSON standard (nor Postgres) accepts.

Folders: a model folder is closed (`check_closed`, which every checkpoint loader calls first): each of its entries is a
regular file or a folder, and each shard its index names is a regular file inside it (`folder_file`), so nothing in it
makes loopeval, or transformers reading it, open a FIFO, a device or weights elsewhere. A folder loopeval writes under
one the user names takes a plain name (`plain_name`).

Writing: `write_atomically` writes a temporary file beside the target, flushes it to disk and renames
it over the target, so an interrupted write or a full disk leaves the old file as it was. The file gets the
mode a plain `open` would give it (0666 less the umask), not the temporary file's 0600.
`commit_folder` does the same for a set of files that only make sense together (a checkpoint's
weights and metadata): they are written to a staging folder first, the folder's completion marker
is removed, the files are renamed into place, and the marker, listing the files, is written last. A
folder without its marker is incomplete and `check_complete` refuses it.

Everything here is the standard library, so every package and the GPU machine can use it.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from adapters.base import AdapterError

MIB = 1 << 20
COMPLETE_MARKER = "checkpoint_complete.json"  # written last into a committed folder: {"files": [names]}


def read_text(path: str | os.PathLike[str], what: str, limit: int) -> str:
    """The UTF-8 text of the regular file `path`, at most `limit` bytes; AdapterError naming `what` and the file."""
    path = Path(path)
    try:
        info = path.stat()
    except FileNotFoundError:
        raise AdapterError(f"{what} {path}: no such file") from None
    except OSError as exc:
        raise AdapterError(f"{what} {path}: cannot read it ({exc.strerror or exc})") from None
    if not stat.S_ISREG(info.st_mode):
        kind = "a folder" if stat.S_ISDIR(info.st_mode) else "a device, FIFO or socket"
        raise AdapterError(f"{what} {path}: {kind}, not a regular file")
    if info.st_size > limit:
        raise AdapterError(f"{what} {path}: {info.st_size:,} bytes, over the limit of {limit:,}")
    try:
        with path.open("rb") as fh:
            data = fh.read(limit + 1)  # the file may have grown since stat
    except OSError as exc:
        raise AdapterError(f"{what} {path}: cannot read it ({exc.strerror or exc})") from None
    if len(data) > limit:
        raise AdapterError(f"{what} {path}: over the limit of {limit:,} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise AdapterError(f"{what} {path}: not UTF-8 text (byte {exc.start})") from None


# ------------------------------------------------------------------ folders a user hands loopeval (checkpoints)
# A model folder is closed: what loopeval (or transformers, reading it for loopeval) opens there is a regular file inside
# it. A FIFO would hang the open, a device would feed it forever, and an index naming `../x` or `/abs` shards would load
# weights from elsewhere without a word.


def plain_name(name: Any, what: str) -> str:
    """`name` when it is one plain file or folder name (no separator, not empty, `.` or `..`, no leading dot), which
    joined to a folder stays inside it; AdapterError naming `what` otherwise."""
    if not isinstance(name, str) or not name or name.startswith(".") or any(c in name for c in "/\\\0"):
        raise AdapterError(
            f"{what} {name!r} must be a plain name (no path separators, not starting with a dot): "
            "it names a folder that must stay inside its parent"
        )
    return name


def folder_file(folder: Path, name: Any, what: str) -> Path:
    """`folder / name` for a `name` one of the folder's own files gives (a shard index's): a relative path without `..`
    whose folders are real folders inside `folder`, naming a regular file; AdapterError naming `what` otherwise.

    The name is what a downloaded text file says, so it may not leave the folder. The file itself may be a link: the
    Hugging Face hub's cache lays every snapshot file out as a link into the cache's `blobs/` (config.json included),
    and a link in the folder is the folder maker's, trusted as the folder is; it must still lead to a regular file."""
    if not isinstance(name, str) or not name or "\0" in name or Path(name).is_absolute() or ".." in Path(name).parts:
        raise AdapterError(
            f"{what} {name!r} in {folder}: must name a file inside the folder (a relative path without ..)"
        )
    path = folder / name
    for parent in list(Path(name).parents)[:-1]:  # the index's sub-folders, not the folder itself
        if (folder / parent).is_symlink():
            raise AdapterError(
                f"{what} {path}: its folder {folder / parent} is a link, which may lead outside {folder}"
            )
    try:
        mode = path.stat().st_mode
    except (OSError, RuntimeError):  # missing, a dangling link or a loop of links
        raise AdapterError(f"{what} {path}: no such file") from None
    _regular(path, mode, what)
    return path


def _regular(path: Path, mode: int, what: str) -> None:
    if not stat.S_ISREG(mode):
        kind = "a folder" if stat.S_ISDIR(mode) else "a device, FIFO or socket"
        raise AdapterError(f"{what} {path}: {kind}, not a regular file")


INDEX_LIMIT = 16 * MIB  # a shard index of thousands of tensors is a few MB


def index_shards(folder: Path, index: str) -> list[Path]:
    """The shard files the index file `index` of `folder` names (its `weight_map` values), each checked by `folder_file`."""
    try:
        weight_map = parse_json(read_text(folder / index, "shard index", INDEX_LIMIT)).get("weight_map")
    except (ValueError, AttributeError) as exc:
        raise AdapterError(f"shard index {folder / index}: not a JSON object with a weight_map ({exc})") from None
    if not isinstance(weight_map, dict) or not weight_map:
        raise AdapterError(
            f"shard index {folder / index}: its weight_map must map tensor names to shard files, got {weight_map!r}"
        )
    names: list[Any] = []  # each shard once, in the index's order (a shard holds many tensors)
    for name in weight_map.values():
        if name not in names:
            names.append(name)
    return [folder_file(folder, name, f"shard of {index}") for name in names]


def check_closed(folder: str | os.PathLike[str]) -> None:
    """AdapterError unless every entry of the model folder `folder` is, links followed, a regular file or a folder, and
    every shard its indexes (`*.index.json`) name is a regular file the index names inside it (`folder_file`): nothing
    a loader opens there is a FIFO or a device, and no index reaches outside. A dangling link is left for the loader
    to find missing."""
    folder = Path(folder)
    try:
        entries = sorted(folder.iterdir())
    except OSError as exc:
        raise AdapterError(f"model folder {folder}: cannot list it ({exc.strerror or exc})") from None
    for entry in entries:
        try:
            mode = entry.stat().st_mode
        except OSError:
            continue
        if not stat.S_ISDIR(mode):
            _regular(entry, mode, "model folder file")
    for index in sorted(folder.glob("*.index.json")):
        index_shards(folder, index.name)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_json(text: str) -> Any:
    """`json.loads`, refusing NaN and Infinity (ValueError), which the JSON standard has no place for."""
    return json.loads(text, parse_constant=_no_constant)


def _fsync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _umask() -> int:
    """The process's umask, read without changing it where Linux says it (/proc), else set back at once."""
    try:
        return int(Path("/proc/self/status").read_text().split("Umask:")[1].split()[0], 8)
    except (OSError, IndexError, ValueError):
        mask = os.umask(0o022)
        os.umask(mask)
        return mask


def write_atomically(path: str | os.PathLike[str], data: bytes | Callable[[BinaryIO], None]) -> None:
    """Replace `path` with `data` in one step: the file is either the old one or the whole new one (OSError otherwise).

    `data` is the bytes, or a function that writes them into the open file: a training state (weights and optimizer)
    is streamed by `torch.save` rather than held in memory twice.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp's 0600 would hide the file from its group; open() would not
        with os.fdopen(fd, "wb") as fh:
            data(fh) if callable(data) else fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())  # a full disk fails here, before the old file is touched
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_folder(path.parent)


def commit_folder(folder: str | os.PathLike[str], write: Callable[[Path], None]) -> None:
    """Put the files `write(staging)` writes into `folder` as one set, ending with the completion marker.

    Files of `folder` that `write` does not write (a training run's resume state) stay. Until the marker
    is back, `check_complete` refuses the folder, so it is never read with new weights beside old metadata.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob(".staging-*"):  # left by a killed commit: loopeval's own by name
        shutil.rmtree(stale, ignore_errors=True)
    staging = Path(tempfile.mkdtemp(dir=folder, prefix=".staging-"))
    try:
        write(staging)
        names = sorted(file.name for file in staging.iterdir())
        for name in names:
            with (staging / name).open("rb") as fh:
                os.fsync(fh.fileno())  # a full disk fails here, before the folder is touched
        (folder / COMPLETE_MARKER).unlink(missing_ok=True)
        _fsync_folder(folder)
        for name in names:
            os.replace(staging / name, folder / name)
        write_atomically(folder / COMPLETE_MARKER, (json.dumps({"files": names}, indent=2) + "\n").encode())
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def check_complete(folder: str | os.PathLike[str]) -> None:
    """AdapterError unless `folder` holds its completion marker and every file the marker lists."""
    folder = Path(folder)
    marker = folder / COMPLETE_MARKER
    incomplete = (
        f"checkpoint {folder} is incomplete: {{}} (writing it was interrupted, or a loopeval older than the marker "
        "wrote it); write it again (`loopeval zoo train` and `zoo convert` continue from the train_state.pt beside it)"
    )
    try:
        files = parse_json(marker.read_text(encoding="utf-8")).get("files")
    except FileNotFoundError:
        raise AdapterError(incomplete.format(f"it has no completion marker {COMPLETE_MARKER}")) from None
    except (OSError, ValueError, AttributeError):
        files = None
    if not isinstance(files, list):
        raise AdapterError(incomplete.format(f"its completion marker {COMPLETE_MARKER} is unreadable"))
    missing = [name for name in files if not (folder / str(name)).is_file()]
    if missing:
        raise AdapterError(
            incomplete.format(f"{', '.join(map(str, missing))}, listed in its completion marker, is missing")
        )
