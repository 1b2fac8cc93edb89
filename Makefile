# ferroce: `make run` runs the main job on the embedded default, `make test` runs the tests.
# Both install what a fresh Debian 12 lacks first (scripts/setup.sh, as root).
CARGO ?= cargo
export CARGO_TERM_COLOR ?= never

.PHONY: setup build run test lint bench clean

setup:
	@bash scripts/setup.sh

build: setup
	$(CARGO) build --release --workspace

run: build
	@bash scripts/demo.sh

lint: setup
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

test: lint
	$(CARGO) test --workspace -- --test-threads=2

bench: build
	@bash bench/forwarding.sh

clean:
	$(CARGO) clean
