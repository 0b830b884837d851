# dlock: make test runs everything CI runs; make demo runs the marketplace
# experiment (about 20 s) on a private redis-server; make bench compares dlock
# with peers; make chaos explores interleavings longer than make test does;
# make mutate checks that the tests notice each safety mechanism removed.
GO ?= go
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: test vet bench demo chaos mutate redis-server cc interop-deps

# Tests start real redis-server processes; install Debian's when missing.
redis-server:
	@command -v redis-server >/dev/null 2>&1 || { \
		echo "installing redis-server from Debian's packages"; \
		$(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends redis-server >/dev/null; }
	@redis-server --version

# The server clock-jump tests (faults 9 and 10) build an LD_PRELOAD shim
# (internal/redistest/clockshift); install a C compiler and libc headers
# when they cannot compile it.
cc:
	@printf '#include <sys/syscall.h>\n#include <sys/mman.h>\n' | $${CC:-cc} -fsyntax-only -x c - 2>/dev/null || { \
		echo "installing gcc and libc6-dev from Debian's packages"; \
		$(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends gcc libc6-dev >/dev/null; }

# The interop tests (interop/, a module of its own) run dlock's StringMutex
# against redis-py (Debian's python3-redis, for /usr/bin/python3) and
# node-redlock (interop/node, from its package-lock.json); install them when
# missing. A test whose library is missing says so and skips.
interop-deps:
	@/usr/bin/python3 -c 'import redis.lock' 2>/dev/null || { \
		echo "installing python3-redis from Debian's packages"; \
		$(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends python3-redis >/dev/null; }
	@command -v npm >/dev/null 2>&1 || { \
		echo "installing nodejs and npm from Debian's packages"; \
		$(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null; }
	@test -d interop/node/node_modules || { echo "npm ci in interop/node"; cd interop/node && npm ci --no-audit --no-fund --loglevel=error; }

vet:
	$(GO) vet ./...
	cd interop && $(GO) vet ./...
	@test -z "$$(gofmt -l .)" || { gofmt -l .; echo "gofmt needed"; exit 1; }

# The root package runs a second time over the rueidis driver
# (DLOCK_DRIVER=rueidis, see driver_test.go), without -race to bound the
# time (the first pass races the engine, which both drivers share), quorum
# mode over rueidisdlock.NewQuorum included. The long randomized tests
# share their seeds and rounds out between the two passes (passShare in
# driver_test.go): DLOCK_SPLIT, one random number for both, draws which
# primitives' interleavings each pass runs, so that each runs once, over
# one driver or the other, and 4 of the 8 rounds of
# TestReview3QuorumCloseRacesEverything go to each pass.
# The quorum tests take about 2 minutes of that pass, mostly waiting
# (about 25 s of CPU), on a 2-core VM. The two passes run at once: the
# root package's tests mostly wait on TTLs, pauses and failovers (its
# -race pass keeps under half of one core busy), and every test starts
# servers of its own on ports no other process holds.
# The -race passes run one package at a time (-p 1), so that no more than
# two test processes share the cores: the fault tests' timing margins
# (a hand-over confirmed within its TTL under WithReplicaAck, an acquire
# through a held proxy on Sentinel) were seen to fail with three. The
# root package and cmd/dlock (about 11 and 1.5 minutes under -race on a
# 2-core VM) run in the foreground; the background job runs the rueidis
# pass (about 10.5 minutes), then the interop module (interop/: a few
# seconds, plus its build; without -race: it tests what goes over the
# wire, and the engine it drives is raced in the first pass), then the
# other packages under -race (about 2.5 minutes), so that the two sides
# end at about the same time. The rueidis pass also runs rueidisdlock's
# own tests without -race, for its allocation counts. The background
# job's output follows the foreground's. In the root package, -parallel 4
# is for the few tests whose cases each wait out a TTL on a server of their
# own (t.Parallel): four at once, though the machine has two cores;
# cmd/dlock's parallel tests keep the default (two at once).
SPLIT := $(shell od -An -N4 -tu4 /dev/urandom | tr -d " ")
RUEIDIS_PASS = DLOCK_SPLIT=$(SPLIT) DLOCK_DRIVER=rueidis $(GO) test -count=1 -parallel 4 -timeout 20m . ./rueidisdlock
INTEROP_PASS = cd interop && $(GO) test -count=1 -timeout 2m ./...
RACE_BACK = $$($(GO) list ./... | grep -v -x -e github.com/dlock-go/dlock -e github.com/dlock-go/dlock/cmd/dlock)
test: redis-server cc interop-deps vet
	@log=$$(mktemp); \
	{ $(RUEIDIS_PASS) >$$log 2>&1; rc=$$?; \
	  echo '$(INTEROP_PASS)' >>$$log; ($(INTEROP_PASS)) >>$$log 2>&1 || rc=1; \
	  echo '$(GO) test -race -p 1 -count=1 -timeout 15m (the other packages)' >>$$log; \
	  $(GO) test -race -p 1 -count=1 -timeout 15m $(RACE_BACK) >>$$log 2>&1 || rc=1; \
	  echo $$rc >$$log.rc; } & \
	echo 'DLOCK_SPLIT=$(SPLIT) $(GO) test -race -count=1 -parallel 4 -timeout 25m .; then $(GO) test -race -count=1 -timeout 10m ./cmd/dlock  (and, at the same time: $(RUEIDIS_PASS); then $(INTEROP_PASS); then the other packages under -race)'; \
	DLOCK_SPLIT=$(SPLIT) $(GO) test -race -count=1 -parallel 4 -timeout 25m .; rc=$$?; \
	$(GO) test -race -count=1 -timeout 10m ./cmd/dlock || rc=1; \
	wait; echo '$(RUEIDIS_PASS)'; cat $$log; rc2=$$(cat $$log.rc); rm -f $$log $$log.rc; \
	test $$rc = 0 && test $$rc2 = 0

# chaos explores interleavings for longer than make test does: DLOCK_CHAOS
# per run (default 10s), DLOCK_CHAOS_ROUNDS seeds per primitive (default 10);
# quorum mode, which has one primitive, DLOCK_QUORUM_ROUNDS seeds (default
# 30); a failure prints the command that replays its seed.
chaos: redis-server
	DLOCK_CHAOS=$${DLOCK_CHAOS:-10s} DLOCK_CHAOS_ROUNDS=$${DLOCK_CHAOS_ROUNDS:-10} \
		$(GO) test -race -count=1 -timeout 90m -run '^TestInterleavings(ReplicaAck|LateGrants|Cluster)?$$' .
	DLOCK_CHAOS=$${DLOCK_CHAOS:-10s} \
		$(GO) test -race -count=$${DLOCK_CHAOS_ROUNDS:-10} -timeout 60m -run '^TestReviewQuorumInterleavings$$' .
	DLOCK_CHAOS=$${DLOCK_CHAOS:-10s} DLOCK_CHAOS_ROUNDS=$${DLOCK_QUORUM_ROUNDS:-30} \
		$(GO) test -race -count=1 -timeout 60m -run '^TestInterleavingsQuorum$$' .
	DLOCK_FAILOVER_ROUNDS=$${DLOCK_FAILOVER_ROUNDS:-20} \
		$(GO) test -race -count=1 -timeout 30m -run '^(TestFault5(Cluster)?WithReplicaAck|TestFault14ClusterFailoverWithReplicaAck)$$' .

demo: redis-server
	$(GO) run ./cmd/dlock market

# Each curated mutant (internal/mutate/mutants.txt) breaks one safety
# mechanism with a small edit; the tests docs/SAFETY.md cites for it must
# fail. Not part of make test: it takes minutes (docs/SAFETY.md).
mutate: redis-server cc
	$(GO) run ./internal/mutate $(MUTATE_FLAGS)

bench: redis-server
	cd bench && $(GO) run . -scenario all
