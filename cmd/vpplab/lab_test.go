package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/internal/vppproc"
	"github.com/vpp-route-agent/vpp-route-agent/internal/vpptest"
)

// TestLabScenarioPasses runs the lab as `make lab` does, smaller: two nodes, the real binaries.
func TestLabScenarioPasses(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries and runs the lab")
	}
	bin := t.TempDir()
	args := []string{"build", "-o", bin + "/"}
	if raceEnabled {
		args = append(args, "-race")
	}
	args = append(args, "../vpp-route-agent", "../block-ipam")
	if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	args = []string{"--nodes", "2", "--pods", "3", "--bin-dir", bin, "--data-dir", shortDir(t)}
	if vpptest.Real() { // make test-vpp: every node on a real VPP
		pkg := os.Getenv(vppproc.EnvPackage)
		if pkg == "" {
			t.Fatal("the lab runs a real VPP from VPP_PKG (an unpacked package directory)")
		}
		// Three nodes: the restarted VPP (node-1's) then still has routes to bring back, to node-2's blocks.
		args = append(args, "--vpp", pkg)
		args[1] = "3"
	}
	err := run(ctx, args, &out, &out)
	t.Log(out.String())
	if err != nil {
		t.Fatalf("lab: %v", err)
	}
	if !strings.Contains(out.String(), "7 passed, 0 failed") {
		t.Errorf("lab summary does not report 7 passed steps")
	}
	for _, want := range []string{"FIB table 0", "restart node-1's VPP", "PASS  stop node-"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("lab output lacks %q", want)
		}
	}
	if vpptest.Real() && strings.Count(out.String(), "vppctl -s ") < 2 {
		t.Error("the lab does not print the vppctl line of each node")
	}
}

// shortDir returns a fresh directory short enough for unix socket paths under it.
func shortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "lab")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}
