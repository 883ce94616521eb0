"""The JVM parts of the development stack: Maven artifacts resolved by `make setup`, run with `java`.

Each part has a folder under `devstack/jvm/<part>/`: a `pom.xml` listing its artifacts, and `lib/`, where
`scripts/setup.sh` copies their runtime dependencies once (`mvn dependency:copy-dependencies` with
`devstack/jvm/settings.xml`, which keeps resolution on Maven Central); later runs are offline. `lib/`
is never committed. LAKEHOUSE_JVM_DIR points at another folder of the same layout (a shared cache).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from lakehouse.core.errors import ConfigurationError

JVM_DIR = Path(__file__).resolve().parents[1] / "jvm"


class JvmPartMissing(ConfigurationError):
    """A JVM part's artifacts were not resolved (or Java is missing); the message says what to run."""


def folder() -> Path:
    return Path(os.environ.get("LAKEHOUSE_JVM_DIR") or JVM_DIR)


def lib(part: str) -> Path:
    """The folder of `part`'s jars; JvmPartMissing when set-up has not filled it."""
    path = folder() / part / "lib"
    if not path.is_dir() or not any(path.glob("*.jar")):
        raise JvmPartMissing(f"the {part} jars are missing from {path}: run `make setup` (it resolves "
                             f"{folder() / part / 'pom.xml'} from Maven Central once)")
    return path


def classpath(part: str) -> str:
    """`part`'s classpath for `java -cp` (every jar of its lib folder)."""
    return str(lib(part) / "*")


def java() -> str:
    """The `java` executable: JAVA_HOME's, else the one on PATH; JvmPartMissing when there is none."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if not found:
        raise JvmPartMissing("no `java` on PATH and JAVA_HOME is not set: run `make setup` (Java 17)")
    return found
