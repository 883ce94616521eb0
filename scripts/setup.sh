#!/usr/bin/env bash
# Prepare this checkout: Debian packages (Java, JDBC drivers), the .venv virtualenv with
# the pinned requirements, and the editable `lakehouse` package. Idempotent: when the
# inputs (requirements.txt, requirements.lock, pyproject.toml, Python version) are
# unchanged since the last successful run, it only re-checks the results (< 2 s).
# Force a full re-install with: rm .venv/.setup-stamp
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

VENV="$ROOT/.venv"
STAMP="$VENV/.setup-stamp"
PIP_VERSION="26.3"
JDBC_JARS=(/usr/share/java/sqlite-jdbc.jar /usr/share/java/postgresql.jar)
ICEBERG_JAR_REL="lib/python3.11/site-packages/snowpark_connect_deps_iceberg/jars/iceberg-spark-runtime-3.5_2.12-1.10.2.jar"
ICEBERG_JAR_SIZE=47157008

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

# --- 1. Debian packages (only what is missing) --------------------------------------
missing=()
command -v java >/dev/null 2>&1 || missing+=(openjdk-17-jre-headless)
[ -e "${JDBC_JARS[0]}" ] || missing+=(libxerial-sqlite-jdbc-java)
[ -e "${JDBC_JARS[1]}" ] || missing+=(libpostgresql-jdbc-java)
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

KEY="$(cat requirements.txt requirements.lock pyproject.toml devstack/pyproject.toml | sha256sum | cut -d' ' -f1)"
KEY="$KEY $("$VENV/bin/python" -V 2>&1) pip=$PIP_VERSION"

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$KEY" ]; then
  say "Python environment up to date (.venv)"
else
  rm -f "$STAMP"
  if [ "$("$VENV/bin/python" -m pip --version 2>/dev/null | cut -d' ' -f2)" != "$PIP_VERSION" ]; then
    say "pip $PIP_VERSION"
    quiet "$VENV/bin/python" -m pip install "pip==$PIP_VERSION"
  fi
  say "installing requirements.txt with requirements.lock constraints (first run: a few minutes)"
  quiet "$VENV/bin/python" -m pip install -r requirements.txt -c requirements.lock
  say "installing the lakehouse package (editable)"
  quiet "$VENV/bin/python" -m pip install --no-deps -e .
  say "installing the development stack (editable, outside the product wheel)"
  quiet "$VENV/bin/python" -m pip install --no-deps -e devstack
  say "pip check"
  quiet "$VENV/bin/python" -m pip check
  NEW_STAMP=1
fi

# --- 3. Verify the results (every run) ---------------------------------------------------
problems=()
if command -v java >/dev/null 2>&1; then
  JAVA_VERSION="$(java -version 2>&1 | head -n 1)"
else
  problems+=("java not found on PATH (Debian: openjdk-17-jre-headless)")
fi
for jar in "${JDBC_JARS[@]}"; do
  [ -e "$jar" ] || problems+=("JDBC driver missing: $jar")
done
JAR="$VENV/$ICEBERG_JAR_REL"
if [ ! -f "$JAR" ]; then
  problems+=("Iceberg Spark runtime missing: $JAR (snowpark-connect-deps-iceberg==1.0.2)")
elif [ "$(stat -c %s "$JAR")" -ne "$ICEBERG_JAR_SIZE" ]; then
  problems+=("Iceberg Spark runtime has $(stat -c %s "$JAR") bytes, expected $ICEBERG_JAR_SIZE (is snowpark-connect-deps-iceberg 1.0.2 installed?)")
fi
[ -x "$VENV/bin/lakehouse" ] || problems+=("console script .venv/bin/lakehouse missing (pip install -e . failed?)")

if [ ${#problems[@]} -gt 0 ]; then
  for p in "${problems[@]}"; do echo "setup: ERROR: $p" >&2; done
  [ -z "$apt_hint" ] || echo "setup: $apt_hint" >&2
  exit 1
fi

[ -z "${NEW_STAMP:-}" ] || echo "$KEY" >"$STAMP"
say "java: $JAVA_VERSION"
say "ready in $((SECONDS - START)) s (.venv/bin/python, .venv/bin/lakehouse, Iceberg jar ok)"
