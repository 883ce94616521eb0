"""The Spark session every job uses: Iceberg SQL extensions and the pipeline's catalogs (config.CatalogConfig)."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
import zipimport
from collections.abc import Iterable
from concurrent.futures import Future
from pathlib import Path
from urllib.parse import urlsplit

from lakehouse.core.adapters import pyspark_internals
from lakehouse.core.config import PlatformConfig

LOG4J = Path(__file__).with_name("log4j2.properties")


# Executor sizing on a standalone master: (Spark property, variable that overrides it, default).
_STANDALONE_SIZING = (
    ("spark.cores.max", "LAKEHOUSE_SPARK_CORES_MAX", "2"),
    ("spark.executor.cores", "LAKEHOUSE_SPARK_EXECUTOR_CORES", "1"),
    ("spark.executor.memory", "LAKEHOUSE_SPARK_EXECUTOR_MEMORY", "1g"),
)


def _on_loopback(master: str) -> bool:
    """Whether the master is local mode or a standalone master on this host's loopback."""
    if master.startswith("local"):
        return True
    host = urlsplit(master).hostname if "://" in master else None
    return host in ("127.0.0.1", "localhost")


def class_archive() -> Path | None:
    """Where this installation keeps its archive of the Spark driver's classes (AppCDS: the JVM maps the
    classes a Spark session loads instead of reading, verifying and linking them from the jars again, which
    takes a driver's start-up from about 10 s to 6 s here), whether or not it was made yet; None when
    LAKEHOUSE_SPARK_CLASS_ARCHIVE is `off` or no Java or PySpark is found.

    The JVM maps an archive only with the Java runtime and the class path it was made with, so its name holds
    a digest of both: another Java or PySpark finds no archive and starts as it would without one, and
    `make setup` (build_class_archive) makes the archive for what is installed.
    """
    if os.environ.get("LAKEHOUSE_SPARK_CLASS_ARCHIVE", "on").strip().lower() in ("off", "false", "0", "no"):
        return None
    java = Path(os.environ["JAVA_HOME"], "bin", "java") if os.environ.get("JAVA_HOME") else shutil.which("java")
    found = importlib.util.find_spec("pyspark")
    if not java or not Path(java).exists() or found is None or not found.origin:
        return None
    java = Path(java).resolve()
    spark_home = Path(os.environ.get("SPARK_HOME") or Path(found.origin).parent)
    release = java.parent.parent / "release"
    digest = hashlib.sha256()
    digest.update(str(java).encode())
    digest.update(release.read_bytes() if release.exists() else b"")
    for jar in sorted((spark_home / "jars").glob("*.jar")):
        digest.update(jar.name.encode())
    return Path(sys.prefix, "share", "lakehouse", f"spark-driver-{digest.hexdigest()[:16]}.jsa")


def build_class_archive(platform: PlatformConfig) -> Path | None:
    """Make this installation's archive of the Spark driver's classes (class_archive) unless it exists: a
    Spark session in a child process creates, writes, merges and reads an Iceberg table in a scratch folder,
    and its JVM writes the classes it loaded as it exits. Returns the archive (None when turned off).

    Raises RuntimeError, quoting the child's output, when the session fails or the JVM writes no archive.
    """
    target = class_archive()
    if target is None or target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="lakehouse-class-archive-") as scratch:
        partial = Path(scratch, "classes.jsa")
        env = {**os.environ, "LAKEHOUSE_SPARK_CLASS_ARCHIVE": "off",
               "LAKEHOUSE_SPARK_JAVA_OPTIONS": f"-XX:ArchiveClassesAtExit={partial} -Xlog:cds*=off"}
        done = subprocess.run([sys.executable, "-c", f"from lakehouse.core import sparkenv; "
                               f"sparkenv.exercise_session({scratch!r})"],
                              env=env, capture_output=True, text=True, timeout=600)
        if done.returncode != 0 or not partial.exists():
            raise RuntimeError(f"no class archive made (exit code {done.returncode}): {done.stderr[-2000:]}")
        os.replace(partial, target)
    return target


