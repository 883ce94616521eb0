"""The package's shape, checked: each concern imports only the floors below it, the product
never imports the development stack or the tests, and every error it raises on purpose is a
LakehouseError defined in lakehouse/core/errors.py, with an exit code of the one table (EXIT_CODES)
that the CLI's docstring and docs/cli.md repeat.

Floors (docs/architecture.md): core <- ingest <- {upkeep, recovery, ops, audit} <- wap <- cli.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import pytest

import lakehouse
import lakehouse_dev
from lakehouse import cli
from lakehouse.core import config, errors, topics

PACKAGE = Path(lakehouse.__file__).parent
FLOOR = {"core": 0, "ingest": 1, "upkeep": 2, "recovery": 2, "ops": 2, "audit": 2, "wap": 3, "cli": 4}
# exceptions that never leave their module: control flow inside a decoder, a generator or the gateway
INTERNAL = {"Rejected", "AuthenticationFailed"}


def _modules(package) -> list[str]:
    return [m.name for m in pkgutil.walk_packages(package.__path__, package.__name__ + ".")]


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


def _concern(dotted: str) -> str | None:
    parts = dotted.split(".")
    return parts[1] if parts[0] == "lakehouse" and len(parts) > 1 and parts[1] in FLOOR else None


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_a_module_imports_only_its_own_concern_and_the_floors_below(path):
    here = _concern("lakehouse." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts))
    if here is None:  # lakehouse/__init__.py
        return
    for target in _imports(path):
        assert not target.startswith(("lakehouse_dev", "tests", "e2e", "faults", "pgserver", "polling")), \
            f"{path.name} imports {target}: the product must not depend on the dev stack or the tests"
        there = _concern(target)
        if there is not None and there != here:
            assert FLOOR[there] < FLOOR[here], f"{here}/{path.name} imports {target}: a back edge to {there}"


def test_every_module_of_the_product_and_the_dev_stack_imports():
    for name in _modules(lakehouse) + _modules(lakehouse_dev):
        importlib.import_module(name)


def test_every_error_raised_on_purpose_is_a_lakehouse_error_with_an_exit_code():
    strays = []
    for name in _modules(lakehouse) + _modules(lakehouse_dev):
        module = importlib.import_module(name)
        for cls_name, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != name or not issubclass(cls, Exception) or issubclass(cls, Warning) \
                    or cls_name.startswith("_"):
                continue
            if cls_name in INTERNAL:
                continue
            if not issubclass(cls, errors.LakehouseError):
                strays.append(f"{name}.{cls_name}")
            else:
                assert cls.exit_code in errors.EXIT_CODES and cls.exit_code != errors.EXIT_OK, \
                    f"{name}.{cls_name} exits {cls.exit_code}, not an error code of errors.EXIT_CODES"
    assert not strays, f"exceptions outside the LakehouseError hierarchy: {strays}"


def test_the_product_wheel_leaves_the_dev_stack_and_the_tests_out():
    import tomllib

    from setuptools import find_packages

    root = PACKAGE.parents[1]
    found = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    shipped = find_packages(str(root / found["where"][0]), include=found["include"])
    assert "lakehouse.core" in shipped and "lakehouse.ingest" in shipped
    assert all(name == "lakehouse" or name.startswith("lakehouse.") for name in shipped), shipped
    assert Path(lakehouse_dev.__file__).parent.parent.name == "devstack"


def test_one_configuration_object_per_process_environment_and_stack_state(monkeypatch, tmp_path):
    from lakehouse.core import config

    monkeypatch.setenv("LAKEHOUSE_HOME", str(tmp_path / "a"))
    first = config.load()
    assert config.load() is first, "a second load must not read the environment and the stack again"
    monkeypatch.setenv("LAKEHOUSE_HOME", str(tmp_path / "b"))
    other = config.load()
    assert other is not first and other.home == (tmp_path / "b").resolve()
    assert config.load(fresh=True) is not other and config.load() is not other  # fresh replaces the cached one
    # another process starts a Spark cluster for this home: its state file changes, so does the configuration
    (tmp_path / "b" / "spark-cluster.json").parent.mkdir(parents=True)
    (tmp_path / "b" / "spark-cluster.json").write_text('{"master": "spark://127.0.0.1:7077"}')
    assert config.load().spark_master == "spark://127.0.0.1:7077"


def test_without_the_test_hook_file_a_fault_variable_injects_nothing(monkeypatch, tmp_path):
    """The product's fault hook is a no-op: LAKEHOUSE_FAULT alone neither kills nor marks anything."""
    from lakehouse.core import hooks

    monkeypatch.delenv(hooks.VARIABLE, raising=False)
    monkeypatch.setenv("LAKEHOUSE_FAULT", "after_files")
    hook = hooks.faults()
    assert type(hook) is hooks.FaultHook
    hook.check()
    hook.reached("after_files", home=tmp_path, pipeline="orders")  # would SIGKILL this process under the tests' hook
    assert hook.task_probe(tmp_path, "orders") is None
    assert not any(tmp_path.iterdir())


