# The two commands a newcomer needs, and a few more.
.PHONY: dev test lint bench bench-cost sam-build

# Run Hookwise locally: API, worker, scheduler and dead-letter handler on an embedded store.
# It builds what `make test` builds (scripts/build.sh), so after it nothing compiles.
dev:
	scripts/dev.sh $(ARGS)

# The whole test suite, installing and starting whatever it needs (CI runs this).
test:
	scripts/test.sh

# The four Lambda functions for arm64, as `sam deploy` ships them (release, LTO: slow).
sam-build:
	scripts/sam-build.sh

lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets --locked -- -D warnings

# Benchmarks (not tests): one table of figures and ratios measured side by side in one run.
bench:
	scripts/bench.sh

# The cost meter: AWS requests and capacity units per event, on DynamoDB Local and moto.
bench-cost:
	scripts/bench-cost.sh
