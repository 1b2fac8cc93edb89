# ferroce: `make run` runs the main job on the embedded default, `make test` runs the tests.
# Both install what a fresh Debian 12 lacks first (scripts/setup.sh, as root).
CARGO ?= cargo
export CARGO_TERM_COLOR ?= never

.PHONY: setup build run test lint bench report interop compose compose-down clean

setup:
	@bash scripts/setup.sh

build: setup
	$(CARGO) build --release --workspace

run: build
	@bash scripts/demo.sh

lint: setup
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	bash scripts/layers.sh

test: lint
	$(CARGO) test --workspace -- --test-threads=2
	@# make run's job, on the binaries the tests built: it checks every result it prints.
	@ROCED=target/debug/roced ROCECTL=target/debug/rocectl bash scripts/demo.sh >target/demo.log 2>&1 \
		|| { cat target/demo.log; echo "make test: the demo (scripts/demo.sh) failed"; exit 1; }
	@echo "make test: the demo (scripts/demo.sh) passed; its output is in target/demo.log"
	@# ferroce against Linux Soft-RoCE in a VM (unmodified perftest), on the test build.
	@bash tests/interop/setup.sh >target/interop-setup.log 2>&1 \
		|| { cat target/interop-setup.log; echo "make test: tests/interop/setup.sh failed"; exit 1; }
	@ROCED=target/debug/roced ROCECTL=target/debug/rocectl python3 tests/interop/run.py >target/interop.log 2>&1; \
		rc=$$?; sed -n '1,/ passed, /p' target/interop.log; \
		if [ $$rc -ne 0 ]; then cat target/interop.log; echo "make test: Soft-RoCE interop failed"; exit 1; fi
	@echo "make test: Soft-RoCE interop passed; the tools' output is in target/interop.log"
	@# The images, docker/compose.yaml and the dashboard (installs and starts Docker if needed).
	@python3 tests/docker/run.py >target/docker.log 2>&1; \
		rc=$$?; sed -n '/^== step timings/,$$p' target/docker.log; \
		if [ $$rc -ne 0 ]; then cat target/docker.log; echo "make test: the container test failed"; exit 1; fi
	@echo "make test: the container test passed; its output is in target/docker.log"

# ferroce against Linux Soft-RoCE peers (QEMU VMs) with unmodified perftest, on the release build.
interop: build
	@bash tests/interop/setup.sh
	python3 tests/interop/run.py

bench: build
	@bash bench/forwarding.sh

# The perftest report: ferroce (rocectl perf) vs dpdk-testpmd and the kernel, in one run, with
# plots; progress on stderr. About a minute.
report: build
	@mkdir -p bench/results
	target/release/perf_report --report bench/results/$$(date +%Y-%m-%d).md

# Two roced nodes, Prometheus and the demo job in containers (docker/compose.yaml), built
# without a registry: Prometheus on http://127.0.0.1:19090, the APIs on 127.0.0.1:17470/17471.
COMPOSE = FERROCE_BASE=ferroce/debian:bookworm-slim FERROCE_RUST=ferroce/rust:bookworm \
	docker-compose -f docker/compose.yaml -p ferroce
compose: setup
	@bash scripts/docker-engine.sh start
	@bash docker/base.sh
	$(COMPOSE) up -d --build
	@echo "the demo job's output: $(COMPOSE) logs demo; stop with make compose-down"

compose-down:
	$(COMPOSE) down -v

clean:
	$(CARGO) clean
