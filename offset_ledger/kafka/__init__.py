"""The Kafka adapter: the one place the cluster is read (offsets, topic ids, timestamps) and written (the consumer-group mirror), with its client settings."""
