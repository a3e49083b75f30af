"""The operator verbs: restart, adopt, replay, resets, reads and insight. Uses the rules, the ledger and the Kafka adapter; called by the faces."""