def test_the_test_hook_file_is_loaded_by_name_and_validates_the_fault(monkeypatch):
    from lakehouse.core import hooks

    monkeypatch.setenv("LAKEHOUSE_FAULT", "no_such_point")
    hook = hooks.faults()  # the suite's conftest points LAKEHOUSE_TEST_HOOKS at tests/support/faults.py
    assert type(hook) is not hooks.FaultHook
    with pytest.raises(ValueError, match="no_such_point"):
        hook.check()


# --- errors: one module, one base, one exit-code table ---------------------------------------------------------

REPO = Path(errors.__file__).parents[3]
ERRORS = Path(errors.__file__)
# Where the product's classes live: the package, the Airflow side (plugins/, or its provider distribution), the
# DAGs and the Spark jobs. The development stack (lakehouse_dev) is its own distribution with its own errors.
PRODUCT_ROOTS = ("include/lakehouse", "plugins", "providers", "dags", "spark_jobs")
# Exceptions that may be defined outside lakehouse/core/errors.py, each with the reason
ELSEWHERE = {
    # a record's verdict, not an error: decoders raise it, the reader turns it into a dead-letter row
    ("ingest/rejects.py", "Rejected"),
}
# Airflow's way to fail a task without retries; the product's core cannot import Airflow
AIRFLOW_FAIL = "airflow.sdk.exceptions.AirflowFailException"


def _resolve(dotted: str):
    """The object named `dotted` (a module path, then attributes; or a builtin), None when nothing is found."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:i]))
        except (ImportError, ValueError, TypeError):
            continue
        for name in parts[i:]:
            found = getattr(found, name, None)
        return found
    return getattr(builtins, dotted, None)


def _exception_classes(path: Path) -> list[tuple[str, list[str], bool]]:
    """(name, the dotted names of its bases, whether it is a Warning) of each class `path` defines that derives
    from BaseException, decided from the source: a base is a class of the same file or an imported name (or a
    builtin), resolved by importing it."""
    tree = ast.parse(path.read_text())
    imported: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            imported.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names})
        elif isinstance(node, ast.Import):
            for a in node.names:
                imported[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
    local = {node.name: node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}

    def dotted(base: ast.expr) -> str:
        head, _, rest = ast.unparse(base).partition(".")
        return imported[head] + (f".{rest}" if rest else "") if head in imported else ast.unparse(base)

    def derives(base: ast.expr, kind: type, seen: frozenset) -> bool:
        name = ast.unparse(base)
        if name in local and name not in imported:
            return name not in seen and any(derives(b, kind, seen | {name}) for b in local[name].bases)
        found = _resolve(dotted(base))
        return isinstance(found, type) and issubclass(found, kind)

    return [(node.name, [dotted(b) for b in node.bases],
             any(derives(b, Warning, frozenset({node.name})) for b in node.bases))
            for node in local.values() if any(derives(b, BaseException, frozenset({node.name})) for b in node.bases)]


def _product_files() -> list[Path]:
    return sorted(f for root in PRODUCT_ROOTS if (REPO / root).is_dir() for f in (REPO / root).rglob("*.py"))


def test_every_error_of_the_product_is_defined_in_core_errors():
    """One home for every exception: a class deriving from Exception (directly or through LakehouseError) outside
    lakehouse/core/errors.py fails, except those ELSEWHERE names, warning categories, a module's private control
    flow (a `_Name` no other module mentions) and the Airflow tasks' AirflowFailException subclasses."""
    package = REPO / "include" / "lakehouse"
    files = _product_files()
    assert ERRORS in files and len(files) > 50, "the product's source was not found"
    strays, leaked = [], []
    for path in files:
        if path == ERRORS:
            continue
        inside = path.is_relative_to(package)
        where = str(path.relative_to(package if inside else REPO))
        for name, bases, warning in _exception_classes(path):
            if (where, name) in ELSEWHERE or warning or (AIRFLOW_FAIL in bases and not inside):
                continue
            if name.startswith("_"):
                leaked += [f"{other.relative_to(REPO)} names {where}'s {name}" for other in files
                           if other != path and re.search(rf"\b{name}\b", other.read_text())]
                continue
            strays.append(f"{where}: class {name}({', '.join(bases)})")
    assert not strays, "errors defined outside lakehouse/core/errors.py (move them there, under LakehouseError):\n" \
        + "\n".join(strays)
    assert not leaked, f"a private exception left its module: {leaked}"


