"""A `source.schemas` folder: the writer schemas of a pipeline's wire formats, one file per schema id
(`<id>.avsc`, `<id>.proto`, `<id>.json`), read when the spec is loaded.

The folder is where the spec's writers put schemas, not a place to trust: only regular files are
read, each bounded, and a link, FIFO, device or socket named like a schema is refused, never followed
nor opened to block.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from pathlib import Path

# the schema registry's schema types by the extension of a file in a `source.schemas` folder
SCHEMA_FILE_TYPES = {".avsc": "AVRO", ".proto": "PROTOBUF", ".json": "JSON"}
SCHEMA_FOLDER_NAME = re.compile(r"[^\x00-\x1f]{1,1024}")  # what `source.schemas` may say
MAX_SCHEMA_FILES = 1000
MAX_SCHEMA_BYTES = 1024 * 1024  # one writer schema; a larger file is a mistake
# all of a folder's schemas: they are read at every spec load and travel to every Spark task with the spec
MAX_SCHEMA_FOLDER_BYTES = 64 * 1024 * 1024
MAX_SCHEMA_FOLDER_ENTRIES = 100_000  # names looked at in a folder, schemas or not
_SCHEMA_FILE = re.compile(r"([0-9]{1,10})(\.avsc|\.proto|\.json)")


_NOT_REGULAR = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a folder"))


def _not_regular(name: str, mode: int) -> ValueError:
    """The refusal of schema file `name`, which is not a regular file (`mode`), naming what it is."""
    if stat.S_ISLNK(mode):
        return ValueError(f"{name} is a symbolic link; a schema folder holds regular files only (a link may lead "
                          f"anywhere on this host): copy the schema into the folder instead")
    kind = next((kind for test, kind in _NOT_REGULAR if test(mode)), "not a regular file")
    return ValueError(f"{name} is {kind}, not a regular file; a schema folder holds regular files only: "
                      f"remove it or give it another name")


def read_schema_file(folder_fd: int, name: str) -> bytes:
    """The bytes of regular file `name` in the folder open as `folder_fd`, at most MAX_SCHEMA_BYTES.

    Looked at without following it (lstat), then opened without following a link (O_NOFOLLOW) and
    without blocking (O_NONBLOCK: a FIFO swapped in meanwhile opens at once) and checked again on the
    open file (fstat), so that nothing but a regular file of the folder is ever read."""
    mode = os.stat(name, dir_fd=folder_fd, follow_symlinks=False).st_mode
    if not stat.S_ISREG(mode):
        raise _not_regular(name, mode)
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC,
                     dir_fd=folder_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # replaced by a link since the lstat
            raise _not_regular(name, stat.S_IFLNK) from None
        raise
    try:
        opened = os.fstat(fd)
        if not stat.S_ISREG(opened.st_mode):
            raise _not_regular(name, opened.st_mode)
        if opened.st_size > MAX_SCHEMA_BYTES:
            raise ValueError(f"{name} is larger than {MAX_SCHEMA_BYTES} bytes")
        chunks, size = [], 0
        while size <= MAX_SCHEMA_BYTES:  # one byte more than allowed tells a file that grew meanwhile
            chunk = os.read(fd, MAX_SCHEMA_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > MAX_SCHEMA_BYTES:
            raise ValueError(f"{name} is larger than {MAX_SCHEMA_BYTES} bytes")
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_schema_folder(folder: Path) -> tuple[tuple[int, str, str], ...]:
    """The writer schemas of `folder`, (id, schema type, text) of each `<id>.avsc` (AVRO), `<id>.proto`
    (PROTOBUF) or `<id>.json` (JSON) file by id; () when there are none.

    The folder is where the spec's writers put schemas, not a place to trust: only regular files are
    read. A symbolic link (wherever it points), a FIFO, a device, a socket or a folder named like a
    schema is refused, never followed nor opened to block; each file is at most MAX_SCHEMA_BYTES, all
    of them MAX_SCHEMA_FOLDER_BYTES, and at most MAX_SCHEMA_FILES schemas (MAX_SCHEMA_FOLDER_ENTRIES
    names) are looked at. Raises OSError for a folder that cannot be read, ValueError (naming the file
    and what to do) for those, a file that is not UTF-8, or one id given twice (`3.avsc` beside
    `3.proto`)."""
    folder = Path(folder).resolve()
    if not folder.is_dir():
        return ()
    folder_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        named: list[tuple[int, str, str]] = []
        with os.scandir(folder_fd) as entries:
            for seen, entry in enumerate(entries):
                if seen >= MAX_SCHEMA_FOLDER_ENTRIES:
                    raise ValueError(f"more than {MAX_SCHEMA_FOLDER_ENTRIES} names in the folder; keep only the "
                                     f"writer schemas there")
                parsed = _SCHEMA_FILE.fullmatch(entry.name)
                if parsed is not None and int(parsed[1]) < 2 ** 31:
                    named.append((int(parsed[1]), SCHEMA_FILE_TYPES[parsed[2]], entry.name))
        if len(named) > MAX_SCHEMA_FILES:
            raise ValueError(f"{len(named)} schema files, at most {MAX_SCHEMA_FILES}")
        found: list[tuple[int, str, str]] = []
        total = 0
        for schema_id, schema_type, name in sorted(named):
            if found and found[-1][0] == schema_id:
                raise ValueError(f"schema id {schema_id} is given twice ({name} and another file)")
            data = read_schema_file(folder_fd, name)
            total += len(data)
            if total > MAX_SCHEMA_FOLDER_BYTES:
                raise ValueError(f"the schemas add up to more than {MAX_SCHEMA_FOLDER_BYTES} bytes; remove the "
                                 f"versions no producer writes any more")
            try:
                found.append((schema_id, schema_type, data.decode("utf-8")))
            except UnicodeDecodeError as exc:
                raise ValueError(f"{name} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
        return tuple(found)
    finally:
        os.close(folder_fd)