def exercise_session(scratch: str) -> None:
    """What a job's driver does, in brief, on a throwaway catalog (build_class_archive's child process)."""
    from lakehouse.core import config

    platform = config.load()
    scratch_catalog = {"spark.sql.catalog.scratch": "org.apache.iceberg.spark.SparkCatalog",
                       "spark.sql.catalog.scratch.type": "hadoop",
                       "spark.sql.catalog.scratch.warehouse": f"file://{scratch}/warehouse"}
    spark = session(dataclasses.replace(platform, spark_conf={**platform.spark_conf, **scratch_catalog}), [],
                    "lakehouse-class-archive")
    spark.sql("CREATE TABLE scratch.db.t (id BIGINT, name STRING, ts TIMESTAMP) USING iceberg "
              "PARTITIONED BY (days(ts))")
    rows = spark.range(1000).selectExpr("id", "CAST(id AS STRING) AS name", "TIMESTAMP '2026-01-01' AS ts")
    rows.mapInArrow(lambda batches: batches, rows.schema).writeTo("scratch.db.t").append()
    spark.sql("MERGE INTO scratch.db.t t USING (SELECT id, 'x' AS name FROM scratch.db.t WHERE id < 10) s "
              "ON t.id = s.id WHEN MATCHED THEN UPDATE SET t.name = s.name")
    spark.sql("SELECT name, count(*) FROM scratch.db.t GROUP BY name ORDER BY 2 DESC").collect()
    spark.table("scratch.db.t.snapshots").collect()
    spark.stop()


def java_options_of(side: str) -> str:
    """The JVM flags of a job's "driver" or "executor": the logging configuration, LAKEHOUSE_SPARK_JAVA_OPTIONS
    (GC, heap dumps; the tests trade peak speed for start-up time with -XX:TieredStopAtLevel=1) and, for the
    driver, which runs on this host with this installation's class path, the class archive when made (an
    executor may run elsewhere: it goes without)."""
    options = [f"-Dlog4j.configurationFile=file:{LOG4J}", os.environ.get("LAKEHOUSE_SPARK_JAVA_OPTIONS", "").strip()]
    archive = class_archive() if side == "driver" else None
    if archive is not None and archive.exists():
        options.append(f"-XX:SharedArchiveFile={archive}")
    return " ".join(filter(None, options))


def spark_conf(platform: PlatformConfig, catalogs: Iterable[str], app_name: str) -> dict[str, str]:
    """Spark properties for `catalogs` (each as config.CatalogConfig.spark_properties describes it), the
    Spark packages by Maven coordinates, and last the user's own (LAKEHOUSE_SPARK_CONF).

    An s3:// or s3a:// warehouse adds each catalog's S3FileIO settings (LAKEHOUSE_S3_*); any
    other warehouse leaves the catalogs on Iceberg's default FileIO.
    """
    master = platform.spark_master
    if master.startswith("local[") and "," not in master:
        # local mode gives a task one attempt unless told otherwise; allow retries like a cluster does
        master = master[:-1] + ",4]"
    java_options = java_options_of("executor")
    conf = {
        "spark.master": master,
        "spark.app.name": app_name,
        # by Maven coordinates (Ivy resolves them from ~/.m2, filled by `make setup`, then from Central)
        "spark.jars.packages": ",".join(platform.spark_packages),
        "spark.sql.extensions": "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions",
        # PySpark's daemon, with the reader's modules imported once before it forks the workers
        "spark.python.daemon.module": "lakehouse.core.python_daemon",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": os.environ.get("LAKEHOUSE_SHUFFLE_PARTITIONS", "4"),
        "spark.sql.execution.arrow.maxRecordsPerBatch": "10000",
        "spark.ui.enabled": os.environ.get("LAKEHOUSE_SPARK_UI", "false"),
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.extraJavaOptions": java_options_of("driver"),
        "spark.executor.extraJavaOptions": java_options,
        "spark.executorEnv.PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable),
        # Spark's UI and logs show these properties' values as *********(redacted): its default regex, plus a
        # REST catalog's credential
        "spark.redaction.regex": r"(?i)secret|password|token|access[.]key|credential",
    }
    if platform.jars:
        conf["spark.jars"] = ",".join(platform.jars)
    if master.startswith("spark://"):
        # a standalone master hands an application every free core unless capped: cap it, so the
        # continuous ingest job leaves cores for maintenance and backfills (LAKEHOUSE_SPARK_* below)
        for key, variable, default in _STANDALONE_SIZING:
            conf[key] = os.environ.get(variable) or default
    for name in catalogs:
        catalog = platform.catalog(name)
        for key, value in catalog.spark_properties().items():
            conf[f"spark.sql.catalog.{name}" + (f".{key}" if key else "")] = value
        if catalog.warehouse_on_s3 and catalog.object_store.endpoint:
            # an S3-compatible store that is not AWS: checksums only where the API requires them (the AWS SDK's
            # default since 2.30 sends CRC checksums such stores reject; apache/iceberg#14439)
            for side in ("driver", "executor"):
                conf[f"spark.{side}.extraJavaOptions"] += (" -Daws.requestChecksumCalculation=when_required"
                                                           " -Daws.responseChecksumValidation=when_required")
        for variable, value in catalog.object_store.aws_environment().items():
            # the development stack's generated key, for S3FileIO on every executor (redacted in Spark's UI)
            conf[f"spark.executorEnv.{variable}"] = value
    conf.update(platform.spark_conf)  # the user's own properties win
    return conf


