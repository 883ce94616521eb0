"""Check every jar and archive scripts/setup.sh fetches from Maven Central against a pinned sha256.

Maven checks a download against the checksum file served next to it, by the same server: that catches a
broken transfer, not a replaced artifact. The sha256 of each file set-up fetches is therefore pinned in
scripts/artifacts.sha256 (committed, one `<sha256>  <path>` line per file), and set-up refuses a file whose
hash differs, a fetched file with no pin, and a pinned file that is missing. Paths are those set-up uses:

    devstack/jvm/<part>/lib/<file>      a JVM part of the development stack (mvn dependency:copy-dependencies)
    bench/jvm/<part>/lib/<file>         a peer of the benchmark (the same, `scripts/setup.sh --bench`)
    ~/.m2/repository/<group>/...        a Spark package or its runtime dependencies (mvn dependency:get),
                                        where Spark's Ivy resolves spark.jars.packages from

Commands (standard library only; set-up runs it with the .venv's Python):

    verify_artifacts.py check-dir DIR         every file of DIR pinned and matching, every pin of DIR present
    verify_artifacts.py check-m2 COORD...     the Spark packages (group:artifact:version) and every pinned
                                              ~/.m2 file, present and matching
    verify_artifacts.py pin [--yes]           after changing a pom or lakehouse.core.config.SPARK_PACKAGES:
                                              fetch everything into a scratch folder with mvn and rewrite
                                              scripts/artifacts.sha256 (review its diff before committing)

Exit codes: 0 all verified; 1 a file differs, is missing or is not pinned (the message says what to do).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PINS = ROOT / "scripts" / "artifacts.sha256"
M2 = "~/.m2/repository/"
CHUNK = 1 << 20


class VerificationError(Exception):
    """A fetched file is not the one pinned (or not pinned, or missing); the message says what to do."""


@dataclass(frozen=True)
class Pins:
    """The pinned sha256 of each path, from a pins file (`<sha256>  <path>` lines, `#` comments)."""

    source: Path
    digests: dict[str, str]

    @classmethod
    def load(cls, source: Path = PINS) -> Pins:
        digests: dict[str, str] = {}
        for number, line in enumerate(source.read_text().splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            digest, _, path = line.partition("  ")
            digest, path = digest.strip().lower(), path.strip()
            if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest) or not path:
                raise VerificationError(f"{source}:{number}: expected `<sha256, 64 hex digits>  <path>`, got {line!r}")
            if path in digests:
                raise VerificationError(f"{source}:{number}: {path} is pinned twice")
            digests[path] = digest
        return cls(source, digests)

    def under(self, prefix: str) -> dict[str, str]:
        return {path: digest for path, digest in self.digests.items() if path.startswith(prefix)}


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def m2_root() -> Path:
    return Path(os.path.expanduser(M2))


def resolve(key: str, root: Path = ROOT) -> Path:
    """The file a pinned path names: ~/.m2/... in the local Maven repository, anything else under the repo."""
    if key.startswith(M2):
        return m2_root() / key[len(M2):]
    return root / key


def m2_key(coordinate: str) -> str:
    """The pinned path of a Maven coordinate's jar, group:artifact:version[:classifier]."""
    parts = coordinate.split(":")
    if len(parts) not in (3, 4) or not all(parts):
        raise VerificationError(f"{coordinate!r} is not a Maven coordinate group:artifact:version")
    group, artifact, version = parts[:3]
    classifier = f"-{parts[3]}" if len(parts) == 4 else ""
    return f"{M2}{group.replace('.', '/')}/{artifact}/{version}/{artifact}-{version}{classifier}.jar"


def _mismatch(key: str, actual: str, pinned: str, pins: Pins, refetch: str) -> str:
    return (f"{key}: sha256 {actual}, but {pins.source.name} pins {pinned}. This is not the file pinned: a "
            f"tampered or corrupted download, or a changed version. If you did not change what set-up fetches: "
            f"{refetch} and run `make setup` again (a second mismatch means the file served is not the one "
            f"pinned: do not use it). If you changed a version on purpose: run "
            f"`.venv/bin/python scripts/verify_artifacts.py pin` and review the diff of {pins.source}.")


def check_files(pins: Pins, keys: dict[str, Path], refetch: Callable[[str], str]) -> list[str]:
    """The problems of the files keys names (pinned path -> file), each with what to do (refetch(key))."""
    problems = []
    for key, path in sorted(keys.items()):
        pinned = pins.digests.get(key)
        if pinned is None:
            problems.append(f"{key} is fetched by set-up but has no pinned sha256 in {pins.source}: if it is "
                            f"expected (a new or changed dependency), run "
                            f"`.venv/bin/python scripts/verify_artifacts.py pin` and review the diff")
        elif not path.is_file():
            problems.append(f"{key} is pinned in {pins.source} but missing: {refetch(key)} and run `make setup` again")
        else:
            actual = sha256(path)
            if actual != pinned:
                problems.append(_mismatch(key, actual, pinned, pins, refetch(key)))
    return problems


