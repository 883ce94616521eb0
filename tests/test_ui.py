"""The "Lakehouse pipelines" page in Airflow's UI shows live numbers, seen in a real browser.

Airflow's API server is started by `lakehouse_dev.airflow_stack` as `lakehouse airflow up`
does; headless Chromium renders /lakehouse/ and saves a screenshot to
.artifacts/ui/pipelines.png.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from e2e import lakehouse, log_ends, pipeline, rows, run_cli  # noqa: F401 - pipeline is a fixture
from lakehouse.core import config, events, offsets
from lakehouse.core.catalog import open_catalog
from lakehouse_dev import airflow_stack

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
SCREENSHOT = config.REPO_ROOT / ".artifacts" / "ui" / "pipelines.png"
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync")


def cli(spec, *args: str) -> subprocess.CompletedProcess:
    run = run_cli(spec, *args)
    assert run.returncode == 0, run.stderr[-3000:]
    return run


def chromium(*args: str) -> subprocess.CompletedProcess:
    """Headless Chromium with a throwaway profile (parallel runs must not share one)."""
    if not Path(CHROMIUM).exists():
        pytest.fail("chromium is not installed: run `make setup` (it installs the Debian chromium package)")
    with tempfile.TemporaryDirectory(prefix="lakehouse-chromium-") as profile:
        done = subprocess.run([CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
                              capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def card(dom: str, pipeline_name: str) -> str:
    """The HTML of one pipeline's card."""
    match = re.search(rf'<section class="card[^"]*" data-pipeline="{re.escape(pipeline_name)}">(.*?)</section>',
                      dom, re.S)
    assert match, f"no card for {pipeline_name} in the page"
    return match.group(1)


def field(html: str, name: str) -> str:
    match = re.search(rf'data-field="{re.escape(name)}"[^>]*>([^<]*)<', html)
    assert match, f"no field {name!r} in {html[:2000]}"
    return match.group(1).strip()


def get(url: str, token: str | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.fixture
def airflow(stack, make_spec, monkeypatch, free_tcp_port, request):
    """start() -> airflow_stack.status(): the API server on a free port, reading make_spec.directory."""

    def start() -> dict:
        monkeypatch.setenv("LAKEHOUSE_PIPELINES_DIR", str(make_spec.directory))
        request.addfinalizer(airflow_stack.down)
        return airflow_stack.up(port=free_tcp_port, components=("api-server",))

    return start


def test_pipelines_page_shows_live_numbers_in_a_browser(pipeline, make_spec, platform, airflow):
    spec = pipeline(partitions=2, trigger={"max_records_per_batch": 100})  # several commits: a chart
    cli(spec, "produce", "--pipeline", spec.name, "--count", "300", "--bad-ratio", "0.05", "--seed", "11", "--quiet")
    cli(spec, "ingest", "--pipeline", spec.name, "--once")
    ends = log_ends(platform, spec.source.topic)
    data_rows = len(rows(platform, spec, spec.target.table))
    dead = len(rows(platform, spec, spec.dead_letter_table))
    assert data_rows + dead == 300 and dead > 0
    progress = offsets.read_progress(open_catalog(platform, spec.catalog), spec.target.table, spec.name)
    assert progress.positions == ends
    cli(spec, "produce", "--pipeline", spec.name, "--count", "20", "--seed", "12", "--quiet")  # not ingested: lag
    events.record(events.Event(spec.name, "quality", "failed", "2 of 9 expectations failed"), platform=platform)
    idle = make_spec()  # declared, never ingested: no topic, no tables
    (make_spec.directory / "broken.yaml").write_text("name: broken\nsource: {topic: 'bad topic!'}\n")

    started = airflow()
    assert started["healthy"] and started["running"]["api-server"]
    page = f"{started['url']}/lakehouse/"

    # the plugin page is not behind Airflow's login; Airflow's own API is
    status, _ = get(page)
    assert status == 200
    assert get(f"{started['url']}/api/v2/plugins")[0] == 401
    token_request = urllib.request.Request(
        f"{started['url']}/auth/token", method="POST", headers={"Content-Type": "application/json"},
        data=json.dumps({"username": started["user"], "password": started["password"]}).encode())
    with urllib.request.urlopen(token_request, timeout=30) as response:
        token = json.load(response)["access_token"]
    status, body = get(f"{started['url']}/api/v2/plugins", token)
    assert status == 200
    plugin = next(p for p in json.loads(body)["plugins"] if p["name"] == "lakehouse_ui")
    assert [a["url_prefix"] for a in plugin["fastapi_apps"]] == ["/lakehouse"]
    assert [v["url_route"] for v in plugin["external_views"]] == ["lakehouse"]

    dom = chromium("--dump-dom", page).stdout
    mine = card(dom, spec.name)
    assert field(mine, "rows") == str(data_rows)
    assert field(mine, "dead_letters") == str(dead)
    assert {p: int(field(mine, f"position_{p}")) for p in ends} == ends
    assert field(mine, "snapshot_id") == str(progress.snapshot_id)
    assert field(mine, "lag_records") == "20"
    assert re.fullmatch(r"\d+s", field(mine, "lag_s"))  # the age of the oldest record not ingested
    assert field(mine, "quality") == "failed" and "2 of 9 expectations failed" in mine
    # the timeline row: the three batches of the run, their dead letters, the newest quality event
    assert field(mine, "batches") == "3" and field(mine, "recent_dead_letters") == str(dead)
    assert field(mine, "latest_quality") == "failed"
    assert f'href="../dags/{spec.name}_ingest"' in mine and 'href="../dags/retention_alignment"' in mine
    assert re.search(r'<svg[^>]*aria-label="freshness at commit".*?<polyline points="[^"]+"', mine, re.S)

    never = card(dom, idle.name)
    assert field(never, "last_commit_at") == "no commits yet"
    assert field(never, "quality") == "none yet"
    assert "does not exist" in never  # its missing topic is reported on the card, not raised
    broken = card(dom, "broken")
    assert "broken.yaml" in field(broken, "error")

    status, body = get(f"{started['url']}/lakehouse/api/pipelines")
    assert status == 200
    listed = {p["pipeline"]: p for p in json.loads(body)}
    assert listed[spec.name]["rows"] == data_rows and listed[spec.name]["dead_letters"] == dead
    assert {int(p): o for p, o in listed[spec.name]["positions"].items()} == ends
    assert listed[spec.name]["quality"]["status"] == "failed"
    assert listed[spec.name]["lag_records"] == 20 and listed[spec.name]["lag_s"] >= 0
    assert listed[idle.name]["committed"] is False
    assert listed["broken"]["error"].startswith(str(make_spec.directory / "broken.yaml"))

    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        shot = Path(tmp) / "pipelines.png"
        chromium(f"--screenshot={shot}", "--window-size=1400,900", "--hide-scrollbars", page)
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        shutil.copyfile(shot, SCREENSHOT)
