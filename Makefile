.PHONY: test demo demo-down stack-up stack-down
test:
	./scripts/test
demo:
	./scripts/demo
demo-down:
	.venv/bin/python -m offset_ledger.cli.demo --down
stack-up:
	.venv/bin/python -m offset_ledger.devstack up
stack-down:
	.venv/bin/python -m offset_ledger.devstack down
