"""pyiceberg's own configuration of catalogs (`.pyiceberg.yaml`) is read by every command: a `catalog`
entry that is not a mapping of names is a configuration error naming the file and what it must be,
not an AttributeError traceback (found by the type check: the entry was used as a mapping unchecked)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from lakehouse.core import config, errors


@pytest.fixture
def pyiceberg_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for name in ("LAKEHOUSE_CATALOG_URI", "LAKEHOUSE_WAREHOUSE", "LAKEHOUSE_S3_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "pyiceberg-home"
    home.mkdir()
    monkeypatch.setenv("PYICEBERG_HOME", str(home))
    monkeypatch.setenv("LAKEHOUSE_HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    return home


@pytest.mark.parametrize("entry", ["lake", 7, ["lake", "other"]])
def test_a_catalog_entry_that_is_not_a_mapping_is_a_configuration_error(pyiceberg_home, entry):
    (pyiceberg_home / ".pyiceberg.yaml").write_text(yaml.safe_dump({"catalog": entry}))
    with pytest.raises(errors.ConfigurationError, match=r"\.pyiceberg\.yaml.*`catalog` must map each catalog name"):
        config.load(fresh=True)


def test_a_mapping_of_catalogs_is_read(pyiceberg_home):
    (pyiceberg_home / ".pyiceberg.yaml").write_text(yaml.safe_dump(
        {"catalog": {"lake": {"type": "rest", "uri": "https://catalog.example/api", "warehouse": "prod"}}}))
    lake = config.load(fresh=True).catalog("lake")
    assert (lake.type, lake.uri, lake.warehouse) == ("rest", "https://catalog.example/api", "prod")
