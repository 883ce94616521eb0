"""The "Lakehouse pipelines" page in Airflow's UI shows live numbers, seen in a real browser, and page
loads leave the API server's shared threads to the Execution API.

Airflow's API server is started by `lakehouse_dev.airflow_stack` as `lakehouse airflow up`
does; one headless Chromium, driven by Selenium through Debian's chromedriver,
opens /lakehouse/ signed out (the answer says to sign in), signs in on Airflow's own login page
(which sets the `_token` cookie the Airflow UI uses) and comes back to the page, saves a screenshot
to .artifacts/ui/pipelines.png and submits the trace forms.
"""

from __future__ import annotations

import html
import json
import re
import subprocess
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait

from bench import page_loads
from tests.conftest import free_port
from e2e import lakehouse, log_ends, pipeline, rows, run_cli, table  # noqa: F401 - pipeline is a fixture
from lakehouse.core import config, events, offsets
from lakehouse.core.catalog import open_catalog
from lakehouse.ops.cost import human_bytes
from lakehouse_dev import airflow_stack
from polling import wait_until

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/lib/chromium/chromium"  # the binary itself: /usr/bin/chromium is Debian's wrapper script
CHROMEDRIVER = "/usr/bin/chromedriver"
SCREENSHOT = config.REPO_ROOT / ".artifacts" / "ui" / "pipelines.png"
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--window-size=1400,900", "--hide-scrollbars")


def cli(spec, *args: str) -> subprocess.CompletedProcess:
    run = run_cli(spec, *args)
    assert run.returncode == 0, run.stderr[-3000:]
    return run


@pytest.fixture
def browser():
    """One headless Chromium with a throwaway profile (parallel runs must not share one), driven by Selenium
    through Debian's chromedriver (never Selenium Manager's downloads)."""
    for program in (CHROMIUM, CHROMEDRIVER):
        if not Path(program).exists():
            pytest.fail(f"{program} is missing: run `make setup` (it installs the Debian chromium and "
                        f"chromium-driver packages)")
    with tempfile.TemporaryDirectory(prefix="lakehouse-chromium-") as profile:
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
            options.add_argument(flag)
        driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
        try:
            driver.implicitly_wait(15)
            driver.set_page_load_timeout(120)
            yield driver
        finally:
            driver.quit()


def type_into(driver: WebDriver, css: str, text: str) -> None:
    element = driver.find_element(By.CSS_SELECTOR, css)
    element.clear()
    element.send_keys(text)


def submit(driver: WebDriver, form: str, **values: str) -> str:
    """Fill the inputs of form `form` (a CSS selector), press its button; the DOM of the answer."""
    for name, value in values.items():
        type_into(driver, f'{form} input[name="{name}"]', value)
    before = driver.current_url
    driver.find_element(By.CSS_SELECTOR, f"{form} button").click()
    WebDriverWait(driver, 60).until(expected_conditions.url_changes(before),
                                    f"submitting {form} did not leave {before}")
    return driver.page_source