def check_dir(directory: Path, pins: Pins, root: Path = ROOT) -> list[str]:
    """Every file in directory pinned and matching; every pin of the directory present."""
    prefix = directory.resolve().relative_to(root.resolve()).as_posix() + "/"
    keys = {prefix + entry.name: entry for entry in directory.iterdir()
            if entry.is_file() and not entry.name.startswith(".")}
    keys.update({key: root / key for key in pins.under(prefix) if key[len(prefix):].count("/") == 0})
    # mvn copies from its local repository: a bad file there comes back on the next run unless deleted
    return check_files(pins, keys, lambda key: f"delete Maven's copy (find ~/.m2/repository -name "
                                               f"'{key.rsplit('/', 1)[-1]}' -delete), rm -rf {prefix.rstrip('/')}")


def check_m2(coordinates: list[str], pins: Pins) -> list[str]:
    """Each coordinate's jar and every pinned ~/.m2 file (their runtime dependencies) present and matching."""
    keys = {key: resolve(key) for key in pins.under(M2)}
    keys.update({m2_key(c): resolve(m2_key(c)) for c in coordinates})
    return check_files(pins, keys, lambda key: f"delete {key}")


# --- pin: regenerate scripts/artifacts.sha256 -----------------------------------------------------------
SPARK_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>
<groupId>lakehouse.pin</groupId><artifactId>spark-packages</artifactId><version>1</version><packaging>pom</packaging>
<dependencies>{}</dependencies></project>"""


def _mvn(*args: str) -> None:
    settings = ROOT / "devstack" / "jvm" / "settings.xml"
    subprocess.run(["mvn", "-B", "-q", "-s", str(settings), f"-Dmaven.repo.local={m2_root()}", *args], check=True)


def jvm_poms() -> list[Path]:
    """The pom.xml of each JVM part set-up resolves into <folder>/<part>/lib: the development stack's, and
    the benchmark's peers (`scripts/setup.sh --bench`)."""
    return sorted([*(ROOT / "devstack" / "jvm").glob("*/pom.xml"), *(ROOT / "bench" / "jvm").glob("*/pom.xml")])


def pin() -> str:
    """The pins file's text for what set-up fetches today (runs mvn; Maven Central's checksums are checked)."""
    sys.path.insert(0, str(ROOT / "include"))
    from lakehouse.core.config import SPARK_PACKAGES

    lines = [line for line in PINS.read_text().splitlines() if line.startswith("#")] if PINS.exists() else []
    with tempfile.TemporaryDirectory() as scratch:
        for pom in jvm_poms():
            out = Path(scratch) / pom.parent.name
            _mvn("-C", "-f", str(pom), "dependency:copy-dependencies", "-DincludeScope=runtime",
                 f"-DoutputDirectory={out}")
            prefix = (pom.parent / "lib").relative_to(ROOT).as_posix()
            lines += [f"{sha256(f)}  {prefix}/{f.name}" for f in sorted(out.iterdir()) if f.is_file()]
        dependencies = "".join(
            f"<dependency><groupId>{g}</groupId><artifactId>{a}</artifactId><version>{v}</version></dependency>"
            for g, a, v in (c.split(":")[:3] for c in SPARK_PACKAGES))
        pom = Path(scratch) / "pom.xml"
        pom.write_text(SPARK_POM.format(dependencies))
        listing = Path(scratch) / "list.txt"
        _mvn("-C", "-f", str(pom), "dependency:list", "-DincludeScope=runtime", f"-DoutputFile={listing}")
        for line in sorted(listing.read_text().splitlines()):
            fields = line.strip().split(":")  # group:artifact:type[:classifier]:version:scope
            if len(fields) < 5 or fields[2] != "jar":
                continue
            coordinate = ":".join([fields[0], fields[1], fields[-2], *fields[3:-2]])
            key = m2_key(coordinate)
            lines.append(f"{sha256(resolve(key))}  {key}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("check-dir").add_argument("directory", type=Path)
    commands.add_parser("check-m2").add_argument("coordinates", nargs="*")
    commands.add_parser("pin")
    parser.add_argument("--pins", type=Path, default=PINS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.command == "pin":
        PINS.write_text(pin())
        print(f"verify_artifacts: wrote {PINS}: review `git diff {PINS.relative_to(ROOT)}` before committing")
        return 0
    try:
        pins = Pins.load(args.pins)
        if args.command == "check-dir":
            problems = check_dir(args.directory, pins)
        else:
            problems = check_m2(args.coordinates, pins)
    except VerificationError as error:
        problems = [str(error)]
    for problem in problems:
        print(f"setup: ERROR: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
