package e2e

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/internal/vpptest"
)

// These tests run against the simulator by default and against a real VPP process with
// VPP_TEST_BACKEND=real (make test-vpp): the VPP's uplink appears 2 s after every (re)start, as one
// created by VPP's startup-config does; the simulator's when the test releases it.

// TestVPPRestartLateUplink: after a VPP restart the uplink is missing until VPP creates it. The agent
// waits for it without counting an error, says so in /readyz and a metric, and programs every route once
// it appears. The waiting state is asserted where the test decides when the uplink appears (the
// simulator); a real VPP creates it 2 s after it starts, maybe before the agent reconnects.
func TestVPPRestartLateUplink(t *testing.T) {
	c := newCluster(t)
	const nodes = 4
	blocks := remoteCluster(c, nodes, 100)
	want := wantRoutes(blocks, nodes)
	v := vpptest.New(t, vpptest.Options{LateUplink: true})
	a := startAgent(t, agentConfig{node: "node-self", etcd: c.etcd.Endpoint(), socket: v.Socket(), uplink: selfAddr,
		uplinkIf: v.Uplink()})

	for _, step := range []string{"start", "restart"} {
		if step == "restart" {
			v.Restart()
		}
		if v.UplinkGated() {
			// While the uplink is missing: /readyz and the metric say so, until the test releases it.
			waiting := "- waiting for uplink " + v.Uplink() + "\n"
			eventually(t, 30*time.Second, func() string {
				code, body := a.get("/readyz")
				if code != http.StatusServiceUnavailable || !strings.Contains(body, waiting) || strings.Contains(body, "VPP not connected") {
					return fmt.Sprintf("%s: /readyz = %d %q, want 503 with %q", step, code, body, waiting)
				}
				if m := a.metrics(); m.value(t, "vpp_route_agent_uplink_waiting") != 1 {
					return step + ": vpp_route_agent_uplink_waiting is not 1"
				}
				return ""
			})
			v.ReleaseUplink()
		}
		appeared := v.WaitUplink(30 * time.Second)
		eventually(t, 30*time.Second, func() string {
			if got := v.APIRoutes(pool); !maps.Equal(got, want) {
				return fmt.Sprintf("%s: %d of %d routes", step, len(got), len(want))
			}
			return ""
		})
		t.Logf("%s: all %d routes in %s after the uplink appeared (polled every 10ms)", step, len(want),
			time.Since(appeared).Round(time.Millisecond))
		a.waitReady(30 * time.Second)
		m := a.metrics()
		if n := m.value(t, "vpp_route_agent_syncs_total", "result", "error"); n != 0 {
			t.Errorf("%s: %v failed resyncs counted", step, n)
		}
		if n := m.value(t, "vpp_route_agent_uplink_waiting"); n != 0 {
			t.Errorf("%s: uplink_waiting %v once ready", step, n)
		}
	}
	a.stop()
	logs := map[string]int{"connected to VPP": 2, "lost connection to VPP": 1}
	if v.UplinkGated() {
		// Each VPP start was seen without its uplink, waited on once and left once.
		logs["VPP has no uplink interface yet; waiting for it"] = 2
		logs["uplink interface appeared"] = 2
	}
	checkLogLines(t, a.proc, logs)
	if !v.UplinkGated() {
		// A real VPP may have its uplink before the agent connects: every wait logged still ends once.
		waited, appeared := countLog(a.proc, "VPP has no uplink interface yet; waiting for it"), countLog(a.proc, "uplink interface appeared")
		if waited > 2 || appeared != waited {
			t.Errorf("the uplink wait was logged %d times and its end %d times, want at most 2 and as many", waited, appeared)
		}
	}
}

