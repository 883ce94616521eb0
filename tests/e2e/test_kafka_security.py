"""Secured Kafka: SASL/SCRAM and TLS settings reach every client; wrong credentials fail at once and lose nothing.

One embedded broker for the module, started the way users start it (LAKEHOUSE_BROKER_AUTH=scram-sha-512,
LAKEHOUSE_BROKER_TLS=true, `stack.up()`) in its own LAKEHOUSE_HOME on a free port: clients must speak
SASL_SSL with SCRAM-SHA-512 as user `lakehouse`, trusting the stack's self-signed CA. The password is the
one `stack.up()` generated; tests read it from its owner-only file and check it never shows anywhere.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import uuid
from pathlib import Path

import pytest
import yaml

from lakehouse.core import config, errors, topics
from lakehouse.core.spec import PipelineSpec, load_spec
from lakehouse.ops.status import pipeline_status
from lakehouse_dev import produce, stack
from tests.conftest import TEMPLATE_SPEC, consume_everything, free_port
from e2e import LAKEHOUSE, assert_exactly_once, coordinates, lakehouse, log_ends, rows

pytestmark = pytest.mark.slow

WRONG = "not-the-password-0b1c"


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The module's SASL_SSL/SCRAM-SHA-512 embedded broker: {"home", "password", "status"}."""
    home = tmp_path_factory.mktemp("secured-home")
    with pytest.MonkeyPatch.context() as mp:
        for name in list(os.environ):
            if name.startswith(config.KAFKA_PREFIX) or name == "LAKEHOUSE_BOOTSTRAP_SERVERS":
                mp.delenv(name)
        mp.setenv("LAKEHOUSE_HOME", str(home))
        mp.setenv("LAKEHOUSE_BROKER_PORT", str(free_port()))
        mp.setenv("LAKEHOUSE_BROKER_AUTH", "scram-sha-512")
        mp.setenv("LAKEHOUSE_BROKER_TLS", "true")
        status = stack.up()
        try:
            password = (home / stack.SECURITY_DIR / stack.PASSWORD_FILE).read_text().strip()
            yield {"home": home, "password": password, "status": status}
        finally:
            stack.down(purge=True)


def _topic(make_spec, **overrides) -> PipelineSpec:
    spec = make_spec(**overrides)
    topics.ensure_topics([spec])
    return spec


def _with_env(monkeypatch, **env: str):
    for key, value in env.items():
        monkeypatch.setenv(key, value)


