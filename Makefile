# PAL — make help lists the targets.
SHELL := /bin/bash
GO ?= go
PKGS := ./...
BIN := bin/pal

.DEFAULT_GOAL := help

.PHONY: help
help: ## List the targets
	@awk 'BEGIN{FS=":.*## "} /^[a-zA-Z0-9_-]+:.*## /{printf "  %-10s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## Build bin/pal
	@echo "building $(BIN)... (the first build fetches and compiles the dependencies: a few minutes)"
	$(GO) build -o $(BIN) ./cmd/pal

.PHONY: run
run: build ## Run PAL locally: pal dev (NATS, Postgres, worker, projector, API; data under ./.pal)
	./$(BIN) dev

.PHONY: test
test: ## Run the whole test suite with the race detector (needs PostgreSQL binaries or DATABASE_URL, bubblewrap, python3 with pip, and Chromium, which the browser tests install when missing)
	$(GO) vet $(PKGS)
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$unformatted" ]; then echo "gofmt needed on:"; echo "$$unformatted"; exit 1; fi
	$(GO) run ./internal/cmd/importcheck
	$(GO) test -race -count=1 -timeout 20m $(PKGS)

# The protobuf generators, pinned; protoc itself comes from Debian's
# protobuf-compiler package (installed when missing), whose version the
# committed code names.
PROTOC_GEN_GO_VERSION := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.6.0
PROTO_FILES := proto/pal/v1/run.proto
PROTOC = PATH=$(CURDIR)/bin:$$PATH protoc -I proto \
	--go_opt=module=github.com/palrun/pal --go-grpc_opt=module=github.com/palrun/pal

.PHONY: protoc-gen
protoc-gen: # protoc and the pinned generators in bin/ (for proto and verify)
	@command -v protoc >/dev/null || { s=""; [ "$$(id -u)" -ne 0 ] && s=sudo; $$s apt-get install -y -qq protobuf-compiler >/dev/null; }
	GOBIN=$(CURDIR)/bin $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
	GOBIN=$(CURDIR)/bin $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)

.PHONY: proto
proto: protoc-gen ## Regenerate the gRPC code under proto/pal/v1 from run.proto (committed)
	$(PROTOC) --go_out=. --go-grpc_out=. $(PROTO_FILES)

# verify generates into a scratch directory and compares, so it changes
# nothing in the tree. deploy/nats/roles.conf, generated too, is compared
# by its own test (TestDeployRoles, in make test). It also checks that
# every §N cited anywhere is a heading of docs/architecture.md, which code
# comments cite by section.
.PHONY: verify
verify: protoc-gen ## Check that make proto and go mod tidy leave no diff, and that every §N cited is a heading of docs/architecture.md
	@bad=$$(git grep -InoE '§([0-9]+(\.[0-9]+)*|[a-z][a-z_-]*)' | \
	  awk -F: 'NR == FNR { head[$$0]; next } !($$3 in head) { print $$1 ":" $$2 ": " $$3 " is no heading of docs/architecture.md" }' \
	    <(grep -oE '^#+ §[0-9]+(\.[0-9]+)*' docs/architecture.md | cut -d' ' -f2) -); \
	  test -z "$$bad" || { echo "$$bad"; exit 1; }
	@$(GO) mod tidy -diff || { echo "verify: go.mod/go.sum are not tidy: run go mod tidy and commit the result"; exit 1; }
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	  $(PROTOC) --go_out=$$tmp --go-grpc_out=$$tmp $(PROTO_FILES) && \
	  diff -ru -x '*.proto' proto "$$tmp/proto" || { echo "verify: the code under proto/ is not what make proto generates: run make proto and commit the result"; exit 1; }
	@echo "verify: go.mod, go.sum and proto/ are as generated"

.PHONY: imports
imports: ## Check the import rule: no import runs upward; api and runs do not depend on workers
	$(GO) run ./internal/cmd/importcheck

# The stock nats CLI the README's replay commands are checked with.
NATSCLI_VERSION := v0.5.0

.PHONY: e2e
e2e: build ## Replay a live run with the stock nats CLI (natscli v0.5.0, built from the module proxy) as the README shows
	GOBIN=$(CURDIR)/bin $(GO) install github.com/nats-io/natscli/nats@$(NATSCLI_VERSION)
	PAL=$(CURDIR)/$(BIN) NATS=$(CURDIR)/bin/nats bash e2e/replay.sh

