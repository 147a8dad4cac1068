"""What every Kafka client of flinkish shares, the source's consumers and the sink's producers:
the Java client's ``kafka.*`` settings translated into librdkafka's (JAAS, key stores, MSK IAM).
"""