// TestUplinkDeletedAndCreated: an operator deletes the uplink while the agent runs, then creates an
// interface of that name again. VPP keeps the routes through the deleted interface but drops their
// traffic, also once the interface is back (measured on 26.06). The agent hears of the deletion from
// VPP's interface events (its resync is 90 s away): /readyz, the uplink metric and the log say so
// within seconds; once the interface is back it is set up again (admin up, its address) and every
// route is deleted and added again, so that all of them forward, without a VPP restart.
func TestUplinkDeletedAndCreated(t *testing.T) {
	c := newCluster(t)
	const nodes = 4
	blocks := remoteCluster(c, nodes, 60)
	want := wantRoutes(blocks, nodes)
	v := vpptest.New(t, vpptest.Options{})
	a := startAgent(t, agentConfig{node: "node-self", etcd: c.etcd.Endpoint(), socket: v.Socket(), uplink: selfAddr,
		uplinkIf: v.Uplink()})
	a.waitReady(30 * time.Second)
	eventually(t, 30*time.Second, func() string {
		if got := v.APIRoutes(pool); !maps.Equal(got, want) {
			return fmt.Sprintf("%d of %d routes", len(got), len(want))
		}
		return ""
	})

	v.DeleteUplink()
	deleted := time.Now()
	waiting := "- waiting for uplink " + v.Uplink() + "\n"
	eventually(t, 10*time.Second, func() string {
		code, body := a.get("/readyz")
		if code != http.StatusServiceUnavailable || !strings.Contains(body, waiting) {
			return fmt.Sprintf("/readyz = %d %q, want 503 with %q", code, body, waiting)
		}
		if m := a.metrics(); m.value(t, "vpp_route_agent_uplink_waiting") != 1 {
			return "vpp_route_agent_uplink_waiting is not 1"
		}
		if countLog(a.proc, "the uplink interface is gone from VPP: its routes drop traffic until it is back; waiting for it") != 1 {
			return "the loss is not logged"
		}
		return ""
	})
	t.Logf("the deletion was reported within %s", time.Since(deleted).Round(time.Millisecond))
	if got := v.Unresolved(); len(got) != len(want) {
		t.Fatalf("VPP after the deletion: %d routes drop traffic, want all %d", len(got), len(want))
	}

	idx := v.CreateUplink()
	eventually(t, 30*time.Second, func() string {
		if got := v.APIRoutes(pool); !maps.Equal(got, want) {
			return fmt.Sprintf("%d of %d routes", len(got), len(want))
		}
		if got := v.Unresolved(); len(got) != 0 {
			return fmt.Sprintf("%d routes still drop traffic", len(got))
		}
		if ifc := v.Interface(idx); !ifc.AdminUp || !slices.Contains(ifc.Addresses, selfAddr) {
			return fmt.Sprintf("the uplink is not set up again: %+v", ifc)
		}
		return ""
	})
	a.waitReady(30 * time.Second)
	m := a.metrics()
	if n := m.value(t, "vpp_route_agent_uplink_waiting"); n != 0 {
		t.Errorf("uplink_waiting %v once ready", n)
	}
	if n := m.value(t, "vpp_route_agent_route_operations_total", "op", "delete", "result", "ok"); n != float64(len(want)) {
		t.Errorf("%v routes deleted, want each of the %d once (to add it again)", n, len(want))
	}
	a.stop()
	checkLogLines(t, a.proc, map[string]int{
		"the uplink interface is gone from VPP: its routes drop traffic until it is back; waiting for it": 1,
		"uplink interface appeared": 1,
		"the uplink is back: deleting and adding again every route through it": 1,
		"VPP has no uplink interface yet; waiting for it":                      0,
	})
}

