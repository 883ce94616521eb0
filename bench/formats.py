"""The decoder's records/s per value format on the same traffic (issue 26: every format near JSON's speed).

`decode_rates` writes the same records as each wire format (bench.workloads.as_format: the contract's own
writer schema, broken values left as they were) and times the pipeline's own decoder on them
(bench.workloads.decode: RecordValidator + BatchBuilder, one core), the formats taking turns so that a
busy machine slows them alike. `python -m bench.formats [pipeline] [records] [repeats]` prints them.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path
from typing import Sequence

from bench import workloads
from lakehouse.core.spec import PipelineSpec

FORMATS = ("json", "avro", "protobuf", "json_schema")


def decode_rates(spec: PipelineSpec, records: Sequence[workloads.RawRecord], repeats: int = 5,
                 formats: Sequence[str] = FORMATS) -> dict[str, dict[str, float]]:
    """Per format of `formats` (json: the records as they are; the others: `spec`'s JSON records written in
    that wire format), the median records/s of `repeats` decodes of `records`, the rows each kept, and the
    median's share of JSON's (`of_json`, when json is among them)."""
    if not records or repeats < 1:
        raise ValueError("decode_rates needs records and at least one repeat")
    with tempfile.TemporaryDirectory(prefix="bench-formats-") as scratch:
        traffic = {fmt: (spec, list(records)) if fmt == "json" else
                   workloads.as_format(spec, records, Path(scratch) / fmt, fmt) for fmt in formats}
        topic = spec.source.topic
        for fmt, (fmt_spec, sample) in traffic.items():  # imports, compiled rows, caches: not timed
            workloads.decode(fmt_spec, topic, sample[:1000])
        seconds: dict[str, list[float]] = {fmt: [] for fmt in formats}
        rows: dict[str, int] = {}
        for _ in range(repeats):
            for fmt, (fmt_spec, sample) in traffic.items():
                table, took = workloads.decode(fmt_spec, topic, sample)
                seconds[fmt].append(took)
                rows[fmt] = table.num_rows
    rates = {fmt: {"records_per_s": len(records) / statistics.median(took), "rows": rows[fmt]}
             for fmt, took in seconds.items()}
    if "json" in rates:
        for rate in rates.values():
            rate["of_json"] = rate["records_per_s"] / rates["json"]["records_per_s"]
    return rates


def main(argv: Sequence[str]) -> None:
    from lakehouse.core.spec import load_pipeline
    from lakehouse_dev import synthesis

    spec = load_pipeline(argv[0] if argv else "orders")
    count = int(argv[1]) if len(argv) > 1 else 20_000
    repeats = int(argv[2]) if len(argv) > 2 else 5
    records = [workloads.RawRecord(i % spec.source.partitions, i, 1_795_778_000_000, r.key, r.value, r.headers or [])
               for i, r in enumerate(synthesis.synthesize(spec, count, bad_ratio=0.0, seed=1))]
    for fmt, rate in decode_rates(spec, records, repeats).items():
        print(f"{fmt:12s} {rate['records_per_s']:>10,.0f} records/s  {rate.get('of_json', 1):>4.0%} of JSON  "
              f"{rate['rows']} rows")


if __name__ == "__main__":
    main(sys.argv[1:])