# This process's claims on folders of Spark's local files, by root: the folder (its lock stays open, held, for the
# process's life: a JVM keeps the local folders it started with even after its session stops)
_scratch_claims: dict[Path, Path] = {}


def scratch_dir(platform: PlatformConfig) -> Path | None:
    """The folder this process gives its driver as spark.local.dir, under the stack's home, or None when the
    user chose Spark's local folders (spark.local.dir in LAKEHOUSE_SPARK_CONF, or SPARK_LOCAL_DIRS).

    Spark keeps a driver's files under spark.local.dir (default /tmp): shuffle blocks and, for a Python
    application, a copy of every spark.jars.packages jar (Iceberg's runtime and AWS bundle, ~120 MB). The
    JVM deletes them when it shuts down, but not when it is killed (kill -9, a supervisor's restart, an
    out-of-memory kill), and each such restart would leave its copy in /tmp. So each process claims its own
    folder under <home>/spark-local, held by an exclusive lock on `<folder>.lock` for the process's life, and
    each call removes the folders whose lock nobody holds (their process has ended). A home this process
    cannot write to leaves Spark's default, with a warning.
    """
    if "spark.local.dir" in platform.spark_conf or os.environ.get("SPARK_LOCAL_DIRS"):
        return None
    root = Path(platform.home) / "spark-local"
    try:
        if root not in _scratch_claims:
            _scratch_claims[root] = _claim(root)
        sweep_scratch(root)
    except OSError as exc:
        print(f"warning: Spark's local files stay in its default folder: cannot use {root} ({exc.strerror})",
              file=sys.stderr)
        return None
    return _scratch_claims[root]


def _claim(root: Path) -> Path:
    """A new folder under `root`, locked for the life of this process (the lock file stays open)."""
    root.mkdir(parents=True, exist_ok=True)
    folder = root / f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
    lock_path = folder.with_name(folder.name + ".lock")
    while True:  # the lock is held before the folder exists: a folder without a held lock is stale
        lock = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(lock, fcntl.LOCK_EX)
        with contextlib.suppress(FileNotFoundError):
            if os.stat(lock_path).st_ino == os.fstat(lock).st_ino:
                break  # not swept away between its creation and the lock (as a lock without its folder)
        os.close(lock)
    folder.mkdir(mode=0o700)
    return folder


def sweep_scratch(root: Path) -> None:
    """Remove the folders under `root` (scratch_dir's) whose process has ended, and their locks."""
    for entry in sorted(root.iterdir()):
        if entry.name.endswith(".lock"):
            entry, lock_path = entry.with_name(entry.name.removesuffix(".lock")), entry
            if entry.exists() or entry.is_symlink():
                continue  # the folder's own turn
        elif entry.is_dir() and not entry.is_symlink():
            lock_path = entry.with_name(entry.name + ".lock")
        else:
            continue
        try:
            lock = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError:
            continue
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(lock)
            continue  # its process still runs
        try:
            shutil.rmtree(entry, ignore_errors=True)
            lock_path.unlink(missing_ok=True)
        finally:
            os.close(lock)


