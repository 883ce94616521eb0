"""The end-to-end layer: every test in tests/e2e/ is marked `slow`, so that `-m slow` and `-m "not slow"` keep
selecting the two layers (tests/conftest.py's layer guard lets these tests start Spark, the broker, Airflow and
`lakehouse` processes). The fixtures both layers use are in tests/conftest.py."""

from __future__ import annotations

import pytest

from tests.conftest import E2E


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(E2E):
            item.add_marker(pytest.mark.slow)
