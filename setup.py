"""The one compiled part of flinkish: the read path's record batch decoder
(flinkish_source/_record_batch.c, see flinkish_source/kafka_fetch.py). Optional: where it
cannot be compiled, the source reads every record through librdkafka instead. Everything else
is configured in pyproject.toml."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("flinkish_source._record_batch",
                             ["flinkish_source/_record_batch.c"], optional=True)])
