"""Which releases of a package on PyPI ship a given file, read from each wheel's file list without downloading it.

A wheel is a zip whose directory sits at its end: two HTTP range requests per release (the end record, then the
directory) give every file name, a few hundred kilobytes instead of the whole wheel. The Peers table of docs/findings.md
says which vLLM releases carry Ouro this way:

    python scripts/wheel_files.py vllm vllm/model_executor/models/ouro.py 0.11.0 0.11.1 0.26.0 0.27.0 0.34.0

prints, per release, whether its x86-64 Linux wheel holds the file. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import struct
import urllib.parse
import urllib.request

INDEX = "https://pypi.org/pypi/{package}/json"
TAIL = 65_536  # the end-of-central-directory record and a zip comment fit in the last 64 KiB


def fetch(url: str, first: int, last: int) -> bytes:
    """Bytes first..last (inclusive) of `url`."""
    request = urllib.request.Request(url, headers={"Range": f"bytes={first}-{last}"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return response.read()


def wheel_names(url: str, size: int) -> list[str]:
    """The file names of the zip at `url` (`size` bytes), from its central directory (zip64 too)."""
    tail = fetch(url, max(0, size - TAIL), size - 1)
    end = tail.rfind(b"PK\x05\x06")
    directory_size, offset = struct.unpack("<II", tail[end + 12 : end + 20])
    if offset == 0xFFFFFFFF:  # zip64: the real offset and size are in the zip64 end record
        end64 = tail.rfind(b"PK\x06\x06")
        directory_size, offset = struct.unpack("<QQ", tail[end64 + 40 : end64 + 56])
    directory, names, at = fetch(url, offset, offset + directory_size - 1), [], 0
    while directory[at : at + 4] == b"PK\x01\x02":
        name, extra, comment = struct.unpack("<HHH", directory[at + 28 : at + 34])
        names.append(directory[at + 46 : at + 46 + name].decode())
        at += 46 + name + extra + comment
    return names


def linux_wheel(package: str, release: str, index: dict) -> tuple[str, int]:
    """(URL, size) of the release's x86-64 Linux wheel."""
    files = [
        f for f in index["releases"].get(release, []) if f["filename"].endswith(".whl") and "x86_64" in f["filename"]
    ]
    if not files:
        raise SystemExit(f"{package} {release}: no x86-64 wheel on the index")
    return urllib.parse.urljoin(INDEX.format(package=package), files[0]["url"]), files[0]["size"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package")
    parser.add_argument("path", help="a file's path inside the wheel")
    parser.add_argument("releases", nargs="+")
    args = parser.parse_args()
    with urllib.request.urlopen(INDEX.format(package=args.package), timeout=120) as response:
        index = json.load(response)
    for release in args.releases:
        names = wheel_names(*linux_wheel(args.package, release, index))
        print(f"{args.package} {release}: {'has' if args.path in names else 'lacks'} {args.path} ({len(names)} files)")


if __name__ == "__main__":
    main()
