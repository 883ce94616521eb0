"""A maintenance dry run, asked and shown: `lakehouse maintain --dry-run` as a switch or the true/false the
DAG renders, and its receipt as text (lakehouse.upkeep.maintenance_receipts' `render`).
"""

from __future__ import annotations

import re

import pytest

from lakehouse import cli
from lakehouse.upkeep.maintenance_receipts import MaintenanceReceipt, TableReceipt, render


@pytest.mark.parametrize("argv, dry_run", [
    ([], False), (["--dry-run"], True), (["--dry-run", "--json"], True), (["--dry-run=True"], True),
    (["--dry-run=False"], False), (["--dry-run", "false"], False), (["--dry-run=TRUE"], True),
])
def test_dry_run_is_a_switch_or_the_true_or_false_the_dag_renders(argv, dry_run):
    args = cli.parse_args(["maintain", "--pipeline", "orders", *argv])
    assert args.dry_run is dry_run and args.fn is cli.cmd_maintain


@pytest.mark.parametrize("value", ["yes", "1", "", "True; rm -rf /"])
def test_a_dry_run_value_other_than_true_or_false_exits_2(value, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["maintain", "--pipeline", "orders", f"--dry-run={value}"])
    assert info.value.code == 2
    assert re.search(r"argument --dry-run: expected true or false, got '.*'", capsys.readouterr().err)


def test_a_dry_run_receipt_shows_what_would_expire_and_be_deleted():
    table = TableReceipt(table="lake.raw.orders", status="skipped", dry_run=True,
                         message="dry run: lake.raw.orders: compaction would rewrite 4 data files",
                         orphan_older_than="2026-11-20T10:00:00+00:00",
                         would_expire_count=3, would_expire=[{"snapshot_id": 11, "timestamp": "2026-11-20T09:00:00"},
                                                             {"snapshot_id": 12, "timestamp": "2026-11-20T09:01:00"}],
                         would_delete_orphans_count=1, would_delete_orphans=["file:/wh/raw/orders/data/x.parquet"])
    text = render(MaintenanceReceipt("orders", "r1", [table, TableReceipt("lake.raw.orders_dlq", status="skipped",
                                                                          dry_run=True, message="table has no "
                                                                                                "snapshot yet")],
                                     dry_run=True))
    lines = text.splitlines()
    assert lines[0] == "dry run of orders's maintenance: nothing was rewritten, expired or deleted"
    assert "skipped  dry run: lake.raw.orders: compaction would rewrite 4 data files" in lines
    assert "    11  2026-11-20T09:00:00" in lines and "    12  2026-11-20T09:01:00" in lines
    assert "    ... and 1 more" in lines
    assert "  orphan files that would be deleted (1, older than 2026-11-20T10:00:00+00:00):" in lines
    assert "    file:/wh/raw/orders/data/x.parquet" in lines
    assert lines[-1] == "skipped  table has no snapshot yet"
