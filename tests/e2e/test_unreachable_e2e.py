"""With nothing answering where Kafka should be, a command fails within seconds with one line naming the
unreachable part and the setting to check, exits non-zero and creates nothing.

The end-to-end half of these tests; what they hold the code to is told in tests/unit/cli/test_unreachable.py.
"""

from __future__ import annotations


import pytest

from lakehouse.core.errors import EXIT_FAILURE
from tests.unit.cli.test_unreachable import (  # noqa: F401 - fixtures among them
    run,
    terminal,
)


@pytest.mark.slow
def test_a_command_with_the_catalog_down_fails_fast_with_one_line_naming_the_catalog_setting(
        stack, own_home, make_spec, monkeypatch, free_tcp_port, capfd):
    """Kafka answers (the session's broker); the PostgreSQL catalog database does not (nothing listens)."""
    spec = make_spec()
    monkeypatch.setenv("LAKEHOUSE_PIPELINES_DIR", str(make_spec.directory))
    monkeypatch.setenv("LAKEHOUSE_BOOTSTRAP_SERVERS", stack["bootstrap_servers"])
    monkeypatch.setenv("LAKEHOUSE_CATALOG_URI", f"postgresql+psycopg2://lakehouse:secret@127.0.0.1:{free_tcp_port}/lake")

    code, seconds = run(["status", "--pipeline", spec.name])

    out, err = capfd.readouterr()
    assert code == EXIT_FAILURE and out == ""
    assert seconds < 10
    [line] = terminal(err, f"127.0.0.1:{free_tcp_port}")
    assert line.startswith(f"error: catalog 'lake' at postgresql+psycopg2://lakehouse:***@127.0.0.1:{free_tcp_port}/lake "
                           f"(LAKEHOUSE_CATALOG_URI) is unavailable"), line
    assert "secret" not in err
    assert list(own_home.iterdir()) == []
