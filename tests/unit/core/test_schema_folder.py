"""The folder of writer schemas beside a spec is read as untrusted input: regular files only (no symbolic
link, wherever it points; no FIFO, device, socket or folder named like a schema), each size-bounded before
it is read, a bounded number of them. A FIFO named `1.avsc` must not hang a spec load (every page load and
the DAG processor load specs). And `.proto` files compile without touching the process's file descriptors.
Pure unit tests: no Spark, no broker."""

from __future__ import annotations

import json
import os
import socket
import stat
import tempfile
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lakehouse.core.config import REPO_ROOT
from lakehouse.core import schemas
from lakehouse.core import schema_folder
from lakehouse.core.errors import SchemaTranslationError
from lakehouse.core.spec import MAX_SCHEMA_BYTES, SpecError, load_spec, load_specs, read_schema_folder

ORDERS = REPO_ROOT / "include" / "pipelines" / "orders.yaml"
ORDER_SCHEMA = {
    "type": "record", "name": "Order", "namespace": "shop",
    "fields": [{"name": "order_id", "type": "string"}, {"name": "customer_id", "type": "string"},
               {"name": "amount", "type": "double"}, {"name": "currency", "type": "string"},
               {"name": "status", "type": "string"},
               {"name": "event_time", "type": {"type": "long", "logicalType": "timestamp-millis"}}],
}
GUARD_S = 60  # far above any real load; what hangs never returns


def avro_pipeline(directory: Path) -> Path:
    """An Avro copy of the shipped orders spec in `directory`, reading `directory/schemas`."""
    (directory / "schemas").mkdir(exist_ok=True)
    path = directory / "orders.yaml"
    path.write_text(ORDERS.read_text().replace("value_format: json", "value_format: avro\n  schemas: schemas"))
    return path


def schema_file(folder: Path, name: str, schema: dict = ORDER_SCHEMA) -> Path:
    (folder / name).write_text(json.dumps(schema))
    return folder / name


def in_time(call, *args):
    """call(*args) run in a thread: ("returned", value), ("raised", exception), or ("hung", None) after GUARD_S."""
    outcome: list = []

    def run():
        try:
            outcome.append(("returned", call(*args)))
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            outcome.append(("raised", exc))

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(GUARD_S)
    return outcome[0] if outcome else ("hung", None)


# ------------------------------------------------------------------------------ what is not a file

def test_a_fifo_named_like_a_schema_is_refused_at_once_not_waited_on(tmp_path):
    spec_path = avro_pipeline(tmp_path)
    schema_file(tmp_path / "schemas", "1.avsc")
    os.mkfifo(tmp_path / "schemas" / "2.avsc")
    how, error = in_time(load_spec, spec_path)
    assert how == "raised", f"loading the spec {how}"
    assert isinstance(error, SpecError) and error.field == "source.schemas"
    assert "2.avsc is a FIFO, not a regular file" in error.why


def test_a_fifo_schema_breaks_its_own_spec_only_when_the_whole_folder_loads(tmp_path):
    """What the overview page and the DAG processor do: load every spec of the pipelines folder."""
    spec_path = avro_pipeline(tmp_path)
    os.mkfifo(tmp_path / "schemas" / "1.avsc")
    (tmp_path / "customers.yaml").write_text(ORDERS.with_name("customers.yaml").read_text())
    how, loaded = in_time(load_specs, tmp_path)
    assert how == "returned", f"loading the folder {how}"
    assert list(loaded.specs) == ["customers"]
    assert "1.avsc is a FIFO" in loaded.errors[str(spec_path)].why


@pytest.mark.parametrize("where", ["outside", "inside"])
def test_a_symbolic_link_is_refused_wherever_it_leads(tmp_path, where):
    spec_path = avro_pipeline(tmp_path)
    folder = tmp_path / "schemas"
    schema_file(folder, "1.avsc")
    target = schema_file(tmp_path, "elsewhere.avsc") if where == "outside" else folder / "1.avsc"
    (folder / "2.avsc").symlink_to(target)
    with pytest.raises(SpecError) as info:
        load_spec(spec_path)
    assert "2.avsc is a symbolic link; a schema folder holds regular files only" in info.value.why
    assert "copy the schema into the folder instead" in info.value.why


