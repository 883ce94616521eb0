"""Storage paths: where a URI points, as every client that may read it takes it.

A table's folder is compared segment by segment (`StoragePath`), only in its plain form
(`canonical_path`); another table's paths in every form some client may read them in (`readings`).
`assigned_locations` says where a catalog puts a table nobody gave a location, `catalog_server` which
catalog a configured name opens. The ownership proof (`lakehouse.upkeep.ownership`) reasons with them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import unquote

from lakehouse.core import config

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]+):(.*)", re.DOTALL)  # two letters at least: C:/ is a drive
# Schemes that name the same objects: Iceberg's S3FileIO (s3) and Hadoop's S3A (s3a, and the older s3n).
_SAME_SCHEME = {"s3a": "s3", "s3n": "s3"}


@dataclass(frozen=True)
class StoragePath:
    """A folder or file of a filesystem or object store, compared segment by segment: `s3://b/wh/t` holds
    `s3a://b/wh/t/data/x.parquet` but not `s3://b/wh/t_dlq` (a prefix of the text is not a folder)."""

    scheme: str
    authority: str
    segments: tuple[str, ...]

    def within(self, other: StoragePath) -> bool:
        """Whether this is `other` or lies inside it."""
        return ((self.scheme, self.authority) == (other.scheme, other.authority)
                and self.segments[:len(other.segments)] == other.segments)

    def __str__(self) -> str:
        return f"{self.scheme}://{self.authority}/{'/'.join(self.segments)}"


def _split(uri: str) -> tuple[str, str, str] | None:
    """(scheme, authority, path) of `uri` read literally, or None for a relative path. A bare absolute path
    is a file: path; s3a and s3n are s3; a file: URI's `localhost` authority is none."""
    found = _SCHEME.fullmatch(uri)
    if found is None:
        if not uri.startswith("/"):
            return None
        scheme, rest = "file", uri
    else:
        scheme, rest = found.group(1).lower(), found.group(2)
    scheme = _SAME_SCHEME.get(scheme, scheme)
    authority = ""
    if rest.startswith("//"):
        authority, slash, path = rest[2:].partition("/")
        rest = slash + path
    authority = authority.lower()
    if scheme == "file" and authority == "localhost":
        authority = ""
    return scheme, authority, rest


def canonical_path(uri: str) -> StoragePath | None:
    """`uri` as the one place every client takes it for, or None when clients may disagree about it: a
    relative path, `.` or `..` segments (an object store keeps them as key characters, a filesystem
    resolves them), an empty segment (`a//b`), a query, fragment or percent-escape (some clients cut or
    decode them, others do not), a backslash or a control character, or an opaque `scheme:path` whose path
    does not start at a root (`a0:0`: a folder "0" to one client, the root to another). A table is proven to
    own only a location of this plain form."""
    if not uri or any(c in uri for c in "?#%\\") or any(ord(c) < 32 or ord(c) == 127 for c in uri):
        return None
    parts = _split(uri)
    if parts is None:
        return None
    scheme, authority, path = parts
    if path and not path.startswith("/"):
        return None
    segments = path.rstrip("/").split("/")[1:] if path.rstrip("/") else []
    if any(s in ("", ".", "..") for s in segments):
        return None
    return StoragePath(scheme, authority, tuple(segments))


def _resolved(segments: Iterable[str]) -> tuple[str, ...]:
    """`segments` with `.` dropped and `..` taking the one before it, as a filesystem resolves them."""
    out: list[str] = []
    for segment in segments:
        if segment == "..":
            if out:
                out.pop()
        elif segment != ".":
            out.append(segment)
    return tuple(out)


def readings(uri: str) -> set[StoragePath]:
    """Every place some client may take `uri` for: read literally or with its query and fragment cut off,
    percent-escapes kept or decoded, backslashes kept or taken as slashes, `.` and `..` segments kept (an
    object store's key) or resolved (a filesystem), empty segments dropped. Empty for a relative path.
    Another table's paths are checked in every reading, so that no spelling of them hides an overlap."""
    texts = {uri, re.split(r"[?#]", uri, maxsplit=1)[0]}
    texts |= {unquote(text) for text in texts}
    texts |= {text.replace("\\", "/") for text in texts}
    found = set()
    for text in texts:
        parts = _split(text)
        if parts is None:
            continue
        scheme, authority, path = parts
        segments = [s for s in path.split("/") if s]
        found.add(StoragePath(scheme, authority, tuple(segments)))
        found.add(StoragePath(scheme, authority, _resolved(segments)))
    return found


def assigned_locations(kind: str, warehouse: str | None, namespace: tuple[str, ...], name: str,
                       namespace_location: str | None) -> list[str]:
    """Where a catalog of type `kind` puts table `namespace`.`name` when nobody names a location: inside
    the namespace's `location` when it has one (pyiceberg's catalogs; a REST server over Iceberg's
    JdbcCatalog reports its default there), and inside the warehouse as that type lays tables out:
    `<warehouse>/<ns>/<table>` for JDBC and REST (Iceberg's JdbcCatalog and pyiceberg's SqlCatalog alike),
    `<warehouse>/<ns>.db/<table>` for Hive and Glue."""
    found = []
    if namespace_location:
        found.append(f"{namespace_location.rstrip('/')}/{name}")
    if warehouse:
        base = warehouse.rstrip("/")
        if kind in ("hive", "glue"):
            found.append(f"{base}/{'.'.join(namespace)}.db/{name}")
        else:
            found.append(f"{base}/{'/'.join(namespace)}/{name}")
    return list(dict.fromkeys(found))


def catalog_server(settings: config.CatalogConfig) -> tuple:
    """Which catalog `settings` opens, so that one table listed under two names is known as one: a JDBC
    catalog is its database and its name (Iceberg keys a JDBC catalog's tables by catalog name, so two
    names are two catalogs), any other catalog the service it talks to (two names of one REST server list
    the same tables; they are told apart by their tables' UUIDs)."""
    if settings.type == "jdbc":
        return ("jdbc", settings.uri, settings.name)
    return (settings.type, settings.uri, settings.properties.get("prefix", ""))