// TestAddressInBlockIsConflict: an operator configures on the uplink an interface address of the prefix
// of a block the agent routes: VPP gleans there instead of forwarding to the block's node, and its API
// dump no longer shows the agent's route. The agent logs that prefix once as held by the interface and
// counts one conflict, resync after resync, with no drift repaired; once the address goes, the route
// forwards again and the conflict ends.
func TestAddressInBlockIsConflict(t *testing.T) {
	c := newCluster(t)
	blocks := remoteCluster(c, 2, 4)
	want := wantRoutes(blocks, 2)
	v := vpptest.New(t, vpptest.Options{})
	a := startAgent(t, agentConfig{node: "node-self", etcd: c.etcd.Endpoint(), socket: v.Socket(), uplink: selfAddr,
		uplinkIf: v.Uplink(), extra: []string{"--resync-interval", "1s"}})
	a.waitReady(30 * time.Second)
	eventually(t, 30*time.Second, func() string {
		if got := v.APIRoutes(pool); !maps.Equal(got, want) {
			return fmt.Sprintf("%d of %d routes", len(got), len(want))
		}
		return ""
	})
	taken := blocks[1]
	address := netip.PrefixFrom(taken.Addr().Next(), taken.Bits())
	v.SetUplinkAddress(address, true)
	const msg = "a route the agent programs is held by a route that is not its own; leaving it alone"
	periodic := func(m metrics) float64 {
		return m.value(t, "vpp_route_agent_syncs_total", "kind", "periodic", "result", "ok")
	}
	var seen float64
	eventually(t, 30*time.Second, func() string {
		m := a.metrics()
		if m.value(t, "vpp_route_agent_routes_conflicting") != 1 {
			return "vpp_route_agent_routes_conflicting is not 1"
		}
		seen = periodic(m)
		return ""
	})
	eventually(t, 30*time.Second, func() string { // three more resyncs that see the address
		if n := periodic(a.metrics()) - seen; n < 3 {
			return fmt.Sprintf("%v periodic resyncs so far, want 3", n)
		}
		return ""
	})
	m := a.metrics()
	if n := m.value(t, "vpp_route_agent_route_conflicts_total"); n != 1 {
		t.Errorf("vpp_route_agent_route_conflicts_total = %v, want 1", n)
	}
	if n := m.value(t, "vpp_route_agent_drift_corrections_total"); n != 0 {
		t.Errorf("vpp_route_agent_drift_corrections_total = %v: the conflict was taken for drift", n)
	}
	var logged []string
	for _, r := range a.records() {
		if r.str("msg") == msg {
			logged = append(logged, r.str("prefix")+" held by "+r.str("held_by"))
		}
	}
	if wantLog := []string{taken.String() + " held by interface"}; !slices.Equal(logged, wantLog) {
		t.Errorf("conflicts logged %q, want %q", logged, wantLog)
	}

	v.SetUplinkAddress(address, false)
	eventually(t, 30*time.Second, func() string {
		if m := a.metrics(); m.value(t, "vpp_route_agent_routes_conflicting") != 0 {
			return "vpp_route_agent_routes_conflicting is not 0"
		}
		if got := v.APIRoutes(pool); !maps.Equal(got, want) {
			return fmt.Sprintf("%d of %d routes", len(got), len(want))
		}
		return ""
	})
	a.stop()
}

// TestVPPFrozenAtColdStart: VPP freezes (SIGSTOP on a real VPP, the simulator's Frozen fault) just
// after the agent connected, while it lists etcd and programs the first routes. Once the agent's health
// probe has gone unanswered, /readyz names VPP and nothing of etcd (the loop does not wait out VPP's
// timeouts while etcd's list waits behind it), and vpp_route_agent_vpp_connected is 0, until VPP thaws;
// then every route is programmed.
func TestVPPFrozenAtColdStart(t *testing.T) {
	c := newCluster(t)
	const nodes = 4
	blocks := remoteCluster(c, nodes, 2000)
	want := wantRoutes(blocks, nodes)
	v := vpptest.New(t, vpptest.Options{})
	a := startAgent(t, agentConfig{node: "node-self", etcd: c.etcd.Endpoint(), socket: v.Socket(), uplink: selfAddr,
		uplinkIf: v.Uplink()})
	a.proc.waitLog("connected to VPP", 15*time.Second)
	v.Freeze()
	a.proc.waitLog("VPP health probe got no reply", 30*time.Second)
	var answers []string
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		code, body := a.get("/readyz")
		connected := a.metrics().value(t, "vpp_route_agent_vpp_connected")
		if code != http.StatusServiceUnavailable || !strings.Contains(body, "- VPP not ") || strings.Contains(body, "etcd") || connected != 0 {
			answers = append(answers, fmt.Sprintf("%d %q vpp_connected %v", code, body, connected))
		}
	}
	if len(answers) > 0 {
		t.Errorf("%d answers of /readyz and vpp_connected while VPP was frozen did not name VPP alone, the first: %s", len(answers), answers[0])
	}
	v.Thaw()
	a.waitReady(60 * time.Second)
	if got := v.APIRoutes(pool); !maps.Equal(got, want) {
		t.Errorf("%d of %d routes once VPP thawed", len(got), len(want))
	}
	a.stop()
}