def test_the_secured_stack_tells_clients_how_to_connect_and_keeps_the_password_private(secured):
    home, password = secured["home"], secured["password"]
    assert len(password) >= 24
    security = home / stack.SECURITY_DIR
    assert stat.S_IMODE(security.stat().st_mode) == 0o700
    for name in (stack.PASSWORD_FILE, stack.KEYSTORE_FILE):
        assert stat.S_IMODE((security / name).stat().st_mode) == 0o600, name
    state = json.loads((home / stack.STATE_FILE).read_text())
    assert state["security"]["protocol"] == "SASL_SSL"
    assert state["security"]["mechanism"] == "SCRAM-SHA-512" and state["security"]["username"] == "lakehouse"
    assert state["bootstrap_servers"] == state["listeners"]["SASL_SSL"] != state["listeners"]["PLAINTEXT"]
    assert password not in (home / stack.STATE_FILE).read_text()
    for kept in (home / "kafka").rglob("*"):  # the broker keeps salted SCRAM credentials, never the password
        assert not kept.is_file() or password.encode() not in kept.read_bytes(), kept

    platform = config.load()
    conf = platform.kafka()
    assert (conf["security.protocol"], conf["sasl.mechanism"], conf["sasl.password"]) == \
        ("SASL_SSL", "SCRAM-SHA-512", password)
    assert conf["ssl.ca.location"] == str(security / stack.CA_FILE)
    assert password not in repr(platform)
    assert config.redact_kafka(conf)["sasl.password"] == "***"
    assert password not in json.dumps(config.redact_kafka(conf))

    status = stack.status()
    assert status["broker"]["running"] and status["broker"]["error"] is None
    assert status["broker"]["security"]["protocol"] == "SASL_SSL"
    assert password not in json.dumps(status)
    shown = subprocess.run([LAKEHOUSE, "stack", "status", "--json"], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["broker"]["security"]["mechanism"] == "SCRAM-SHA-512"
    assert password not in shown.stdout + shown.stderr

    # a client without credentials gets no metadata, as from an Apache Kafka SASL listener
    anonymous = config.PlatformConfig(home=home, bootstrap_servers=platform.bootstrap_servers)
    with pytest.raises(errors.TopicError):
        topics.topic_partitions(anonymous, timeout=2.0)
    # nor does one that does not trust the stack's CA: a clear TLS error, at once
    untrusting = platform.with_kafka({"ssl.ca.location": "/etc/ssl/certs/ca-certificates.crt"})
    with pytest.raises(errors.KafkaAuthError, match="TLS handshake"):
        topics.topic_partitions(untrusting, timeout=10.0)


def _module_spec(directory: Path, partitions: int) -> PipelineSpec:
    """The orders spec under unique names in `directory` (as conftest's make_spec, for module fixtures)."""
    suffix = uuid.uuid4().hex[:10]
    raw = yaml.safe_load(TEMPLATE_SPEC.read_text())
    raw["name"] = f"orders_{suffix}"
    raw["source"].update(topic=f"orders-{suffix}", partitions=partitions)
    raw["target"]["table"] = f"raw.orders_{suffix}"
    raw["dead_letter"]["table"] = f"raw.orders_{suffix}_dlq"
    raw["publish"].update(view=f"serve.orders_{suffix}", suite="orders")
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{raw['name']}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return load_spec(path)


@pytest.fixture(scope="module")
def ingested(secured, tmp_path_factory) -> dict:
    """400 records (10% bad) on a 2-partition topic; `lakehouse ingest --once`, `status` and `topics`
    run with a wrong password first (kept: `refused`, and the table coordinates right after:
    `after_refusal`), then `ingest --once` with the stack's credentials (`ok`)."""
    spec = _module_spec(tmp_path_factory.mktemp("secured-pipelines"), partitions=2)
    topics.ensure_topics([spec])
    produce.produce(spec, 400, bad_ratio=0.1, seed=11)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LAKEHOUSE_KAFKA_SASL_PASSWORD", WRONG)
        refused = {
            "ingest": lakehouse(spec, "ingest", "--pipeline", spec.name, "--once", timeout=240),
            "status": lakehouse(spec, "status", "--pipeline", spec.name, timeout=60),
            "topics": lakehouse(spec, "topics", "--pipeline", spec.name, timeout=60),
        }
    after_refusal = coordinates(config.load(), spec)
    ok = lakehouse(spec, "ingest", "--pipeline", spec.name, "--once", "--json", timeout=300)
    return {"spec": spec, "refused": refused, "after_refusal": after_refusal, "ok": ok}


def test_wrong_credentials_fail_ingest_status_and_topics_at_once_naming_broker_mechanism_and_user(
        secured, ingested):
    for command, run in ingested["refused"].items():
        output = run.stdout + run.stderr
        assert run.returncode == 2, (command, output[-3000:])
        assert "refused the credentials" in run.stderr, (command, run.stderr[-3000:])
        assert "SCRAM-SHA-512" in run.stderr and "user 'lakehouse'" in run.stderr
        assert secured["status"]["bootstrap_servers"] in run.stderr
        assert "sasl.password" in run.stderr  # says what to check...
        assert WRONG not in output and secured["password"] not in output  # ...without showing it
    assert not ingested["after_refusal"]  # nothing was written while the login was refused


def test_ingest_over_sasl_ssl_reads_every_record_exactly_once_after_a_refused_run(secured, ingested):
    """The driver plans and the Spark tasks read through SASL_SSL with the stack's credentials."""
    ok = ingested["ok"]
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert assert_exactly_once(config.load(), ingested["spec"]) == 400
    assert secured["password"] not in ok.stdout + ok.stderr


def test_a_scram_sha_256_plaintext_listener_round_trips_from_the_command_line(make_spec, tmp_path, monkeypatch):
    """SASL_PLAINTEXT with SCRAM-SHA-256 via `lakehouse stack up --auth`, in a home of its own."""
    home = tmp_path / "sha256-home"
    for name in list(os.environ):
        if name.startswith(config.KAFKA_PREFIX) or name.startswith("LAKEHOUSE_BROKER_"):
            monkeypatch.delenv(name)
    _with_env(monkeypatch, LAKEHOUSE_HOME=str(home), LAKEHOUSE_BROKER_PORT=str(free_port()))
    up = subprocess.run([LAKEHOUSE, "stack", "up", "--auth", "scram-sha-256", "--no-tls"], capture_output=True,
                        text=True, timeout=120)
    try:
        assert up.returncode == 0, up.stderr[-3000:]
        assert "SASL_PLAINTEXT, SCRAM-SHA-256 as user 'lakehouse'" in up.stdout
        password = (home / stack.SECURITY_DIR / stack.PASSWORD_FILE).read_text().strip()
        assert password not in up.stdout + up.stderr
        platform = config.load()
        assert platform.kafka()["sasl.mechanism"] == "SCRAM-SHA-256"
        spec = _topic(make_spec, partitions=1)
        produce.produce(spec, 50, seed=3, platform=platform)
        assert len(consume_everything(spec.source.topic, platform)) == 50
        assert pipeline_status(spec, platform, with_timeline=False)["lag_records"] == 50
        # every listener runs: asking the running broker for other security points clients at another one
        again = subprocess.run([LAKEHOUSE, "stack", "up", "--auth", "scram-sha-512", "--tls"], capture_output=True,
                               text=True, timeout=60)
        assert again.returncode == 0 and "SASL_SSL, SCRAM-SHA-512 as user 'lakehouse'" in again.stdout, again.stderr
        assert json.loads(subprocess.run([LAKEHOUSE, "stack", "status", "--json"], capture_output=True, text=True,
                                         timeout=60).stdout)["broker"]["pid"] == json.loads(
            (home / stack.STATE_FILE).read_text())["pid"]  # the same broker, not a restart
        assert len(consume_everything(spec.source.topic, config.load())) == 50
    finally:
        down = subprocess.run([LAKEHOUSE, "stack", "down", "--purge"], capture_output=True, text=True, timeout=60)
        assert down.returncode == 0, down.stderr


def _connection(secured: dict, password: str) -> str:
    conf = config.load().kafka()
    return json.dumps({"conn_type": "kafka", "extra": {
        "bootstrap.servers": conf["bootstrap.servers"], "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "lakehouse", "sasl.password": password,
        "ssl.ca.location": conf["ssl.ca.location"]}})


def test_sensors_and_their_trigger_use_the_kafka_connection_and_fail_at_once_when_it_is_refused(
        secured, make_spec, monkeypatch):
    from lakehouse_airflow.sensors import LagSensor
    from lakehouse_airflow.triggers import SloTrigger

    spec = _topic(make_spec, partitions=1)
    produce.produce(spec, 20, seed=5)
    _with_env(monkeypatch, LAKEHOUSE_PIPELINES_DIR=str(make_spec.directory))

    # the environment's password is wrong, the connection's is right: the connection wins
    _with_env(monkeypatch, LAKEHOUSE_KAFKA_SASL_PASSWORD=WRONG,
              AIRFLOW_CONN_LAKEHOUSE_KAFKA=_connection(secured, secured["password"]))
    sensor = LagSensor(task_id="lag", pipeline=spec.name, max_records=1000, max_seconds=3600, deferrable=True)
    passed = sensor.execute(context={})
    assert passed["ok"] is True and passed["measured"]["lag_records"] == 20

    # a refused connection fails the sensor and its trigger at once, saying why, without the password
    _with_env(monkeypatch, AIRFLOW_CONN_LAKEHOUSE_KAFKA=_connection(secured, WRONG + "-conn"))
    with pytest.raises(errors.KafkaAuthError) as refused:
        LagSensor(task_id="lag", pipeline=spec.name, max_records=0, deferrable=True).execute(context={})
    message = str(refused.value)
    assert "refused the credentials" in message and "SCRAM-SHA-512" in message and "user 'lakehouse'" in message
    assert WRONG not in message and secured["password"] not in message

    trigger = SloTrigger(kind="lag", pipeline=spec.name, limits={"lag_records": 0, "lag_s": 0},
                         deadline=10 ** 10, poll_interval=1, pipelines_dir=str(make_spec.directory),
                         kafka_conn_id="lakehouse_kafka")
    assert WRONG not in json.dumps(trigger.serialize()[1])

    async def first_event():
        async for event in trigger.run():
            return event

    with pytest.raises(errors.KafkaAuthError):
        asyncio.run(asyncio.wait_for(first_event(), timeout=60))


def _texts_under(folder: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in folder.rglob("*") if p.is_file())


def test_a_dag_run_takes_kafka_credentials_from_the_connection_and_never_shows_them(
        secured, ingested, run_dag, monkeypatch, capfd):
    from airflow.models.renderedtifields import RenderedTaskInstanceFields
    from airflow.models.serialized_dag import SerializedDagModel
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    password = secured["password"]
    spec = ingested["spec"]
    assert ingested["ok"].returncode == 0, ingested["ok"].stderr[-3000:]
    pipelines_dir = Path(spec.path).parent
    ends = log_ends(config.load(), spec.source.topic)

    # the workers' environment holds a wrong password; only the connection holds the right one
    _with_env(monkeypatch, LAKEHOUSE_KAFKA_SASL_PASSWORD=WRONG,
              AIRFLOW_CONN_LAKEHOUSE_KAFKA=_connection(secured, password))
    candidate = f"{spec.target.table.split('.')[0]}.cand_{spec.name}"
    run = run_dag(f"{spec.name}_backfill", pipelines_dir,
                  conf={"offsets": ",".join(f"{p}:0-{e}" for p, e in sorted(ends.items())), "target": "candidate",
                        "candidate_table": candidate, "dry_run": False})
    assert run.state == "success", [(ti.task_id, ti.state) for ti in run.get_task_instances()]
    platform = config.load().with_kafka({"sasl.password": password})
    # the plan (hook) and the Spark job (spark-submit's environment) both read Kafka through the connection
    # (a candidate holds the range's valid records: the bad tenth stays in the pipeline's dead letters)
    held = {(r["_kafka"]["partition"], r["_kafka"]["offset"]) for r in rows(platform, spec, candidate)}
    assert held == {(r["_kafka"]["partition"], r["_kafka"]["offset"]) for r in rows(platform, spec, spec.target.table)}

    seen = {"captured output": "".join(capfd.readouterr()),
            "task logs": _texts_under(Path(os.environ["AIRFLOW_HOME"]) / "logs"),
            "DAG files": _texts_under(config.REPO_ROOT / "dags") + _texts_under(pipelines_dir)}
    with create_session() as session:
        seen["XComs"] = json.dumps([XComModel.deserialize_value(x) for x in session.query(XComModel).filter_by(
            dag_id=run.dag_id, run_id=run.run_id)], default=str)
        seen["rendered template fields"] = json.dumps([r.rendered_fields for r in session.query(
            RenderedTaskInstanceFields).filter_by(dag_id=run.dag_id, run_id=run.run_id)], default=str)
        seen["serialized DAG"] = json.dumps(SerializedDagModel.get(run.dag_id, session=session).data, default=str)
    # dag.test() runs the tasks in this process: their logs are the captured output (the folder is
    # checked too, for runs that write it); make sure the places searched hold what they should
    assert "Spark-Submit cmd" in seen["captured output"]
    assert json.loads(seen["XComs"]), "the plan's XCom should be there"
    assert "LAKEHOUSE_PIPELINES_DIR" in seen["rendered template fields"]  # env_vars was rendered and stored
    for where, text in seen.items():
        assert password not in text, f"the Kafka password appears in the {where}"
        assert WRONG not in text, f"the environment's Kafka password appears in the {where}"


def test_spark_submit_arguments_forward_kafka_settings_but_no_secret(make_spec, monkeypatch):
    """env_vars is a templated field (stored and shown by Airflow): only the allow-list of non-secret
    settings goes there; secrets stay in the worker's environment (tests/unit/house/test_secrets.py has more)."""
    from lakehouse_airflow.spark import submit_kwargs

    _with_env(monkeypatch, LAKEHOUSE_KAFKA_SECURITY_PROTOCOL="SASL_SSL", LAKEHOUSE_KAFKA_SASL_PASSWORD=WRONG,
              LAKEHOUSE_KAFKA_SSL_KEY_PASSWORD=WRONG + "-key",
              # a property no deny-list names, yet it can carry a secret: not on the allow-list, so not forwarded
              LAKEHOUSE_KAFKA_SASL_OAUTHBEARER_EXTENSIONS=f"apiKey={WRONG}",
              LAKEHOUSE_CATALOG_URI=f"postgresql+psycopg2://lake:{WRONG}@127.0.0.1:5432/lake")
    forwarded = submit_kwargs(make_spec(), "replay")["env_vars"]
    assert forwarded["LAKEHOUSE_KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL"
    assert not {"LAKEHOUSE_KAFKA_SASL_PASSWORD", "LAKEHOUSE_KAFKA_SSL_KEY_PASSWORD",
                "LAKEHOUSE_KAFKA_SASL_OAUTHBEARER_EXTENSIONS", "LAKEHOUSE_CATALOG_URI"} & set(forwarded)
    assert WRONG not in json.dumps(forwarded)
    monkeypatch.setenv("LAKEHOUSE_CATALOG_URI", "sqlite:////tmp/catalog.db")  # no password: forwarded as before
    assert submit_kwargs(make_spec(), "replay")["env_vars"]["LAKEHOUSE_CATALOG_URI"] == "sqlite:////tmp/catalog.db"
