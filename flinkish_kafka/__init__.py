"""What every Kafka client of flinkish shares, the source's consumers and the sink's producers:
the ``kafka.*`` options a Spark user wrote for ``format("kafka")`` translated into librdkafka's
settings (JAAS, JKS/PKCS#12/PEM stores, AWS MSK IAM).

It sits between :mod:`flinkish_core` and the two sides, so neither the source nor the sink
imports the other to reach a secured cluster.
"""
