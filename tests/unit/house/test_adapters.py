"""The adapters to third-party internals (lakehouse.core.adapters, lakehouse_dev.re_internals) pinned to the
versions they were written against: the installed version is the one requirements.lock pins and the adapter's
WRITTEN_AGAINST, and each internal it touches is there, with the signature it is called with and doing what
the adapter says. An upgrade fails here first: read the adapter again, then move its WRITTEN_AGAINST.

(tests/test_one_definition.py holds that nothing else touches these internals; tests/test_data_file_bounds.py
that the statistics plan the task writer adjusts reaches pyiceberg's writer.)
"""

from __future__ import annotations

import base64
import inspect
import itertools
import re
import subprocess
import sys
import uuid
from importlib.metadata import version

import pytest
import requests
from packaging.utils import canonicalize_name

from lakehouse.core import config
from lakehouse.core.adapters import confluent_kafka_internals, pyiceberg_internals, pyspark_internals
from lakehouse_airflow import spark_provider_internals
from lakehouse_dev import re_internals

REPO = config.REPO_ROOT
ADAPTERS = (pyiceberg_internals, pyspark_internals, confluent_kafka_internals, spark_provider_internals)


def locked(name: str) -> str:
    """The version requirements.lock pins for the distribution `name`."""
    for line in (REPO / "requirements.lock").read_text().splitlines():
        pinned = re.match(r"([A-Za-z0-9_.-]+)==([^\s;\\]+)", line)
        if pinned and canonicalize_name(pinned.group(1)) == canonicalize_name(name):
            return pinned.group(2)
    raise AssertionError(f"{name} is not in requirements.lock")


def parameters(function) -> list[str]:
    return list(inspect.signature(function).parameters)


@pytest.mark.parametrize("adapter", ADAPTERS, ids=lambda a: a.__name__.rsplit(".", 1)[-1])
def test_an_adapter_runs_on_the_version_it_was_written_against_which_the_lock_pins(adapter):
    name, written = adapter.WRITTEN_AGAINST
    assert (version(name), locked(name)) == (written, written), (
        f"{name} {version(name)} installed, {locked(name)} locked: {adapter.__name__} was written against "
        f"{written}; check the internals its docstring names, then update WRITTEN_AGAINST")
    assert all(internal in inspect.getsource(adapter) for internal in adapter.INTERNALS)


def test_the_re_adapter_runs_on_the_python_the_image_pins():
    image = re.search(r"^FROM python:(\d+)\.(\d+)\.", (REPO / "docker" / "Dockerfile").read_text(), re.MULTILINE)
    assert image, "docker/Dockerfile has no python image"
    _, written = re_internals.WRITTEN_AGAINST
    assert f"{sys.version_info.major}.{sys.version_info.minor}" == ".".join(image.groups()) == written


# ------------------------------------------------------------------------------------------------ pyiceberg

def test_pyicebergs_writer_and_its_statistics_plan_take_what_the_adapter_passes():
    import pyiceberg.io.pyarrow as writer

    assert parameters(writer._dataframe_to_data_files) == ["table_metadata", "df", "io", "write_uuid", "counter"]
    assert parameters(writer.compute_statistics_plan) == ["schema", "table_properties"]


def test_a_fast_append_gives_its_updates_and_requirements_without_committing(tmp_path):
    import pyarrow as pa
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.table.update import AddSnapshotUpdate, AssertRefSnapshotId

    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/c.db", warehouse=f"file://{tmp_path}")
    catalog.create_namespace("db")
    rows = pa.table({"id": pa.array([1, 2], pa.int64())})
    table = catalog.create_table("db.t", schema=rows.schema)
    files = pyiceberg_internals.write_data_files(table.io, table.metadata, rows, uuid.uuid4(),
                                                 itertools.count(), lambda plan, *_: plan)
    append = table.transaction().update_snapshot(snapshot_properties={"k": "v"}).fast_append()
    for data_file in files:
        append.append_data_file(data_file)

    updates, requirements = pyiceberg_internals.snapshot_change(append)

    [added] = [u for u in updates if isinstance(u, AddSnapshotUpdate)]
    assert added.snapshot.snapshot_id == append.snapshot_id and added.snapshot.summary["k"] == "v"
    assert any(isinstance(r, AssertRefSnapshotId) and r.ref == "main" for r in requirements)
    assert catalog.load_table("db.t").current_snapshot() is None  # nothing committed


def test_a_rest_catalog_keeps_its_session_and_endpoints_where_the_adapter_reads_them():
    from pyiceberg.catalog.rest import RestCatalog

    source = inspect.getsource(RestCatalog)
    assert re.search(r"self\._session\s*=", source) and re.search(r"self\._supported_endpoints\s*=", source)