def session(platform: PlatformConfig, catalogs: Iterable[str], app_name: str):
    """Get or create the SparkSession, with the Python workers on this interpreter.

    Under spark-submit (Airflow's SparkSubmitOperator) the master is the one spark-submit was
    given (the `spark_default` connection), not the platform's.
    """
    submitted = _submitted_master()
    if submitted:
        platform = dataclasses.replace(platform, spark_master=submitted)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if _on_loopback(platform.spark_master):
        # stay on loopback: a local master, or executors of a local cluster calling back to the driver
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from lakehouse.core.catalog import open_catalog

    for name in catalogs:
        open_catalog(platform, name, fresh=True)  # creates the JDBC catalog tables if they are missing
        # a local master's executors are the driver's JVM: it takes the stack's S3 key from its environment
        for variable, value in platform.catalog(name).object_store.aws_environment().items():
            os.environ.setdefault(variable, value)
    builder = SparkSession.builder
    local_dir = scratch_dir(platform)
    if local_dir is not None:
        builder = builder.config("spark.local.dir", str(local_dir))
    for key, value in spark_conf(platform, catalogs, app_name).items():
        builder = builder.config(key, value)
    with _jvm_output_to_stderr():
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("LAKEHOUSE_SPARK_LOG_LEVEL", "ERROR"))
    return spark


@contextlib.contextmanager
def _jvm_output_to_stderr():
    """While the block starts the JVM (PySpark's gateway inherits this process's file descriptors), its
    standard output is this process's standard error: Spark's Ivy prints its resolution of
    spark.jars.packages to the JVM's standard output, which is this process's `--json` answer. A JVM that
    already runs (a second session, spark-submit's) is left as it is."""
    if pyspark_internals.gateway() is not None or "PYSPARK_GATEWAY_PORT" in os.environ:
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _submitted_master() -> str | None:
    """spark-submit's --master when this driver was started by spark-submit, else None."""
    if "PYSPARK_GATEWAY_PORT" not in os.environ:  # set by spark-submit's PythonRunner only
        return None
    from pyspark import SparkConf

    pyspark_internals.join_submitted_jvm()  # joins spark-submit's JVM, whose properties hold --master
    return SparkConf().get("spark.master", None)


class _Callable:
    """A Python function the JVM can call as java.util.concurrent.Callable (py4j callback)."""

    def __init__(self, fn):
        self.fn = fn
        self.error: BaseException | None = None

    def call(self):
        try:
            self.fn()
        except BaseException as exc:  # surfaced again on the Python side
            self.error = exc
            raise
        return None

    class Java:
        implements = ["java.util.concurrent.Callable"]


def with_commit_properties(spark, properties: dict[str, str], fn) -> None:
    """Run `fn` (SQL such as MERGE INTO) so its Iceberg commit carries `properties` in the summary.

    DataFrame writes take `snapshot-property.*` options; SQL statements need
    Iceberg's CommitMetadata, which holds the properties in a JVM thread-local.
    PySpark's pinned-thread mode runs the callback on the calling JVM thread.
    """
    jvm = pyspark_internals.jvm(spark)
    props = jvm.java.util.HashMap()
    for key, value in properties.items():
        props.put(key, value)
    callable_ = _Callable(fn)
    try:
        jvm.org.apache.iceberg.spark.CommitMetadata.withCommitProperties(
            props, callable_, jvm.java.lang.RuntimeException().getClass())
    except Exception:
        if callable_.error is not None:
            raise callable_.error from None
        raise


def merge(spark, source, statement: str, properties: dict[str, str]) -> None:
    """Run a MERGE statement reading `source` (a DataFrame, `{source}` in the statement) in one
    Iceberg commit that carries `properties` in its snapshot summary."""
    view = f"lakehouse_source_{uuid.uuid4().hex}"
    source.createOrReplaceTempView(view)
    try:
        with_commit_properties(spark, properties, lambda: spark.sql(statement.format(source=view)))
    finally:
        spark.catalog.dropTempView(view)


