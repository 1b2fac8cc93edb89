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
	@# make run's job, on the binaries the tests built: it checks every result it prints.
	@ROCED=target/debug/roced ROCECTL=target/debug/rocectl bash scripts/demo.sh >target/demo.log 2>&1 \
		|| { cat target/demo.log; echo "make test: the demo (scripts/demo.sh) failed"; exit 1; }
	@echo "make test: the demo (scripts/demo.sh) passed; its output is in target/demo.log"

bench: build
	@bash bench/forwarding.sh

clean:
	$(CARGO) clean