def test_the_source_check_finds_an_error_defined_elsewhere(tmp_path):
    """The check above is not vacuous: it sees an error class through an imported base, through a local one and
    through a builtin, tells a warning category, and leaves a plain class alone."""
    module = tmp_path / "stray.py"
    module.write_text("from lakehouse.core.errors import CommitError\nfrom lakehouse.core import errors\n\n"
                      "class A(CommitError): pass\nclass B(A): pass\nclass C(errors.SourceError): pass\n"
                      "class D(KeyError): pass\nclass E: pass\nclass F(E, dict): pass\nclass W(UserWarning): pass\n")
    found = {name: (bases, warning) for name, bases, warning in _exception_classes(module)}
    assert list(found) == ["A", "B", "C", "D", "W"]
    assert found["C"] == (["lakehouse.core.errors.SourceError"], False) and found["W"][1]


def _all_errors() -> set[type]:
    """Every LakehouseError subclass of the product and the development stack, all their modules imported."""
    for package in (lakehouse, lakehouse_dev):
        for found in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            importlib.import_module(found.name)
    seen, todo = set(), [errors.LakehouseError]
    while todo:
        cls = todo.pop()
        if cls not in seen:
            seen.add(cls)
            todo.extend(cls.__subclasses__())
    return seen


def test_the_errors_module_names_every_class_it_defines_in_its_tree_with_its_exit_code():
    doc = errors.__doc__
    defined = [name for name, cls in vars(errors).items()
               if isinstance(cls, type) and issubclass(cls, errors.LakehouseError)
               and cls.__module__ == errors.__name__]
    assert len(defined) > 60
    assert not [name for name in defined if not re.search(rf"\b{name}\b", doc)], "classes missing from the tree"
    for name, code in re.findall(r"(\w+Error) \[(\d+)\]", doc):
        assert getattr(errors, name).exit_code == int(code), f"the tree says {name} exits {code}"


def _unparenthesized(text: str) -> str:
    while True:
        shorter = re.sub(r"\([^()]*\)", "", text)
        if shorter == text:
            return " ".join(text.split())
        text = shorter


def test_the_cli_docstring_lists_the_exit_code_table():
    """The CLI's docstring (its --help text's source) names each code of the table with the table's words."""
    doc = _unparenthesized(cli.__doc__)
    listed = re.search(r"Exit codes\s*:\s*(.*?)\s*\.\s", doc)
    assert listed, "the CLI docstring has no 'Exit codes: ...' sentence"
    found = {}
    for item in listed.group(1).split(";"):
        code, _, meaning = item.strip().partition(" ")
        found[int(code)] = meaning.strip()
    assert found == dict(errors.EXIT_CODES)


def test_docs_cli_lists_the_exit_code_table_and_the_classes_it_names_exit_with_their_row():
    page = (REPO / "docs" / "cli.md").read_text()
    section = page.split("\n## Exit codes\n", 1)[1].split("\n## ", 1)[0]
    rows = [re.match(r"\| (\d+) \| (.*?) \|\s*(.*?)\s*\|$", line) for line in section.splitlines()
            if re.match(r"\| \d+ \|", line)]
    assert [int(row.group(1)) for row in rows] == list(errors.EXIT_CODES), "docs/cli.md lists other exit codes"
    for row in rows:
        code, meaning, raised_by = int(row.group(1)), row.group(2), row.group(3)
        words = errors.EXIT_CODES[code]
        assert re.match(re.escape(words) + r"($|[ :;,(])", meaning), \
            f"exit {code}: {meaning!r} does not start with {words!r}"
        for name in re.findall(r"`(\w+)`", raised_by):
            assert getattr(errors, name).exit_code == code, f"docs/cli.md: {name} does not exit {code}"