def test_a_folder_or_socket_named_like_a_schema_is_refused_naming_what_it_is(tmp_path):
    folder = tmp_path / "schemas"
    folder.mkdir()
    (folder / "3.avsc").mkdir()
    with pytest.raises(ValueError, match=r"^3\.avsc is a folder, not a regular file"):
        read_schema_folder(folder)
    (folder / "3.avsc").rmdir()
    with socket.socket(socket.AF_UNIX) as listening:
        listening.bind(str(folder / "4.proto"))
        with pytest.raises(ValueError, match=r"^4\.proto is a socket, not a regular file"):
            read_schema_folder(folder)


def test_a_device_named_like_a_schema_is_never_opened(tmp_path):
    folder = tmp_path / "schemas"
    folder.mkdir()
    try:  # the same device as /dev/zero: reading it would never end
        os.mknod(folder / "5.json", stat.S_IFCHR | 0o600, os.stat("/dev/zero").st_rdev)
    except PermissionError:  # no CAP_MKNOD: the check each schema file goes through, on /dev's own zero
        dev = os.open("/dev", os.O_RDONLY | os.O_DIRECTORY)
        try:
            how, error = in_time(schema_folder.read_schema_file, dev, "zero")
        finally:
            os.close(dev)
        assert how == "raised", f"reading /dev/zero as a schema {how}"
        assert str(error).startswith("zero is a character device, not a regular file")
        return
    how, error = in_time(read_schema_folder, folder)
    assert how == "raised", f"reading the folder {how}"
    assert str(error).startswith("5.json is a character device, not a regular file")


# ------------------------------------------------------------------------------------------ bounds

def test_each_schema_and_the_whole_folder_are_bounded_before_reading(tmp_path, monkeypatch):
    folder = tmp_path / "schemas"
    folder.mkdir()
    with open(folder / "1.avsc", "wb") as handle:  # sparse: the size is what counts, not what was written
        handle.truncate(MAX_SCHEMA_BYTES + 1)
    with pytest.raises(ValueError, match=f"1.avsc is larger than {MAX_SCHEMA_BYTES} bytes"):
        read_schema_folder(folder)
    (folder / "1.avsc").unlink()
    for schema_id in (1, 2, 3):
        schema_file(folder, f"{schema_id}.avsc")
    one = len(json.dumps(ORDER_SCHEMA))
    monkeypatch.setattr(schema_folder, "MAX_SCHEMA_FOLDER_BYTES", 2 * one)
    with pytest.raises(ValueError, match="the schemas add up to more than"):
        read_schema_folder(folder)
    monkeypatch.setattr(schema_folder, "MAX_SCHEMA_FOLDER_BYTES", 3 * one)
    assert [schema_id for schema_id, _, _ in read_schema_folder(folder)] == [1, 2, 3]
    for i in range(5):
        (folder / f"notes-{i}.txt").write_text("not a schema")
    monkeypatch.setattr(schema_folder, "MAX_SCHEMA_FOLDER_ENTRIES", 7)
    with pytest.raises(ValueError, match="more than 7 names in the folder"):
        read_schema_folder(folder)


def test_a_schema_that_is_not_utf8_names_the_file(tmp_path):
    folder = tmp_path / "schemas"
    folder.mkdir()
    (folder / "1.avsc").write_bytes(b'{"type": "record", "name": "caf\xe9"}')
    with pytest.raises(ValueError, match=r"^1\.avsc is not UTF-8 text \(invalid continuation byte at byte 31\)"):
        read_schema_folder(folder)


KINDS = ("schema", "link-in", "link-out", "fifo", "folder")


@settings(max_examples=60, deadline=None, database=None)
@given(layout=st.dictionaries(st.sampled_from([f"{i}{ext}" for i in range(1, 5) for ext in (".avsc", ".json")]
                                              + ["notes.txt", "x.avsc"]),
                              st.sampled_from(KINDS), max_size=6))