@contextlib.contextmanager
def job_group(spark, group: str):
    """Run the Spark jobs started inside the block (on this thread) under job group `group`."""
    sc = spark.sparkContext
    sc.setJobGroup(group, group)
    try:
        yield group
    finally:
        pyspark_internals.java_context(spark).clearJobGroup()


# SparkContexts (by application id) whose Python workers warm_python_workers has started
_WARMED: set[str] = set()


def _import_modules(modules: tuple[str, ...], items) -> list[int]:
    import importlib

    steady_zip_imports()
    for name in modules:
        importlib.import_module(name)
    return [os.getpid() for _ in items]  # the input consumed: Spark reuses the worker afterwards


def warm_python_workers(spark, modules: tuple[str, ...]) -> Future[None]:
    """Start a Python worker on every task slot and import `modules` there, once per SparkContext, in a
    background thread; the future is done (with the Spark job's error, if any) when the workers are.

    A worker imports pyiceberg, pyarrow and the reader the first time it runs a task (1-2 s here):
    without this, the first batch large enough for a second task stalls that long mid-stream. Started
    with the session, the warm-up runs while the driver checks its tables (with lakehouse.core.python_daemon,
    the workers are forked with the modules imported already).
    """
    from pyspark import InheritableThread

    done: Future[None] = Future()
    sc = spark.sparkContext
    if sc.applicationId in _WARMED:
        done.set_result(None)
        return done

    def warm() -> None:
        try:
            slots = sc.defaultParallelism
            sc.parallelize(range(slots), slots).mapPartitions(lambda items: _import_modules(modules, items)).collect()
            _WARMED.add(sc.applicationId)
            done.set_result(None)
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits for the warm-up
            done.set_exception(exc)

    # a daemon thread: a driver that fails before it waits does not wait for the warm-up at exit
    InheritableThread(target=warm, name="lakehouse-warm-python-workers", daemon=True).start()
    return done


class _SteadyZipImporter(zipimport.zipimporter):
    """A zip importer for an archive that does not change: invalidating its caches does nothing."""

    def invalidate_caches(self) -> None:
        pass


def steady_zip_imports() -> None:
    """In a Spark Python worker: stop re-reading the zip archives on `sys.path` at every task.

    PySpark 3.5's worker calls `importlib.invalidate_caches()` at the start of each task, and on
    Python 3.11 every cached zip importer then re-reads its archive's directory (CPython
    gh-103200, SPARK-54744): pyspark.zip and py4j's zip, whose directories do not change while
    a worker lives. That was most of a task's fixed cost here (a no-op job's tasks started
    0.3-0.44 s after the job, 0.12-0.16 s without it).

    The zip importers cached so far are replaced by ones whose invalidate_caches is a no-op, and so is
    the path hook that makes the next ones: a task that imports a package from a zip (pyspark.sql's
    subpackages) caches an importer per package folder, each of which re-read all of pyspark.zip at the
    next task's start (0.2-0.4 s at the start of an ingest job's second batch, measured). Called by
    the Python daemon before it forks a worker (lakehouse.core.python_daemon) and by each task function
    (PySpark's own daemon). An archive added later (`addPyFile`) is read when first imported from.
    """
    sys.path_hooks[:] = [_SteadyZipImporter if hook is zipimport.zipimporter else hook for hook in sys.path_hooks]
    for path, finder in list(sys.path_importer_cache.items()):
        if type(finder) is zipimport.zipimporter:
            sys.path_importer_cache[path] = _SteadyZipImporter(path)


def describe_error(exc: BaseException) -> str:
    """One readable paragraph: the Python error and, for JVM errors, the chain of Java causes."""
    text = str(exc).strip()
    lines = [f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"]
    seen: BaseException | None = exc
    while seen is not None:
        java = getattr(seen, "java_exception", None)
        if java is not None:
            cause, depth = java, 0
            while cause is not None and depth < 8:
                lines.append(f"  caused by {cause.toString()}")
                cause, depth = cause.getCause(), depth + 1
            break
        seen = seen.__cause__
    return "\n".join(lines)[:4000]