// countLog counts the JSON log lines of p with message msg.
func countLog(p *proc, msg string) int {
	n := 0
	for _, l := range strings.Split(p.output(), "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(l), &rec) == nil && rec["msg"] == msg {
			n++
		}
	}
	return n
}

// checkLogLines checks what an operator reads in the --log-format json output: nothing but JSON lines,
// at most one component key on each, and each connection change logged once (by one package): the
// given messages exactly as many times as given.
func checkLogLines(t *testing.T, p *proc, want map[string]int) {
	t.Helper()
	got := map[string]int{}
	for _, l := range strings.Split(p.output(), "\n") {
		if l == "" {
			continue
		}
		var rec map[string]any
		if err := json.Unmarshal([]byte(l), &rec); err != nil {
			t.Errorf("a log line that is not JSON: %q", l)
			continue
		}
		if n := strings.Count(l, `"component":`); n > 1 {
			t.Errorf("%d component keys: %s", n, l)
		}
		got[rec["msg"].(string)]++
	}
	for msg, n := range want {
		if got[msg] != n {
			t.Errorf("%q logged %d times, want %d", msg, got[msg], n)
		}
	}
}

// TestRecursiveResolutionInPool: another client's route recursive via a pod address makes VPP add a
// recursive-resolution /32 inside the pool, dumped via the uplink like the agent's own; a resolved
// neighbour adds an adjacency /32. Neither is the agent's: no delete, no drift, resync after resync.
func TestRecursiveResolutionInPool(t *testing.T) {
	c := newCluster(t)
	blocks := remoteCluster(c, 2, 4)
	want := wantRoutes(blocks, 2)
	v := vpptest.New(t, vpptest.Options{})
	a := startAgent(t, agentConfig{node: "node-self", etcd: c.etcd.Endpoint(), socket: v.Socket(), uplink: selfAddr,
		uplinkIf: v.Uplink(), extra: []string{"--resync-interval", "1s"}})
	a.waitReady(15 * time.Second)

	pod := blocks[1].Addr().Next().Next() // a pod of a remote block
	v.AddRecursiveRoute(netip.MustParsePrefix("172.20.0.0/24"), pod)
	v.ResolveNeighbor(blocks[2].Addr().Next())
	own := 0
	for _, r := range v.Routes(0) {
		if r.Prefix == netip.PrefixFrom(pod, 32) && len(r.Paths) == 1 && r.Paths[0].NextHop == want[blocks[1]] {
			own++
		}
	}
	if own != 1 {
		t.Fatalf("VPP did not add the recursive-resolution %s/32 via %s: %v", pod, want[blocks[1]], v.Routes(0))
	}
	periodic := func(m metrics) float64 {
		return m.value(t, "vpp_route_agent_syncs_total", "kind", "periodic", "result", "ok")
	}
	before := a.metrics()
	var after metrics
	eventually(t, 30*time.Second, func() string { // three periodic resyncs that saw VPP's /32s
		after = a.metrics()
		if n := periodic(after) - periodic(before); n < 3 {
			return fmt.Sprintf("%v periodic resyncs so far, want 3", n)
		}
		return ""
	})
	for _, name := range []string{"vpp_route_agent_drift_corrections_total", "vpp_route_agent_routes_undeletable_total"} {
		if b, a := before.value(t, name), after.value(t, name); a != 0 || b != 0 {
			t.Errorf("%s = %v then %v, want 0", name, b, a)
		}
	}
	if d := after.value(t, "vpp_route_agent_route_operations_total", "op", "delete"); d != 0 {
		t.Errorf("%v deletes: the agent took VPP's own /32s for its routes", d)
	}
	if got := v.APIRoutes(pool); !maps.Equal(got, want) {
		t.Errorf("API routes in the pool:\n got %v\nwant %v", got, want)
	}
	a.stop()
}