def test_any_layout_reads_its_regular_schemas_or_names_the_first_file_that_is_not_one(layout):
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch) / "schemas"
        folder.mkdir()
        outside = schema_file(Path(scratch), "outside.avsc")
        for name, kind in layout.items():
            if kind == "schema":
                schema_file(folder, name)
            elif kind == "link-in":  # to a regular file of the folder
                (folder / name).symlink_to(schema_file(folder, f"target-of-{name}").name)
            elif kind == "link-out":
                (folder / name).symlink_to(outside)
            elif kind == "fifo":
                os.mkfifo(folder / name)
            else:
                (folder / name).mkdir()
        how, found = in_time(read_schema_folder, folder)
        assert how != "hung"
        named = {n: k for n, k in layout.items() if n[0].isdigit()}
        ids = sorted((int(n.split(".")[0]), n) for n in named)
        duplicate = len({i for i, _ in ids}) < len(ids)
        if how == "returned":
            assert not duplicate and all(k == "schema" for k in named.values())
            assert [(schema_id, name.endswith(".avsc") and "AVRO" or "JSON") for schema_id, name in ids] == \
                [(schema_id, schema_type) for schema_id, schema_type, _ in found]
            assert all(json.loads(text) == ORDER_SCHEMA for _, _, text in found)
        else:
            assert isinstance(found, ValueError)
            assert duplicate or any(k != "schema" for k in named.values())
            if not duplicate:
                first = next(n for _, n in ids if named[n] != "schema")
                assert str(found).startswith(f"{first} is ")


# ---------------------------------------------------------------------------------------- Protobuf

def test_a_proto_file_that_does_not_compile_is_explained_with_protocs_words_and_protoc_is_bounded(monkeypatch):
    with pytest.raises(SchemaTranslationError) as info:
        schemas.compile_proto('syntax = "proto3";\nmessage M { strin x = 1; }\n')
    assert str(info.value) == 'not a .proto file protoc compiles: writer_schema.proto:2:13: "strin" is not defined.'
    with pytest.raises(SchemaTranslationError, match=r'Backslashes, consecutive slashes, "\.", or "\.\." are not '
                                                     r'allowed in the virtual path'):
        schemas.compile_proto('syntax = "proto3";\nimport "../../../etc/hostname";\nmessage M { string x = 1; }\n')
    monkeypatch.setattr(schemas, "PROTOC_TIMEOUT_S", 0.001)  # protoc runs apart, so it can be given up on
    with pytest.raises(SchemaTranslationError, match=r"^protoc did not compile the \.proto file within 0\.001 s"):
        schemas.compile_proto('syntax = "proto3";\nmessage Slow { string x = 1; }\n')


def test_compiling_leaves_what_other_threads_write_to_stderr_where_it_goes():
    """protoc's diagnostics are caught without redirecting fd 2: a thread logging meanwhile loses nothing,
    and nothing of it ends up in a compile error."""
    read_end, write_end = os.pipe()
    saved = os.dup(2)
    received = bytearray()
    drained = threading.Thread(target=lambda: [received.extend(chunk) for chunk in iter(
        lambda: os.read(read_end, 65536), b"")], daemon=True)
    drained.start()
    stop = threading.Event()
    written = []

    def log_lines():
        n = 0
        while not stop.is_set() or n < 50:
            line = f"other-thread-line-{n}\n".encode()
            os.write(2, line)
            written.append(line)
            n += 1
            time.sleep(0.0002)

    messages = []
    os.dup2(write_end, 2)
    try:
        logger = threading.Thread(target=log_lines, daemon=True)
        logger.start()
        for i in range(8):  # distinct texts: the cache answers a text seen before without protoc
            try:
                schemas.compile_proto(f'syntax = "proto3";\nmessage M{i} {{ strin x = 1; }}\n')
            except SchemaTranslationError as exc:
                messages.append(str(exc))
        stop.set()
        logger.join(GUARD_S)
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(write_end)
    drained.join(GUARD_S)
    os.close(read_end)
    assert bytes(received) == b"".join(written)  # every line, in order, nothing else
    assert len(messages) == 8 and all('"strin" is not defined' in m and "other-thread" not in m for m in messages)
