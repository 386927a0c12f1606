package main

import (
	"bytes"
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"
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
	err := run(ctx, []string{"--nodes", "2", "--pods", "3", "--bin-dir", bin, "--data-dir", t.TempDir()}, &out, &out)
	t.Log(out.String())
	if err != nil {
		t.Fatalf("lab: %v", err)
	}
	if !strings.Contains(out.String(), "7 passed, 0 failed") {
		t.Errorf("lab summary does not report 7 passed steps")
	}
	for _, want := range []string{"FIB table 0", "restart node-1's VPP", "PASS  stop node-1's agent"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("lab output lacks %q", want)
		}
	}
}