def test_every_exit_code_of_the_table_is_one_the_cli_can_return():
    """A documented code the code never returns is a promise nobody keeps: each code of the table is an error
    class's, or one `lakehouse` returns itself (0, Ctrl-C, a closed pipe)."""
    used = {cls.exit_code for cls in _all_errors()}
    for node in ast.walk(ast.parse(Path(cli.__file__).read_text())):
        if isinstance(node, ast.Return) and node.value is not None:
            for value in ast.walk(node.value):
                if isinstance(value, ast.Constant) and type(value.value) is int:
                    used.add(value.value)
                elif isinstance(value, ast.Name) and value.id.startswith("EXIT_"):
                    used.add(getattr(cli, value.id))
    assert not set(errors.EXIT_CODES) - used, f"exit codes nothing returns: {set(errors.EXIT_CODES) - used}"


def test_kafka_not_answering_a_topic_operation_exits_as_the_source_needing_attention(free_tcp_port, tmp_path):
    """docs/cli.md, exit 3: Kafka unreachable or refusing a topic operation. Listing topics where nothing
    listens is a TopicError, a SourceError that exits 3, not a failure of the platform (1)."""
    platform = config.PlatformConfig(home=tmp_path, bootstrap_servers=f"127.0.0.1:{free_tcp_port}")
    with pytest.raises(errors.TopicError, match=f"cannot list topics on 127.0.0.1:{free_tcp_port}") as failed:
        topics.topic_partitions(platform, timeout=0.5)
    assert isinstance(failed.value, errors.SourceError) and failed.value.exit_code == errors.EXIT_SOURCE == 3


def test_one_name_for_a_configuration_error():
    """ConfigurationError is the configuration error: a wrong setting in the environment is one too (exit 2)."""
    assert not hasattr(config, "ConfigError")
    with pytest.raises(errors.ConfigurationError, match="LAKEHOUSE_X 'perhaps': expected true or false") as bad:
        config.parse_bool("perhaps", "LAKEHOUSE_X")
    assert bad.value.exit_code == errors.EXIT_CONFIG


# ------------------------------------------------------------------------- the spec's modules, no circle

SPEC_MODULES = ("spec", "spec_model", "spec_parse", "spec_reader", "spec_contract", "spec_properties", "spec_schema",
                "vocabulary", "safe_yaml", "durations", "naming", "patterns", "schema_folder", "wording", "schemas",
                "errors")
# what `lakehouse.core.spec` held before it was split by concept: its callers import these from it
SPEC_NAMES = (
    "ADDITIVE_POLICIES BrokenSpecsError CAPS CONTRACT_SOURCES Contract DAG_KINDS DATE_UNITS DURATION_CAPS_S "
    "ENVELOPES FAST_PATH_TYPES FIELD_NAME FIELD_TYPES FORMAT_SCHEMA_TYPES FanoutSpec FieldSpec IDENTIFIER "
    "INCOMPATIBLE_POLICIES KEY_FORMATS KEY_TYPES MAX_CONTRACT_DEPTH MAX_DECIMAL_PRECISION MAX_DURATION_S "
    "MAX_MATCHED_CHARS MAX_PATTERN_CHARS MAX_PROPERTY_VALUE MAX_SCHEMA_BYTES MAX_SCHEMA_FILES MAX_SCHEMA_FOLDER_BYTES "
    "MAX_SCHEMA_FOLDER_ENTRIES MAX_SPEC_BYTES MAX_YAML_DEPTH MODES MaintenanceSpec NESTED_TYPES OPS_TIMELINE_TABLE "
    "PARTITION_SOURCE_TYPES PARTITION_TRANSFORMS PRIMITIVE_TYPES PROPERTY_FAMILIES PartitionField PatternError "
    "PipelineSpec PropertyValues PublishSpec REFUSED_PROPERTIES RESERVED_COLUMNS RETENTION_DAG_ID "
    "RETENTION_GUARD_DAG_ID RetentionSpec SCHEDULE_PRESETS SCHEMA_FILE_TYPES SHARED_DAG_IDS SPARK_TYPES "
    "SPEC_COLUMN_PROPERTIES SPEC_PROPERTIES SchemaPolicy SchemaSource SloSpec SourceSpec SpecError SpecSet "
    "SupervisionSpec TABLE_NAME TABLE_NAME_FORM_PATTERN TARGET_FILE_SIZE_PROPERTY TIMESTAMP_UNITS TRIGGER_MODES "
    "TargetSpec TriggerSpec UnknownPipelineError VALUE_FORMATS VerifySpec WIDENINGS contract_pattern dag_id "
    "event_time_column is_table_name load_all load_pipeline load_schema_source load_spec load_specs parse_duration "
    "parse_instant parse_moment read_schema_folder refused_property").split()


