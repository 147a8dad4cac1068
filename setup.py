"""The one compiled part of flinkish: the read path's record batch decoder
(flinkish_source/kafka/_record_batch.c, see flinkish_source/kafka/protocol.py). Optional: where
it cannot be compiled, the native fetch path is off and librdkafka reads every record.
Everything else is configured in pyproject.toml."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("flinkish_source.kafka._record_batch",
                             ["flinkish_source/kafka/_record_batch.c"], optional=True)])
