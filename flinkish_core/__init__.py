"""The neutral core of flinkish: Flink's watermark vocabulary, the ``StatusWatermarkValve``, the
valve over Spark epochs and the late-data rule.

Pure Python (and Arrow): no Spark, Kafka or database client, so the source, the sink, the
checkpointing layer and the public helpers all build on the one copy of each rule.
"""
