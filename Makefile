# PAL — make help lists the targets.
SHELL := /bin/bash
GO ?= go
PKGS := ./...
BIN := bin/pal

.DEFAULT_GOAL := help

.PHONY: help
help: ## List the targets
	@awk 'BEGIN{FS=":.*## "} /^[a-zA-Z_-]+:.*## /{printf "  %-10s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## Build bin/pal
	$(GO) build -o $(BIN) ./cmd/pal

.PHONY: run
run: build ## Run PAL locally: pal dev (NATS, Postgres, worker, projector, API; data under ./.pal)
	./$(BIN) dev

.PHONY: test
test: ## Run the whole test suite with the race detector (needs PostgreSQL binaries or DATABASE_URL)
	$(GO) vet $(PKGS)
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$unformatted" ]; then echo "gofmt needed on:"; echo "$$unformatted"; exit 1; fi
	$(GO) test -race -count=1 -timeout 20m $(PKGS)

.PHONY: bench
bench: build ## Benchmarks: go test -bench and the pal bench table
	$(GO) test -run '^$$' -bench . -benchtime 1x ./workers/
	./$(BIN) bench

.PHONY: lint
lint: ## go vet, gofmt and staticcheck
	$(GO) vet $(PKGS)
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || (gofmt -l $$(git ls-files '*.go'); exit 1)
	$(GO) run honnef.co/go/tools/cmd/staticcheck@2025.1.1 $(PKGS)

.PHONY: clean
clean: ## Remove build output and the dev data directory
	rm -rf bin .pal