def _import_graph(package=lakehouse) -> dict[str, set[str]]:
    """Each module of `package` (the product unless told) -> the package's modules it imports, at its top or inside
    a function."""
    names = {package.__name__, *_modules(package)}
    root = Path(package.__file__).parent
    graph: dict[str, set[str]] = {}
    for name in names:
        relative = Path(*name.split(".")[1:])
        path = root / relative / "__init__.py" if (root / relative).is_dir() else root / relative.with_suffix(".py")
        targets = set()
        for dotted in _imports(path):
            parts = dotted.split(".")  # `from lakehouse.core.spec import X` names X: the module is a prefix
            target = next((".".join(parts[:n]) for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in names),
                          None)
            if target is not None and target != name:
                targets.add(target)
        graph[name] = targets
    return graph


def _circle_through(graph: dict[str, set[str]], start: str) -> list[str] | None:
    """A chain of imports from `start` back to `start`, or None."""
    seen, stack = set(), [(start, [start])]
    while stack:
        here, chain = stack.pop()
        for there in sorted(graph.get(here, ())):
            if there == start:
                return [*chain, start]
            if there not in seen:
                seen.add(there)
                stack.append((there, [*chain, there]))
    return None


def test_the_circle_check_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    assert _circle_through(graph, "a") == ["a", "b", "c", "a"]
    assert _circle_through(graph, "d") is None


@pytest.mark.parametrize("module", SPEC_MODULES)
def test_the_spec_modules_import_no_circle(module):
    circle = _circle_through(_import_graph(), f"lakehouse.core.{module}")
    assert circle is None, "an import circle: " + " -> ".join(circle or ())


INGEST_MODULES = sorted(m.rsplit(".", 1)[1] for m in _modules(importlib.import_module("lakehouse.ingest")))


# the modules a record's value goes through, decoded and checked (records.py held the first eight; formats.py the
# wire format, the writer schemas, the Protobuf reader, the wire-format decoders and the compiled rows)
RECORD_MODULES = ("rejects", "json_decode", "checks", "json_fast_path", "writer_schemas", "change_events", "row_plans",
                  "validator", "wire", "schema_store", "proto_values", "wire_decoders", "compiled_rows")


def test_the_record_path_is_split_by_concept_into_modules_of_the_ingest_package():
    """Issue 27: records.py held rejects, JSON decoding, the field checks, the fast path, the schema gate, change
    events and the validator, and formats.py and it imported each other; formats.py then held the wire format,
    writer schemas by id, the decoders and the compiled rows. Each is its own module now."""
    assert set(RECORD_MODULES) <= set(INGEST_MODULES)
    assert "records" not in INGEST_MODULES and "formats" not in INGEST_MODULES


@pytest.mark.parametrize("module", INGEST_MODULES)
def test_the_ingest_modules_import_no_circle(module):
    """formats <-> records was one: a decoder's module and the validator's imported each other."""
    circle = _circle_through(_import_graph(), f"lakehouse.ingest.{module}")
    assert circle is None, "an import circle: " + " -> ".join(circle or ())


# the synthetic producer's modules in the development stack (produce.py held all but record_formats and
# change_streams)
PRODUCER_MODULES = ("produce", "synthesis", "record_stream", "record_factory", "defects", "pattern_strings", "verdicts",
                    "producer_settings", "rate_limit", "record_formats", "change_streams")
DEV_MODULES = sorted(m.rsplit(".", 1)[1] for m in _modules(lakehouse_dev))


def test_the_synthetic_producer_is_split_by_concept_into_modules_of_the_dev_stack():
    """Issue 27: produce.py held the rate limiter, the pattern strings, valid records and their defects, the record
    stream, the reader's verdicts, the producer's settings and the entry point, and change_streams and it imported
    each other. Each is its own module now; produce keeps the entry point and its report."""
    from lakehouse_dev import produce

    assert set(PRODUCER_MODULES) <= set(DEV_MODULES)
    own = {name for name, value in vars(produce).items() if getattr(value, "__module__", None) == produce.__name__}
    assert own == {"produce", "ProduceReport"}


