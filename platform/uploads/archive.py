"""One adapter directory uploaded as a `.zip` or `.tar.gz`: checked whole, then only the two
adapter files are copied out, under fixed names.

Before a byte is expanded, every entry is checked: no absolute paths, no `..` and no
backslashes (zip slip), no links or special files (a symlink pointing at a server file), no
pickle files, at most `MAX_MEMBERS` entries, and declared sizes adding up to at most the
upload limit (zip bomb). Copies stop at the declared size, so an entry that lies about it
cannot expand further. Entries are never extracted by their own names: a malicious name has
nowhere to write.
"""

from __future__ import annotations

import stat
import tarfile
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

from loraplex.engine.lora.adapter import PICKLE_SUFFIXES
from loraplex.platform.errors import InvalidRequestError, PayloadTooLargeError
from loraplex.platform.storage import ADAPTER_FILES
from loraplex.platform.uploads.multipart import TAR_FILE, ZIP_FILE

MAX_MEMBERS = 16
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Member:
    name: str
    size: int
    kind: str  # "file", "dir" or what else it is ("symlink", "hard link", "device", ...)


def extract_adapter_archive(archive: Path, dest: Path, max_bytes: int) -> None:
    """Copy the adapter files of `archive` into `dest`; 400 / 413 with the reason otherwise."""
    try:
        if archive.name == ZIP_FILE:
            _extract_zip(archive, dest, max_bytes)
        else:
            assert archive.name == TAR_FILE
            _extract_tar(archive, dest, max_bytes)
    except (zipfile.BadZipFile, tarfile.TarError, zlib.error, EOFError, OSError) as e:
        raise InvalidRequestError(f"the archive is damaged or truncated: {e}") from e


def check_members(members: list[Member], max_bytes: int) -> dict[str, str]:
    """Which entry holds each adapter file ({adapter file: entry name}), after every check."""
    if len(members) > MAX_MEMBERS:
        raise InvalidRequestError(f"the archive has more than {MAX_MEMBERS} entries")
    total = 0
    found: dict[str, str] = {}
    for member in members:
        path = PurePosixPath(member.name)
        if member.name.startswith("/") or "\\" in member.name or ".." in path.parts:
            raise InvalidRequestError(f"unsafe path {member.name[:100]!r} in the archive")
        if member.kind not in ("file", "dir"):
            raise InvalidRequestError(
                f"the archive holds a {member.kind} ({member.name[:100]!r}); only files are "
                "accepted"
            )
        if member.kind == "dir":
            continue
        total += member.size
        if total > max_bytes:
            raise PayloadTooLargeError(
                f"the archive expands to more than LORAPLEX_MAX_ADAPTER_BYTES ({max_bytes} bytes)"
            )
        if path.name.lower().endswith(PICKLE_SUFFIXES):
            raise InvalidRequestError(
                f"{member.name[:100]!r}: pickle files are refused (loading one can run code)"
            )
        if path.name in ADAPTER_FILES:
            if path.name in found:
                raise InvalidRequestError(f"the archive holds two {path.name}")
            found[path.name] = member.name
    missing = [name for name in ADAPTER_FILES if name not in found]
    if missing:
        raise InvalidRequestError(f"the archive has no {' and '.join(missing)}")
    folders = {PurePosixPath(name).parent for name in found.values()}
    if len(folders) > 1 or len(next(iter(folders)).parts) > 1:
        raise InvalidRequestError(
            "the adapter files must sit together at the top of the archive or in one folder"
        )
    return found


def _extract_zip(archive: Path, dest: Path, max_bytes: int) -> None:
    with zipfile.ZipFile(archive) as zf:
        infos = zf.infolist()
        members = [Member(i.filename.rstrip("/"), i.file_size, _zip_kind(i)) for i in infos][
            : MAX_MEMBERS + 1
        ]
        for info in infos:
            if info.flag_bits & 0x1:
                raise InvalidRequestError("encrypted archives are refused")
        found = check_members(members, max_bytes)
        for target, name in found.items():
            info = zf.getinfo(name)
            with zf.open(info) as src:
                _copy(src, dest / target, info.file_size)


def _zip_kind(info: zipfile.ZipInfo) -> str:
    mode = info.external_attr >> 16
    if stat.S_ISLNK(mode):
        return "symlink"
    if info.is_dir():
        return "dir"
    if stat.S_IFMT(mode) not in (0, stat.S_IFREG):  # 0: no Unix type bits (a plain file)
        return "special file"
    return "file"


def _extract_tar(archive: Path, dest: Path, max_bytes: int) -> None:
    with tarfile.open(archive, mode="r:gz") as tf:
        infos: list[tarfile.TarInfo] = []
        while len(infos) <= MAX_MEMBERS:  # never read past the entry limit (tar bomb)
            info = tf.next()
            if info is None:
                break
            infos.append(info)
            if sum(i.size for i in infos if i.isfile()) > max_bytes:
                break  # check_members says so before the next entry is decompressed
        members = [Member(i.name.rstrip("/"), i.size, _tar_kind(i)) for i in infos]
        found = check_members(members, max_bytes)
        by_name = {i.name.rstrip("/"): i for i in infos}
        for target, name in found.items():
            info = by_name[name]
            src = tf.extractfile(info)
            assert src is not None  # a regular file
            with src:
                _copy(src, dest / target, info.size)


def _tar_kind(info: tarfile.TarInfo) -> str:
    kinds: list[tuple[Callable[[], bool], str]] = [
        (info.isfile, "file"),
        (info.isdir, "dir"),
        (info.issym, "symlink"),
        (info.islnk, "hard link"),
        (info.isdev, "device"),
    ]
    return next((kind for test, kind in kinds if test()), "special file")


def _copy(src: IO[bytes], target: Path, size: int) -> None:
    left = size
    with target.open("xb") as out:
        while left > 0:
            chunk = src.read(min(_CHUNK, left))
            if not chunk:
                raise InvalidRequestError(f"{target.name} is truncated in the archive")
            out.write(chunk)
            left -= len(chunk)
