package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestShimDependencies keeps what makes a Go binary slow to start out of the plugin the runtime
// executes for every pod: the etcd client and gRPC (5.4 ms to start instead of 1.8 ms), net/http
// (0.4 ms), TLS and Prometheus belong to the daemon, block-ipamd.
func TestShimDependencies(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	forbidden := []string{"go.etcd.io/", "google.golang.org/grpc", "google.golang.org/protobuf", "net/http", "crypto/tls", "github.com/prometheus/"}
	for _, pkg := range strings.Fields(string(out)) {
		for _, f := range forbidden {
			if pkg == f || strings.HasPrefix(pkg, f) {
				t.Errorf("cmd/block-ipam links %s", pkg)
			}
		}
	}
}
