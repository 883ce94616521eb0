"""Third-party internals behind one adapter each.

Where the product needs something a library offers only privately (a `_name`), one small module per library
is the only place that touches it: `pyiceberg_internals`, `pyspark_internals`, `confluent_kafka_internals`.
Each says why in its docstring and names the version it was written against (`WRITTEN_AGAINST`, the version
requirements.lock pins) and the private names it touches (`INTERNALS`). tests/test_adapters.py fails when the
installed version is not that one or an internal is gone or has another signature, so an upgrade is a
decision to look at the adapter again; tests/test_one_definition.py fails on an internal touched elsewhere.

Two older adapters stay beside the code they serve: lakehouse.core.fileio (pyiceberg's `_initialize_s3_fs`,
which its FileIO subclass overrides; tests/test_fileio.py pins it) and lakehouse.core.patterns (RE2's
binding, `re2._re2`). The development stack's is lakehouse_dev.re_internals (the `re` module's parser).
"""