# Each fuzz target runs for FUZZTIME; the seed corpora (testdata/fuzz/)
# also run with every go test. The targets are the Fuzz functions of the
# test files, found with git grep (go test -list would build each test
# binary once more just to list them), so a new one cannot be left out.
FUZZTIME ?= 10s
FUZZPKGS := $(addprefix ./,$(sort $(dir $(shell git grep -l '^func Fuzz' -- '*_test.go'))))

# Go 1.26's fuzz coordinator can report "context deadline exceeded" as the
# target's failure when -fuzztime ends with a worker mid-input
# (go.dev/issue/75804, fixed in Go 1.27). A failure is therefore one that
# wrote a failing input to the package's testdata/fuzz/TARGET; that one
# message with no input written is said and passed over.
.PHONY: fuzz
fuzz: ## Run every fuzz target in the tree briefly (FUZZTIME=10s each) beyond its seed corpus
	@test -n "$(FUZZPKGS)" || { echo "fuzz: no fuzz targets found (git grep '^func Fuzz')"; exit 1; }
	@set -e -o pipefail; log=$$(mktemp); trap 'rm -f "$$log"' EXIT; \
	for pkg in $(FUZZPKGS); do \
	  targets=$$(git grep -h '^func Fuzz' -- ":(glob)$${pkg#./}*_test.go" | sed -E 's/^func (Fuzz[A-Za-z0-9_]*).*/\1/'); \
	  for target in $$targets; do \
	    echo "fuzz $$pkg $$target"; \
	    inputs=$$( (ls "$$pkg/testdata/fuzz/$$target" 2>/dev/null || true) | wc -l); \
	    status=0; $(GO) test -run '^$$' -fuzz "^$$target\$$" -fuzztime $(FUZZTIME) $(FUZZFLAGS) $$pkg 2>&1 | tee "$$log" || status=$$?; \
	    if [ $$status -ne 0 ]; then \
	      if [ "$$( (ls "$$pkg/testdata/fuzz/$$target" 2>/dev/null || true) | wc -l)" = "$$inputs" ] && grep -qx '    context deadline exceeded' "$$log"; then \
	        echo "fuzz: $$target: \"context deadline exceeded\" at -fuzztime's end and no failing input written: Go's fuzz coordinator (go.dev/issue/75804), not a failure of $$target"; \
	      else exit $$status; fi; \
	    fi; \
	  done; \
	done

.PHONY: bench
bench: build ## Benchmarks: the README's Performance tables (workers, long runs, recovery with 3s and 1s leases, projections, REST load, 10,000 SSE watchers, pal bench, strict runs kept in flight, memory after a burst, pal bench --economics)
	$(GO) test -run '^$$' -bench 'StepOverhead|ConcurrentRuns|RecoveryAfterKill|WorkflowFixedCost|LongRun' -benchtime 1x ./workers/
	$(GO) test -run '^$$' -bench LoopIteration -benchtime 100x ./engine/
	$(GO) test -run '^$$' -bench ResumeFold ./engine/
	$(GO) test -run '^$$' -bench AppendRoundTrip -benchtime 3000x ./eventstore/
	PAL_LEASE_TTL=1s $(GO) test -run '^$$' -bench RecoveryAfterKill -benchtime 1x ./workers/
	$(GO) test -run '^$$' -bench . -benchtime 1x ./projections/
	$(GO) test -run '^$$' -bench BenchmarkLoad -benchtime 1x ./api/
	PAL_TEST_SSE_WATCHERS=10000 $(GO) test -count=1 -run '^TestSSEWatchers$$' -v ./api/
	./$(BIN) bench
	./$(BIN) bench --durability strict --runs 64 --steps-per-run 10 --duration 10s
	./$(BIN) bench --durability process --burst 500 --runs 64 --steps-per-run 10
	./$(BIN) bench --economics

.PHONY: lint
lint: ## go vet, gofmt and staticcheck
	$(GO) vet $(PKGS)
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || (gofmt -l $$(git ls-files '*.go'); exit 1)
	$(GO) run honnef.co/go/tools/cmd/staticcheck@v0.6.1 $(PKGS)

.PHONY: clean
clean: ## Remove build output and the dev data directory
	rm -rf bin .pal
