"""``flinkish demo`` and what it runs on: an embedded Kafka-protocol broker, an embedded
PostgreSQL and a quiet local SparkSession (the tests and benchmarks use them too). Needs the
``flinkish[demo]`` extra."""
