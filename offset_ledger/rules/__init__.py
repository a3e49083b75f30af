"""The rules: pure logic, no I/O. Imports nothing outside ``offset_ledger.rules`` but the exception tree (``offset_ledger.errors``); no database, Kafka, Spark or web library."""
