# vpp-route-agent: build, test, benchmark and run the local lab.
GO        ?= go
BIN       ?= bin
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
PKG       := github.com/vpp-route-agent/vpp-route-agent
LDFLAGS   := -s -w -X $(PKG)/internal/buildinfo.Version=$(VERSION)
GOFLAGS_B := -trimpath -ldflags '$(LDFLAGS)'
BINARIES  := $(patsubst cmd/%/main.go,%,$(wildcard cmd/*/main.go))

.PHONY: all build test race bench bench-scale etcd-server lab lint fuzz clean

all: build

build:
	@mkdir -p $(BIN)
	$(if $(BINARIES),CGO_ENABLED=0 $(GO) build $(GOFLAGS_B) -o $(BIN)/ $(addprefix ./cmd/,$(BINARIES)),@echo "no binaries yet")

# The full suite: unit, conformance, embedded-etcd and multi-process tests, with the race detector.
test: lint
	$(GO) test -race -count=1 -timeout 12m ./...

# The same tests against real VPP processes, one per node, instead of the simulator (the helpers in
# internal/vpptest read VPP_TEST_BACKEND): the vppapi tests, the process-level e2e and the lab scenario.
# Tests that need the simulator's faults are skipped. VPP is installed the way users install it: fd.io's
# packages (vpp and vppctl on PATH), or an unpacked VPP package directory in VPP_PKG (bin/vpp, bin/vppctl).
# The data-plane tests (test/dataplane: pod-to-pod pings between VPPs wired with memif) need a VPP with the
# memif and ping plugins (fd.io's vpp-plugin-core has both) installed under VPP_LAB_PKG (/usr for fd.io's
# packages); without it they are skipped.
.PHONY: test-vpp
test-vpp:
	@if [ -z "$$VPP_PKG" ] && ! command -v vpp >/dev/null 2>&1; then \
		echo "make test-vpp: no VPP. Install fd.io's packages (https://fd.io/docs/vpp/master/gettingstarted/installing/:" >&2; \
		echo "  vpp, vpp-plugin-core; vpp and vppctl on PATH), or point VPP_PKG at an unpacked VPP package directory" >&2; \
		echo "  (bin/vpp, bin/vppctl; e.g. a build of VPP 26.06 unpacked into /opt: make test-vpp VPP_PKG=/opt/vpp-v26.06-minimal)." >&2; exit 2; \
	fi
	@if [ -z "$$VPP_LAB_PKG" ]; then \
		echo "make test-vpp: no VPP_LAB_PKG, the data-plane tests are skipped; for them point VPP_LAB_PKG at a VPP" >&2; \
		echo "  with the memif and ping plugins: VPP_LAB_PKG=/usr with fd.io's vpp-plugin-core installed, or an unpacked build (/opt/vpp-v26.06-lab)." >&2; \
	fi
	VPP_TEST_BACKEND=real VPP_PKG=$(VPP_PKG) VPP_LAB_PKG=$(VPP_LAB_PKG) $(GO) test -count=1 -timeout 10m ./vppapi ./test/e2e ./cmd/vpplab ./internal/vpptopo ./test/dataplane

# Interoperability with Project Calico's own calico-ipam and calicoctl v3.31.0 on one etcd (needs root:
# calico-ipam runs in a private mount namespace). Calico is built once into CALICO_DIR (2-6 min cold).
CALICO_SRC ?= test/calicointerop/build-calico
CALICO_DIR ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/vpp-route-agent/calico-v3.31.0
.PHONY: test-calico
test-calico:
	@test -x $(CALICO_SRC)/build-calico.sh || { echo "make test-calico: $(CALICO_SRC)/build-calico.sh not found (set CALICO_SRC)" >&2; exit 2; }
	$(CALICO_SRC)/build-calico.sh $(CALICO_DIR)
	CALICO_BIN_DIR=$(CALICO_DIR) $(GO) test -race -count=1 -timeout 8m ./test/calicointerop/

# Every benchmark but the scale harness (bench-scale: minutes, and it wants Debian's etcd-server).
bench:
	$(GO) test -run '^$$' -bench . -benchtime 1x -count 1 -timeout 20m $$($(GO) list ./... | grep -v /test/scale)

# The fan-out harness of issue 13 (test/scale): SCALE_WATCHERS watchers of the real blockwatch code and
# 2 real agents against one etcd, directly and through etcd's gRPC proxy (v3.6 in-process and Debian's
# 3.4 `etcd grpc-proxy`; SCALE_PROXY=inprocess or debian for one), per pod ADD: etcd's bytes and CPU,
# each watcher's CPU. About 15 minutes with the defaults.
SCALE_WATCHERS ?= 1,10,100,500
bench-scale: etcd-server
	SCALE_WATCHERS=$(SCALE_WATCHERS) $(GO) test -run '^$$' -bench Fanout -benchtime 1x -count 1 -timeout 40m ./test/scale/

# Debian's prometheus package: promtool for the alert rules' unit tests (deploy/monitoring; skipped
# without it), installed without starting its service.
.PHONY: promtool
promtool:
	@deploy/monitoring/install-prometheus.sh

# Debian's etcd-server package (etcd and its gRPC proxy), installed without starting its service.
etcd-server:
	@test/scale/install-etcd-server.sh

# LAB_VPP=DIR runs the lab's nodes on real VPPs from DIR (--vpp): with the lab build (/opt/vpp-v26.06-lab,
# memif and ping plugins) they are wired through a router VPP and every step pings pod to pod.
lab:
	@if [ -f cmd/vpplab/main.go ]; then \
		$(MAKE) --no-print-directory build && $(BIN)/vpplab $(if $(LAB_VPP),--vpp $(LAB_VPP)) $(LAB_ARGS); \
	else \
		echo "make lab: the local lab (cmd/vpplab) is not built yet; see README.md and issue 6." >&2; exit 2; \
	fi

# The README's screenshot (docs/lab-prometheus-alerts.png): the lab's Prometheus alerts page with a pool
# exhausted; needs Debian's prometheus (make promtool) and chromium (apt-get install -y chromium).
.PHONY: lab-screenshot
lab-screenshot: build
	BIN=$(BIN) deploy/monitoring/lab-screenshot.sh docs/lab-prometheus-alerts.png

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null; git ls-files -o --exclude-standard '*.go' 2>/dev/null)); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

# Short coverage-guided fuzzing of every parser (FUZZTIME per target).
FUZZTIME ?= 20s
fuzz:
	$(GO) test ./calico -run '^$$' -fuzz FuzzParseKey -fuzztime $(FUZZTIME)
	$(GO) test ./calico -run '^$$' -fuzz FuzzDecodeBlock -fuzztime $(FUZZTIME)
	$(GO) test ./calico -run '^$$' -fuzz FuzzDecodeRouting -fuzztime $(FUZZTIME)
	$(GO) test ./test/vppsim -run '^$$' -fuzz FuzzServerFrames -fuzztime $(FUZZTIME)
	$(GO) test ./cni/shim -run '^$$' -fuzz FuzzParseFrame -fuzztime $(FUZZTIME)

clean:
	rm -rf $(BIN)
