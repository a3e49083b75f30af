.PHONY: test demo stack-up stack-down
test:
	./scripts/test
demo:
	./scripts/demo
stack-up:
	.venv/bin/python -m offset_ledger.devstack up
stack-down:
	.venv/bin/python -m offset_ledger.devstack down
