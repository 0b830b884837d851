# dlock: make test runs everything CI runs; make demo runs the marketplace
# experiment on a private redis-server; make bench compares dlock with peers.
GO ?= go
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: test vet bench demo redis-server

# Tests start real redis-server processes; install Debian's when missing.
redis-server:
	@command -v redis-server >/dev/null 2>&1 || { \
		echo "installing redis-server from Debian's packages"; \
		$(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends redis-server >/dev/null; }
	@redis-server --version

vet:
	$(GO) vet ./...
	@test -z "$$(gofmt -l .)" || { gofmt -l .; echo "gofmt needed"; exit 1; }

test: redis-server vet
	$(GO) test -race -count=1 -timeout 12m ./...

demo: redis-server
	$(GO) run ./cmd/dlock market --duration 3s

bench: redis-server
	cd bench && $(GO) run . -scenario all
