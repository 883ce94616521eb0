"""A reader task reads all of its offset ranges with one consumer assignment, exactly once.

A task of the batch (lakehouse.ingest.plan.task_groups) holds many small ranges when the topic has
many quiet partitions, and several pieces of one partition when a large one is split. The task
assigns every partition at once and routes each record to its range; these tests hold it to what
reading the ranges one after another guaranteed, on the embedded Apache Kafka broker:

- every record of every range comes out once (a table row or a dead letter), no record outside
  them, a partition's rows in offset order, batches of at most `batch_rows` rows, whatever the
  layout of the ranges (pieces of one partition contiguous or not, in any order, empty ones);
- on a transactional topic, ranges that end on transaction markers or aborted records complete
  without waiting for records that never come;
- a range whose records were deleted (retention) fails the task with OffsetGapError naming it,
  and the same ranges planned again from the log's new start read every record once;
- a partition whose planned records do not come stalls the task with BrokerStalledError naming
  that partition and offset, after every record of the other partitions came out;
- the fault points fire where they did: before any read, and half way through a range;
- and reading 300 tiny ranges together costs a fraction of reading them one after another.

The unit half; the end-to-end half is tests/e2e/test_task_reads_e2e.py.
"""

from __future__ import annotations

import pytest

from lakehouse.core.offsets import OffsetRange
from lakehouse.core.spec import load_pipeline
from lakehouse.ingest.reader import BatchBuilder, read_ranges
from lakehouse.ingest.validator import RecordValidator

SPEC = load_pipeline("orders")
INGESTED_AT = 1_763_719_200_000_000


def test_ranges_that_overlap_or_span_topics_are_refused_before_anything_is_read():
    builder = BatchBuilder(SPEC, RecordValidator(SPEC), INGESTED_AT)
    with pytest.raises(ValueError, match=r"ranges t\[1\]@\[0,10\) and t\[1\]@\[9,20\) overlap"):
        next(read_ranges(None, [OffsetRange("t", 1, 9, 20), OffsetRange("t", 0, 0, 5), OffsetRange("t", 1, 0, 10)],
                         builder, 10, 1.0))
    with pytest.raises(ValueError, match=r"ranges of one topic, got ranges of \['t', 'u'\]"):
        next(read_ranges(None, [OffsetRange("t", 0, 0, 5), OffsetRange("u", 0, 0, 5)], builder, 10, 1.0))
    assert list(read_ranges(None, [OffsetRange("t", 0, 4, 4), OffsetRange("u", 1, 0, 0)], builder, 10, 1.0)) == []
