"""The package's shape, checked: each concern imports only the floors below it, the product
never imports the development stack or the tests, and every error it raises on purpose is a
LakehouseError with an exit code.

Floors (docs/architecture.md): core <- ingest <- {upkeep, recovery, ops} <- wap <- cli.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

import lakehouse
import lakehouse_dev
from lakehouse.core import errors

PACKAGE = Path(lakehouse.__file__).parent
FLOOR = {"core": 0, "ingest": 1, "upkeep": 2, "recovery": 2, "ops": 2, "wap": 3, "cli": 4}
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
        assert not target.startswith(("lakehouse_dev", "tests", "e2e", "faults")), \
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
                assert cls.exit_code in (errors.EXIT_FAILURE, errors.EXIT_CONFIG, errors.EXIT_SOURCE, errors.EXIT_FENCED)
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
    hook = hooks.faults()  # the suite's conftest points LAKEHOUSE_TEST_HOOKS at tests/faults.py
    assert type(hook) is not hooks.FaultHook
    with pytest.raises(ValueError, match="no_such_point"):
        hook.check()
