"""Who sees what on the pipelines page: the page and its JSON answer only a signed-in Airflow user, show
each pipeline only to users who may read all its DAGs, and never hand a browser row values, Kafka keys,
locations or exception texts, from the ops timeline as it really is; requests read the overview cache only.

The page's FastAPI app is driven in this process (Starlette's TestClient) with Airflow's own `get_user`
and JWTs, the session's metadata DB (revoked tokens are looked up there) and an auth manager that grants
reads DAG by DAG, as FAB's does: `DagReadersAuthManager` below, selected through Airflow's
[core] auth_manager setting. The embedded broker answers Kafka's side.
"""

from __future__ import annotations

import json
import logging
import re

import jwt
import pytest
from tests.conftest import forget_auth_manager
from starlette.testclient import TestClient

from lakehouse_airflow import ui as lakehouse_ui
from lakehouse.core import events
from lakehouse.ops.overview_cache import OverviewCache

pytestmark = pytest.mark.slow

SECRET = "lakehouse-ui-access-tests-jwt-secret-0123456789abcdef-0123456789abcdef"  # 64+ bytes: HS512

from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager  # noqa: E402
from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser  # noqa: E402


class DagReadersAuthManager(SimpleAuthManager):
    """The simple auth manager's users and tokens, with per-DAG read grants: READERS maps a user to the DAG
    ids they may read ("*": every DAG, and DAGs without an id). Nothing else is granted."""

    READERS: dict[str, set[str]] = {}

    def is_authorized_dag(self, *, method, user, access_entity=None, details=None) -> bool:
        granted = self.READERS.get(user.get_name(), set())
        return method == "GET" and ("*" in granted or (details is not None and details.id in granted))


@pytest.fixture
def page(airflow_db, platform, make_spec, monkeypatch):
    """(client, cache, token(user)): the page's app on a cache of make_spec.directory that refreshes only
    when the test steps it, with DagReadersAuthManager as Airflow's auth manager."""
    from airflow.api_fastapi import app as airflow_app

    monkeypatch.setenv("AIRFLOW__CORE__AUTH_MANAGER", f"{__name__}.DagReadersAuthManager")
    monkeypatch.setenv("AIRFLOW__API_AUTH__JWT_SECRET", SECRET)
    monkeypatch.setenv("LAKEHOUSE_PIPELINES_DIR", str(make_spec.directory))
    forget_auth_manager()
    manager = airflow_app.create_auth_manager()
    assert isinstance(manager, DagReadersAuthManager)
    cache = OverviewCache(make_spec.directory, refresh_s=3600, rescan_s=3600, autostart=False)
    monkeypatch.setattr(lakehouse_ui, "CACHE", cache)
    monkeypatch.setattr(DagReadersAuthManager, "READERS", {})

    def token(user: str) -> str:
        return manager.generate_jwt(SimpleAuthManagerUser(username=user, role="viewer"))

    with TestClient(lakehouse_ui.app) as client:
        yield client, cache, token
    forget_auth_manager()


def settle(cache: OverviewCache) -> None:
    """Step the cache until it has nothing to do: the folder read and every pipeline's overview."""
    while cache.step():
        pass