@pytest.mark.parametrize("module", DEV_MODULES)
def test_the_dev_stack_modules_import_no_circle(module):
    """produce <-> change_streams was one: the change stream took the producer's helpers, the producer chose it."""
    circle = _circle_through(_import_graph(lakehouse_dev), f"lakehouse_dev.{module}")
    assert circle is None, "an import circle: " + " -> ".join(circle or ())


def test_the_spec_module_still_names_everything_its_callers_import():
    from lakehouse.core import spec

    assert [name for name in SPEC_NAMES if not hasattr(spec, name)] == []
    assert sorted(spec.__all__) == sorted(set(spec.__all__)) and set(SPEC_NAMES) <= set(spec.__all__)


def test_no_private_name_crosses_into_or_out_of_a_spec_module():
    """`from lakehouse.x import _name` ties a module to another's insides: a name used across modules is public."""
    crossing = []
    for path in _product_files():
        tree = ast.parse(path.read_text())
        spec_module = path.parent == PACKAGE / "core" and path.stem in SPEC_MODULES
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("lakehouse"):
                into_spec = node.module.removeprefix("lakehouse.core.") in SPEC_MODULES
                crossing += [f"{path.relative_to(REPO)}: {node.module}.{a.name}" for a in node.names
                             if a.name.startswith("_") and (spec_module or into_spec)]
    assert crossing == []


def test_no_private_name_crosses_into_or_out_of_a_record_module():
    """formats.py imported records.py's `_number_interval`; the tests imported `_field_checker`. A name another
    module (the tests too) needs is public."""
    record_modules = {f"lakehouse.ingest.{m}" for m in RECORD_MODULES}
    crossing = []
    for path in [*_product_files(), *sorted((REPO / "tests").rglob("*.py"))]:
        in_record_module = path.parent == PACKAGE / "ingest" and path.stem in RECORD_MODULES
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("lakehouse"):
                into_record_module = node.module in record_modules
                crossing += [f"{path.relative_to(REPO)}: {node.module}.{a.name}" for a in node.names
                             if a.name.startswith("_") and (in_record_module or into_record_module)]
    assert crossing == []


# the distributions and folders of this repository: a module of one may not reach into another's private names
OWN_PACKAGES = ("lakehouse", "lakehouse_dev", "lakehouse_airflow", "bench", "tests", "e2e", "faults", "pgserver",
                "polling")
OWN_ROOTS = ("include/lakehouse", "providers/lakehouse", "devstack/lakehouse_dev", "bench", "dags", "spark_jobs",
             "plugins", "tests", "scripts")


def _private_crossings(source: str) -> list[str]:
    """What `source` takes of another module of ours that the module keeps private: `from lakehouse.x import _y`,
    or `x._y` where `x` is one of our modules (imported whole or by `from ... import x`)."""
    tree = ast.parse(source)
    modules: set[str] = set()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] in OWN_PACKAGES:
            found += [f"{node.lineno}: from {node.module} import {a.name}" for a in node.names
                      if a.name.startswith("_") and not a.name.startswith("__")]
            modules |= {a.asname or a.name for a in node.names}
        elif isinstance(node, ast.Import):
            modules |= {a.asname or a.name.split(".")[0] for a in node.names if a.name.split(".")[0] in OWN_PACKAGES}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules \
                and node.attr.startswith("_") and not node.attr.startswith("__"):
            found.append(f"{node.lineno}: {node.value.id}.{node.attr}")
    return found


def test_no_module_of_ours_reaches_into_another_ones_private_names():
    """A name another module needs (a test too) is public: the product, its Airflow provider, the development
    stack, the bench, the DAGs and the tests take no `_name` of each other."""
    crossing = [f"{path.relative_to(REPO)}:{found}" for root in OWN_ROOTS
                for path in sorted((REPO / root).rglob("*.py")) for found in _private_crossings(path.read_text())]
    assert crossing == []


def test_the_private_name_scan_finds_a_crossing():
    source = ("from lakehouse.ingest.taskwriter import _below_held\n"
              "from lakehouse.ingest import tables\n"
              "import lakehouse_dev.produce as produce\n"
              "kinds = tables._TRANSFORMS\nstream = produce._stream\n"
              "own = self._cache\nname = tables.__name__\nfrom pyiceberg.io import _private_helper\n")
    assert _private_crossings(source) == ["1: from lakehouse.ingest.taskwriter import _below_held",
                                          "4: tables._TRANSFORMS", "5: produce._stream"]
