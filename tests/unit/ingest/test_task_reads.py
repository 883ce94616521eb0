"""A reader task reads all of its offset ranges with one consumer assignment, exactly once.

The unit half of these tests; what they hold the code to is told in tests/e2e/test_task_reads_e2e.py.
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
