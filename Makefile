.PHONY: test stack-up stack-down
test:
	./scripts/test
stack-up:
	.venv/bin/python -m offset_ledger.devstack up
stack-down:
	.venv/bin/python -m offset_ledger.devstack down
