"""`make bench`: the pipeline measured against the physical ceilings of this machine.

One unattended run (`python -m bench.run`) starts its own embedded stack in a scratch
home, loads the same synthetic orders into Kafka, and measures on that data:

- the raw ceilings: confluent-kafka consuming the topic with `assign`, pyarrow writing
  the decoded records as Parquet (and, to explain the gap, the pipeline's own decoder
  on one core);
- the pipeline's sustained `--once` ingest rate with 3 and 12 partitions, its stage
  breakdown from the `batch` events, and the memory of its process tree;
- freshness (produce -> visible in the table) at fixed produce rates and triggers;
- a hand-written confluent-kafka + pyiceberg baseline;
- what maintenance does to file counts and scan time.

It writes reports/bench/report.md, reports/bench/*.png and reports/bench/results.json.

Modules: `env` (the scratch stack and its CLI), `stats` (pure arithmetic: medians,
censored percentiles, freshness from snapshots, targets), `workloads` (the
measurements), `report` (Markdown and plots), `run` (the orchestration).
"""