def as_user(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def test_the_page_and_its_json_answer_only_a_signed_in_user(page, make_spec):
    client, cache, token = page
    spec = make_spec()
    DagReadersAuthManager.READERS = {"carol": {"*"}}
    settle(cache)
    forged = jwt.encode({"sub": "carol", "role": "admin", "aud": "apache-airflow"}, "not-the-secret-" + "x" * 64, "HS512")
    for path in ("/api/pipelines", f"/api/trace?pipeline={spec.name}&partition=0&offset=0"):
        signed_out = client.get(path)
        assert (signed_out.status_code, signed_out.json()) == (401, {"error": "Not authenticated"})
        rejected = client.get(path, headers=as_user(forged))
        assert (rejected.status_code, rejected.json()) == (403, {"error": "Invalid JWT token"})
    signed_out = client.get("/")
    assert signed_out.status_code == 401 and spec.name not in signed_out.text
    assert "Not authenticated: sign in to Airflow to see the pipelines" in signed_out.text
    assert re.search(r'data-field="login" href="[^"]*login\?next=http%3A%2F%2Ftestserver%2F"', signed_out.text)
    assert client.get("/", headers=as_user(forged)).status_code == 403
    # the UI's session cookie signs in as the Bearer header does
    client.cookies.set("_token", token("carol"))
    assert [c["pipeline"] for c in client.get("/api/pipelines").json()] == [spec.name]
    client.cookies.clear()


def test_each_pipeline_shows_only_to_users_who_may_read_all_its_dags(page, make_spec):
    client, cache, token = page
    mine, theirs = make_spec(), make_spec()
    (make_spec.directory / "broken.yaml").write_text(f"name: {mine.name}\nsource: {{topic: 'bad topic!'}}\n")
    dags = {s.name: {f"{s.name}_{kind}" for kind in s.dag_kinds} for s in (mine, theirs)}
    DagReadersAuthManager.READERS = {
        "alice": dags[mine.name],  # every DAG of one pipeline
        "bob": dags[mine.name] - {f"{mine.name}_maintenance"} | dags[theirs.name],  # all but one of `mine`'s
        "carol": {"*"},  # every DAG: the broken file too
        "dave": set(),  # none
    }
    settle(cache)

    def seen(user: str) -> list[tuple[str, str]]:
        answer = client.get("/api/pipelines", headers=as_user(token(user)))
        assert answer.status_code == 200, answer.text
        return [(card["file"], card["state"]) for card in answer.json()]

    assert seen("alice") == [(f"{mine.name}.yaml", "ok")]
    assert seen("bob") == [(f"{theirs.name}.yaml", "ok")]
    assert sorted(seen("carol")) == sorted([("broken.yaml", "broken"), (f"{mine.name}.yaml", "ok"),
                                            (f"{theirs.name}.yaml", "ok")])
    assert seen("dave") == []
    # the page: the same cards, and a user who may read nothing gets a page saying so, not an error
    alice = client.get("/", headers=as_user(token("alice")))
    assert alice.status_code == 200
    assert re.findall(r'data-pipeline="([^"]+)"', alice.text) == [mine.name]
    assert 'data-field="file">broken.yaml' not in alice.text  # the broken file claims her pipeline's name
    dave = client.get("/", headers=as_user(token("dave")))
    assert dave.status_code == 200 and 'data-field="no_pipelines"' in dave.text and "data-pipeline=" not in dave.text
    # the traces check the same grants before reading anything
    refused = client.get(f"/api/trace?pipeline={theirs.name}&partition=0&offset=0", headers=as_user(token("alice")))
    assert refused.status_code == 403 and f"may not read the DAGs of pipeline {theirs.name!r}" in refused.json()["error"]


def test_the_overview_never_shows_row_values_keys_locations_or_exception_texts(page, make_spec, platform, caplog):
    client, cache, token = page
    spec = make_spec()  # its topic does not exist: Kafka's answer is an error
    value, key, host = "4111-1111-1111-1111", "customer:alice@example.com", "db-7.corp.internal"
    docs = f"{platform.home}/quality/{spec.name}/gx/index.html"
    record = [
        events.Event(spec.name, "quality", "failed", f"FAILED: card_number {value}. Data Docs: {docs}",
                     metrics={"rows": 300, "failed_expectations": 2, "unexpected_count": 7},
                     details={"offending_offsets": [{"partition": 0, "offset": 4, "value": value}], "docs": docs}),
        events.Event(spec.name, "verify", "failed", f"FAILED: duplicated key {key!r}",
                     metrics={"offsets": 420, "rows": 421, "keys": 40, "duplicated": 1},
                     details={"findings": {"problems": [{"key": key, "table": spec.target.table}]}}),
        events.Event(spec.name, "maintenance", "failed",
                     f"Py4JJavaError: An error occurred while calling o42.removeOrphans: {platform.warehouse}/x",
                     actor=events.Actor.airflow(f"{spec.name}_maintenance", "manual__m1", "manual", "alice"),
                     details={"parameters": {"run_id": "r-1"}}),
        events.Event(spec.name, "replay", "ok", f"replayed the records of key {key}",
                     actor=events.Actor("root", "cli", {"host": host, "pid": 4242, "os_user": "root"}),
                     details={"parameters": {"offsets": "0:0-10", "key": key, "error_kind": value}}),
    ]
    events.record(*record, platform=platform)
    DagReadersAuthManager.READERS = {"carol": {"*"}}
    with caplog.at_level(logging.WARNING, logger="lakehouse.ops.history"):
        settle(cache)
    answer = client.get("/api/pipelines", headers=as_user(token("carol")))
    html = client.get("/", headers=as_user(token("carol"))).text
    body = answer.text
    for shown in (body, html):
        for secret in (value, key, host, "Py4JJavaError", str(platform.home), str(make_spec.directory),
                       platform.warehouse, "4242", "os_user"):
            assert secret not in shown, secret
    card = answer.json()[0]
    assert card["quality"]["metrics"] == {"failed_expectations": 2.0, "rows": 300.0, "unexpected_count": 7.0}
    assert card["timeline"]["latest"]["verify"]["metrics"]["duplicated"] == 1.0
    actions = {a["kind"]: a for a in card["timeline"]["actions"]}
    assert actions["replay"]["parameters"] == {"error_kind": "withheld", "key": "withheld", "offsets": "0:0-10"}
    assert (actions["replay"]["actor"], actions["replay"]["via"]) == ("root", "cli")
    assert (actions["maintenance"]["actor"], actions["maintenance"]["dag_id"]) == ("alice", f"{spec.name}_maintenance")
    assert card["kafka_error"]["category"] == "the topic does not exist"
    assert "2 failed expectations" in html and "offsets=0:0-10" in html
    # each error the page names by id has its full text in the server's log, under that id
    logged = "\n".join(r.getMessage() for r in caplog.records)
    for error in (card["kafka_error"], card["quality"]["error"], actions["maintenance"]["error"]):
        assert re.search(rf"\[error {error['id']}\]: .+", logged), error
    assert f"[error {actions['maintenance']['error']['id']}]: Py4JJavaError: An error occurred" in logged
    assert "does not exist" in re.search(rf"\[error {card['kafka_error']['id']}\]: (.+)", logged).group(1)


def test_requests_read_only_the_cache_a_pipeline_not_read_yet_is_loading(page, make_spec, platform):
    client, cache, token = page
    spec = make_spec()
    DagReadersAuthManager.READERS = {"carol": {"*"}}
    headers = as_user(token("carol"))
    starting = client.get("/api/pipelines", headers=headers)  # the folder is not read yet: nothing is, on a request
    assert (starting.status_code, starting.headers["retry-after"]) == (503, "5")
    assert 'data-field="starting"' in client.get("/", headers=headers).text
    assert cache.step()  # the folder
    loading = client.get("/api/pipelines", headers=headers).json()
    assert [(c["pipeline"], c["state"], c["read_at"]) for c in loading] == [(spec.name, "loading", None)]
    assert "rows" not in loading[0]
    assert re.search(rf'data-pipeline="{spec.name}" data-state="loading"', client.get("/", headers=headers).text)
    # the spec's tables get rows meanwhile: the page shows them only once the cache read them
    events.record(events.Event(spec.name, "quality", "ok", "passed",
                               metrics={"rows": 12, "failed_expectations": 0}), platform=platform)
    assert cache.step() and not cache.step()  # one pipeline, then nothing due
    read = client.get("/api/pipelines", headers=headers).json()[0]
    assert read["state"] == "ok" and read["quality"]["metrics"]["rows"] == 12.0 and read["age_s"] >= 0
    assert json.loads(json.dumps(read)) == read