def card(dom: str, pipeline_name: str) -> str:
    """The HTML of one pipeline's card."""
    match = re.search(rf'<section class="card[^"]*" data-pipeline="{re.escape(pipeline_name)}"[^>]*>(.*?)</section>',
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
def api_server(make_spec, monkeypatch, free_tcp_port, request):
    """start() -> airflow_stack.status(): the API server on a free port, reading make_spec.directory."""

    def start() -> dict:
        monkeypatch.setenv("LAKEHOUSE_PIPELINES_DIR", str(make_spec.directory))
        request.addfinalizer(airflow_stack.down)
        return airflow_stack.up(port=free_tcp_port, components=("api-server",))

    return start


@pytest.fixture
def airflow(stack, api_server):
    """api_server, once the embedded broker runs."""
    return api_server


def read_cards(url: str, token: str, timeout: float = 240.0) -> dict[str, dict]:
    """The cards of /lakehouse/api/pipelines by pipeline, once the background refresher read every one."""
    def read():
        status, body = get(f"{url}/lakehouse/api/pipelines", token)
        cards = json.loads(body) if status == 200 else []
        return cards and all(c["state"] != "loading" for c in cards) and {c["pipeline"]: c for c in cards}

    return wait_until(read, timeout, "every pipeline card read by the page's background refresher", interval=1.0)


def test_pipelines_page_shows_live_numbers_in_a_browser(pipeline, make_spec, platform, airflow, browser):
    spec = pipeline(partitions=2, trigger={"max_records_per_batch": 100})  # several commits: a chart
    cli(spec, "produce", "--pipeline", spec.name, "--count", "300", "--bad-ratio", "0.05", "--seed", "11", "--quiet")
    cli(spec, "ingest", "--pipeline", spec.name, "--once")
    ends = log_ends(platform, spec.source.topic)
    data = rows(platform, spec, spec.target.table)
    letters = rows(platform, spec, spec.dead_letter_table)
    data_rows, dead = len(data), len(letters)
    assert data_rows + dead == 300 and dead > 0
    progress = offsets.read_progress(open_catalog(platform, spec.catalog), spec.target.table, spec.name)
    assert progress.positions == ends
    cli(spec, "produce", "--pipeline", spec.name, "--count", "20", "--seed", "12", "--quiet")  # not ingested: lag
    offending = data[0]["_kafka"]["key"]  # a row's key, as a quality event's offending value
    events.record(events.Event(
        spec.name, "quality", "failed", f"2 of 9 expectations failed: {offending}. Data Docs: {platform.home}/gx",
        metrics={"rows": 300, "failed_expectations": 2, "unexpected_count": 7},
        details={"offending_offsets": [{"partition": 0, "offset": 3, "value": offending}]}), platform=platform)
    # an operator action (as the backfill DAG audits one) and a table property changed by hand: layout drift
    alice = events.Actor.airflow(f"{spec.name}_backfill", "manual__ui-test", "manual", "alice")
    events.record(events.Event(spec.name, "replay", "ok", "replayed 0:0-10",
                               details={"parameters": {"offsets": "0:0-10"}}, actor=alice), platform=platform)
    with table(platform, spec, spec.target.table).transaction() as change:
        change.set_properties({"write.parquet.compression-codec": "snappy"})
    scanned = [task.file for name in spec.owned_tables for task in table(platform, spec, name).scan().plan_files()]
    files, size = len(scanned), sum(f.file_size_in_bytes for f in scanned)
    idle = make_spec()  # declared, never ingested: no topic, no tables
    (make_spec.directory / "broken.yaml").write_text("name: broken\nsource: {topic: 'bad topic!'}\n")

    started = airflow()
    assert started["healthy"] and started["running"]["api-server"]
    url = started["url"]
    page = f"{url}/lakehouse/"

    # the page, its JSON and the traces are behind Airflow's login, as Airflow's own API is
    status, body = get(page)
    assert status == 401 and "sign in to Airflow to see the pipelines" in field(body.decode(), "error")
    assert spec.name not in body.decode()
    assert get(f"{url}/lakehouse/api/pipelines") == (401, b'{"error":"Not authenticated"}')
    assert get(f"{url}/api/v2/plugins")[0] == 401
    token = page_loads.sign_in(started)
    status, body = get(f"{url}/api/v2/plugins", token)
    assert status == 200
    plugin = next(p for p in json.loads(body)["plugins"] if p["name"] == "lakehouse_ui")
    assert [a["url_prefix"] for a in plugin["fastapi_apps"]] == ["/lakehouse"]
    assert [v["url_route"] for v in plugin["external_views"]] == ["lakehouse"]

    letter = letters[0]  # a dead letter: its coordinates, its reason and the commit that added it
    where = {"partition": str(letter["_kafka"]["partition"]), "offset": str(letter["_kafka"]["offset"])}
    query = urllib.parse.urlencode({"pipeline": spec.name, **where})
    assert get(f"{url}/lakehouse/api/trace?{query}") == (401, b'{"error":"Not authenticated"}')
    status, body = get(f"{url}/lakehouse/trace?{query}")
    assert status == 401 and "sign in to Airflow" in field(body.decode(), "error")
    assert get(f"{url}/lakehouse/api/trace?{query}", token[:-4] + "AAAA") == (403, b'{"error":"Invalid JWT token"}')
    status, body = get(f"{url}/lakehouse/api/trace?{query}", token)
    answer = json.loads(body)
    assert status == 200 and answer["verdict"] == "dead-letter", answer
    assert answer["sightings"][0]["row"]["error_kind"] == letter["error_kind"]
    letter_commit = answer["sightings"][0]["commits"][0]["snapshot_id"]
    assert letter_commit in {s.snapshot_id for s in table(platform, spec, spec.dead_letter_table).snapshots()}

    listed = read_cards(url, token)
    # signed out, the browser gets the sign-in link; Airflow's login page sets the `_token` cookie as the
    # Airflow UI's login does, then comes back to the page
    browser.get(page)
    browser.find_element(By.CSS_SELECTOR, 'a[data-field="login"]').click()
    type_into(browser, 'input[name="username"]', started["user"])
    type_into(browser, 'input[name="password"]', started["password"])
    browser.find_element(By.CSS_SELECTOR, 'button[type="submit"]').click()
    WebDriverWait(browser, 30).until(expected_conditions.url_to_be(page), f"the browser did not come back to {page}")
    dom = browser.page_source
    mine = card(dom, spec.name)
    assert field(mine, "rows") == str(data_rows)
    assert field(mine, "dead_letters") == str(dead)
    assert {p: int(field(mine, f"position_{p}")) for p in ends} == ends
    assert field(mine, "snapshot_id") == str(progress.snapshot_id)
    assert field(mine, "lag_records") == "20"
    assert re.fullmatch(r"\d+s", field(mine, "lag_s"))  # the age of the oldest record not ingested
    assert field(mine, "quality") == "failed"
    assert field(mine, "quality_numbers") == "300 rows audited, 2 failed expectations, 7 unexpected values"
    assert field(mine, "quality_error") == "the quality failed"
    # the quality event's offending value, its message and the Data Docs path never reach the browser
    for secret in (offending, "Data Docs", str(platform.home), str(make_spec.directory)):
        assert secret not in dom
    # the timeline row: the three batches of the run, their dead letters, the newest quality event
    assert field(mine, "batches") == "3" and field(mine, "recent_dead_letters") == str(dead)
    assert field(mine, "latest_quality") == "failed"
    assert f'href="../dags/{spec.name}_ingest"' in mine and 'href="../dags/retention_alignment"' in mine
    assert re.search(r'<svg[^>]*aria-label="freshness at commit".*?<polyline points="[^"]+"', mine, re.S)
    # who acted: the operator action and the newest replay event name alice and the DAG run
    assert field(mine, "action_actor") == "alice" and field(mine, "latest_replay_actor") == "alice"
    assert f"Airflow run {spec.name}_backfill/manual__ui-test" in mine and "offsets=0:0-10" in mine
    # the layout drift the property changed by hand left, until the job's next start
    assert field(mine, "layout") == "drift"
    assert html.unescape(field(mine, "layout_changes")) == \
        "property write.parquet.compression-codec: 'snappy' -> 'zstd'"
    # the cost panel: today's row, the tables' files counted here from their scans
    status, body = get(f"{url}/lakehouse/api/pipelines", token)
    assert status == 200 and offending not in body.decode() and str(make_spec.directory) not in body.decode()
    today = listed[spec.name]["cost"]["days"][-1]
    day = today["day"]
    assert field(mine, f"cost_{day}_day") == f"{day} (so far)" and today["partial"]
    assert field(mine, f"cost_{day}_table_files") == str(files)
    assert field(mine, f"cost_{day}_table_bytes") == human_bytes(size)
    assert field(mine, f"cost_{day}_produced_bytes") == human_bytes(today["produced_bytes"]) != human_bytes(0)
    assert float(field(mine, f"cost_{day}_ingest_seconds")) > 0
    assert "no unit prices set" in mine
    assert 'data-field="trace_form"' in mine and 'data-field="trace_key_form"' in mine

    never = card(dom, idle.name)
    assert field(never, "last_commit_at") == "no commits yet"
    assert field(never, "quality") == "none yet"
    # its missing topic is reported on the card as a category, with the id the server's log has it under
    assert field(never, "kafka_error") == "the topic does not exist"
    assert field(never, "kafka_error_id") == listed[idle.name]["kafka_error"]["id"]
    broken = card(dom, "broken")
    assert field(broken, "file") == "broken.yaml" and field(broken, "error") == "the spec file does not load"

    assert listed[spec.name]["rows"] == data_rows and listed[spec.name]["dead_letters"] == dead
    assert {int(p): o for p, o in listed[spec.name]["positions"].items()} == ends
    assert listed[spec.name]["quality"]["status"] == "failed"
    assert listed[spec.name]["lag_records"] == 20 and listed[spec.name]["lag_s"] >= 0
    assert listed[idle.name]["committed"] is False
    assert (listed["broken"]["state"], listed["broken"]["file"]) == ("broken", "broken.yaml")
    assert listed["broken"]["error"]["category"] == "the spec file does not load"

    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    assert browser.save_screenshot(str(SCREENSHOT))
    assert SCREENSHOT.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # the trace form, signed in through the page: the answer with its rows' reason and commit
    form = f'section[data-pipeline="{spec.name}"] form[data-field="trace_form"]'
    traced = submit(browser, form, **where)
    assert browser.current_url == (f"{url}/lakehouse/trace?pipeline={spec.name}&partition={where['partition']}"
                             f"&offset={where['offset']}")
    assert field(traced, "verdict") == "dead-letter"
    assert field(traced, "dead_letter_reason").startswith(f"{letter['error_kind']}: ")
    assert field(traced, "commit_snapshot") == str(letter_commit)

    # signed in, the key form: every record of a data row's key in the last day, each with its verdict
    row = data[0]
    browser.get(page)
    keyed = submit(browser, f'section[data-pipeline="{spec.name}"] form[data-field="trace_key_form"]',
                           key=row["_kafka"]["key"])
    assert int(field(keyed, "records_found")) >= 1 and field(keyed, "key") == row["_kafka"]["key"]
    coordinates = f'{row["_kafka"]["partition"]}@{row["_kafka"]["offset"]}'
    record = re.search(rf'<div class="record" data-record="{coordinates}">(.*?)</div>', keyed, re.S)
    assert record, keyed[:3000]
    assert field(record.group(1), "verdict") == "in-table"
    data_commits = {str(s.snapshot_id) for s in table(platform, spec, spec.target.table).snapshots()}
    assert field(record.group(1), "commit_snapshot") in data_commits


def test_fifty_concurrent_page_loads_leave_heartbeats_and_threads_alone(api_server, make_spec, monkeypatch):
    """The page and its JSON answer from the cache, so 50 loads in flight while every pipeline's Kafka hangs
    take none of the shared pool's threads: the Execution API's health endpoint, a sync handler on that pool
    as the task heartbeat endpoint is, keeps answering within the time a task runner waits for a heartbeat
    ([workers] execution_api_timeout), and the API server does not grow by a pool's worth of threads. Before,
    each load computed every overview in a sync handler (10-15 s Kafka timeouts per pipeline), the 40 threads
    ran out and heartbeats queued behind them. The times themselves are measured and reported by
    `python -m bench.page_loads`, which this test runs the measurement of; here only the outcomes count."""
    for _ in range(2):
        make_spec()
    monkeypatch.setenv("LAKEHOUSE_BOOTSTRAP_SERVERS", f"127.0.0.1:{free_port()}")  # nobody listens: reads time out
    started = api_server()
    url, pid = started["url"], started["running"]["api-server"]
    token = page_loads.sign_in(started)
    wait_until(lambda: get(f"{url}/lakehouse/api/pipelines", token)[0] == 200, 60, "the pipeline specs read")

    for _ in range(3):  # a heartbeat lost while nothing else runs is the machine stalling, not the server
        found = page_loads.measure(url, pid, token, loads=page_loads.LOADS, seconds=5.0)
        if found["idle"]["statuses"] == {"200": page_loads.IDLE_HEARTBEATS}:
            break

    assert found["loads"]["count"] >= page_loads.LOADS and set(found["loads"]["statuses"]) == {"200"}, found
    assert found["idle"]["statuses"] == {"200": page_loads.IDLE_HEARTBEATS}, found
    during = found["during"]
    assert during["count"] > 0, "no heartbeat was sent while the page loads were in flight"
    assert during["lost"] == 0 and during["statuses"] == {"200": during["count"]}, found
    assert found["threads"]["growth"] < page_loads.SHARED_POOL, found
