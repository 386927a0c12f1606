package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/internal/vppproc"
	"github.com/vpp-route-agent/vpp-route-agent/internal/vpptest"
	"github.com/vpp-route-agent/vpp-route-agent/internal/vpptopo"
)

// TestLabScenarioPasses runs the lab as `make lab` does, smaller: two nodes, the real binaries.
func TestLabScenarioPasses(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries and runs the lab")
	}
	bin := buildBinaries(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	args := []string{"--nodes", "2", "--pods", "3", "--bin-dir", bin, "--data-dir", shortDir(t)}
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
	if !strings.Contains(out.String(), "pod-to-pod pings need the lab build") || strings.Contains(out.String(), " ping node-") {
		t.Error("the lab without memif does not say that pings need the lab build, or it pings")
	}
}

// TestLabPings runs the lab on the lab build (VPP_LAB_PKG, make test-vpp): three nodes wired with memif,
// node-2 behind a router VPP, the IPv4 pool IPIP CrossSubnet. Every step must pass its pings: node-1 and
// node-3 flat, node-2 through IPIP, IPv6 (flat) failing across the router, and node-3's pod unreachable
// both ways once its blocks are released (its address stays on its loopback: only the routes changed).
func TestLabPings(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries and runs the lab")
	}
	if !vpptest.Real() {
		t.Skip("needs real VPP: " + vpptest.EnvBackend + "=real and " + vpptopo.EnvLabPackage + " (make test-vpp)")
	}
	pkg := os.Getenv(vpptopo.EnvLabPackage)
	if pkg == "" {
		t.Skip(vpptopo.HowToGet)
	}
	bin := buildBinaries(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	start := time.Now()
	err := run(ctx, []string{"--nodes", "3", "--pods", "3", "--bin-dir", bin, "--data-dir", shortDir(t), "--vpp", pkg}, &out, &out)
	t.Log(out.String())
	t.Logf("the wired lab took %s", time.Since(start).Round(time.Millisecond))
	if err != nil {
		t.Fatalf("lab: %v", err)
	}
	text := out.String()
	if !strings.Contains(text, "7 passed, 0 failed") {
		t.Errorf("lab summary does not report 7 passed steps")
	}
	if strings.Contains(text, "FAIL ping") {
		t.Error("a ping did not behave")
	}
	// Each kind of ping shows: both paths, the IPv6 failure across the router, the withdrawn block both ways.
	for _, want := range []string{
		"PASS ping node-1 pod 10.244.", // IPv4 pods
		"must answer, flat, same subnet",
		"must answer, IPIP across the router (CrossSubnet)",
		"must not answer, flat IPv6 route across the router",
		"must not answer, node-3's blocks released: routes to them withdrawn",
		"must not answer, node-3's blocks released: no route back to its pod",
		"pings as expected: 8 answered, 4 did not",  // before the release
		"pings as expected: 2 answered, 10 did not", // after it, the VPP restart and agent restart included
		"via ipip 192.168.52.2",                     // node-2's block through a tunnel in the summary's FIBs
	} {
		if !strings.Contains(text, want) {
			t.Errorf("lab output lacks %q", want)
		}
	}
	if n := strings.Count(text, "pings as expected"); n != 6 {
		t.Errorf("%d steps pinged, want 6 (every step after the pods are placed)", n)
	}
}

// The daemons and the plugin, built once for the package's tests (a -race build takes about 20 s).
var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// buildBinaries builds the daemons and the plugin into a temporary directory, once.
func buildBinaries(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		if binDir, buildErr = os.MkdirTemp("", "vpplab-bin-"); buildErr != nil {
			return
		}
		args := []string{"build", "-o", binDir + "/"}
		if raceEnabled {
			args = append(args, "-race")
		}
		args = append(args, "../vpp-route-agent", "../block-ipam", "../block-ipamd")
		if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binDir
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