def test_a_rest_error_answer_becomes_the_exception_its_status_maps_to():
    from pyiceberg.catalog.rest.response import _handle_non_200_response
    from pyiceberg.exceptions import CommitFailedException, CommitStateUnknownException

    assert parameters(_handle_non_200_response) == ["exc", "error_handler"]

    def answer(status: int) -> requests.HTTPError:
        response = requests.Response()
        response.status_code = status
        response._content = b'{"error": {"message": "main moved", "type": "CommitFailedException", "code": 409}}'
        return requests.HTTPError(response=response)

    with pytest.raises(CommitFailedException, match="main moved"):
        pyiceberg_internals.raise_rest_error(answer(409), {409: CommitFailedException})
    with pytest.raises(CommitStateUnknownException):
        pyiceberg_internals.raise_rest_error(answer(502), {502: CommitStateUnknownException})


# ------------------------------------------------------------------------------------------------ confluent-kafka

def test_a_serialized_protobuf_schema_and_its_references_resolve_as_the_deserializer_does():
    from confluent_kafka.schema_registry import Schema
    from confluent_kafka.schema_registry._sync.protobuf import _resolve_named_schema
    from confluent_kafka.schema_registry.common.protobuf import _init_pool, _str_to_proto
    from confluent_kafka.serialization import SerializationError
    from google.protobuf import descriptor_pb2

    assert parameters(_str_to_proto) == ["name", "schema_str"] and parameters(_init_pool) == ["pool"]
    assert parameters(_resolve_named_schema)[:3] == ["schema", "schema_registry_client", "pool"]
    written = descriptor_pb2.FileDescriptorProto(name="orders.proto", package="shop")
    text = base64.b64encode(written.SerializeToString()).decode()

    descriptor = confluent_kafka_internals.serialized_descriptor("writer_schema_7.proto", text)
    assert (descriptor.name, descriptor.package) == ("writer_schema_7.proto", "shop")
    with pytest.raises(SerializationError):  # .proto text, not serialized descriptors
        confluent_kafka_internals.serialized_descriptor("x.proto", 'syntax = "proto3"; message M {}')
    pool = confluent_kafka_internals.pool_with_references(Schema(text, "PROTOBUF"), client=None)  # no references
    assert pool.FindFileByName("google/protobuf/timestamp.proto").package == "google.protobuf"


# ------------------------------------------------------------------------------------------------ pyspark

def test_pyspark_keeps_the_jvm_handles_where_the_adapter_reads_them():
    from pyspark import SparkContext
    from pyspark.errors.exceptions.captured import CapturedException
    from pyspark.sql import SparkSession

    context, session = inspect.getsource(SparkContext), inspect.getsource(SparkSession)
    assert {"_gateway", "_jvm", "_ensure_initialized"} <= set(vars(SparkContext))  # the class's, None until a JVM
    assert re.search(r"self\._jsc\s*=", context) and re.search(r"self\._jsparkSession\s*=", session)
    assert parameters(SparkContext._ensure_initialized) == ["instance", "gateway", "conf"]
    assert "origin" in parameters(CapturedException.__init__)
    assert re.search(r"self\._origin\s*=\s*origin", inspect.getsource(CapturedException.__init__))


def test_without_a_jvm_there_is_no_gateway_and_a_python_error_has_no_java_exception():
    # in an interpreter of its own: a worker of `make test` may hold the Spark session of an earlier e2e file
    probe = ("from lakehouse.core.adapters import pyspark_internals as p\n"
             "print(p.gateway() is None, p.captured_java_exception(ValueError('x')) is None)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.split() == ["True", "True"], done.stderr[-2000:]


# ------------------------------------------------------------------------------------------------ re

def test_the_pattern_parser_gives_the_tree_the_producer_walks():
    from re import _parser

    o = re_internals.opcodes
    assert parameters(_parser.parse)[:2] == ["str", "flags"]
    assert repr(re_internals.parse("[A-Z]{3}")) == "[(MAX_REPEAT, (3, 3, [(IN, [(RANGE, (65, 90))])]))]"
    assert list(re_internals.parse(r"a|\d")) == [(o.IN, [(o.LITERAL, 97), (o.CATEGORY, o.CATEGORY_DIGIT)])]
    assert re_internals.parse("[A-Z]{3}")[0][0] is o.MAX_REPEAT
    used = ("NEGATE LITERAL RANGE CATEGORY NOT_LITERAL ANY IN BRANCH SUBPATTERN GROUPREF MAX_REPEAT MIN_REPEAT "
            "MAXREPEAT AT CATEGORY_DIGIT CATEGORY_NOT_DIGIT CATEGORY_WORD CATEGORY_NOT_WORD CATEGORY_SPACE "
            "CATEGORY_NOT_SPACE").split()
    assert [name for name in used if not hasattr(o, name)] == []
    with pytest.raises(re.error):
        re_internals.parse("(")


# ---------------------------------------------------------------------------------- Airflow's Spark provider

def test_a_spark_submit_hook_holds_no_process_until_it_submits():
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    hook = SparkSubmitHook(conn_id="spark_default")
    assert spark_provider_internals.submitted_process(hook) is None  # the attribute exists, unset
    assert "start_new_session" not in parameters(hook.submit)  # it passes **kwargs through to Popen
