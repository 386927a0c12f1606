package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestShimDependencies keeps what makes a Go binary slow to start out of the plugin the runtime
// executes for every pod: the etcd client and gRPC (5.4 ms to start instead of 1.8 ms), net/http
// (0.4 ms), TLS and Prometheus belong to the daemon, block-ipamd. The shim itself (cni/shim), what
// runs on every call, links no CNI library (its decodes, regexp at init: the daemon checks the call
// with it), no net (its poller starts threads and an epoll instance), no slog and no package cni.
func TestShimDependencies(t *testing.T) {
	for _, c := range []struct {
		pkg       string
		forbidden []string
	}{
		{".", []string{"go.etcd.io/", "google.golang.org/grpc", "google.golang.org/protobuf", "net/http", "crypto/tls", "github.com/prometheus/"}},
		{"../../cni/shim", []string{"github.com/containernetworking/", "github.com/vpp-route-agent/vpp-route-agent/cni", "net", "log/slog", "regexp"}},
	} {
		out, err := exec.Command("go", "list", "-deps", c.pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", c.pkg, err, out)
		}
		for _, pkg := range strings.Fields(string(out)) {
			if strings.HasSuffix(pkg, "/cni/shim") {
				continue
			}
			for _, f := range c.forbidden {
				if pkg == f || strings.HasPrefix(pkg, f+"/") || (strings.HasSuffix(f, "/") && strings.HasPrefix(pkg, f)) {
					t.Errorf("%s links %s", c.pkg, pkg)
				}
			}
		}
	}
}
