# lambda-idempotency: `make test` is the whole check (CI runs it via .ci/run).
SHELL := /bin/bash
CARGO ?= cargo

.PHONY: test lint fmt unit integration clean-tools

## Everything CI checks: formatting, lints, unit, doc and integration tests
## against a DynamoDB Local this target installs, starts and stops.
test: lint
	scripts/with-dynamodb-local $(CARGO) test --all-targets
	$(CARGO) test --doc

## cargo fmt --check and clippy with warnings as errors.
lint:
	$(CARGO) fmt --all --check
	$(CARGO) clippy --all-targets -- -D warnings

## Unit tests only (no DynamoDB needed).
unit:
	$(CARGO) test --lib

fmt:
	$(CARGO) fmt --all

clean-tools:
	rm -rf .tools
