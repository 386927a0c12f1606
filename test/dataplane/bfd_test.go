package dataplane

import (
	"context"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.fd.io/govpp/api"
	"go.fd.io/govpp/binapi/bfd"

	"github.com/vpp-route-agent/vpp-route-agent/internal/vpptopo"
)

// BFD between real VPPs over memif (--bfd on every agent): a node whose VPP is killed leaves the other
// nodes' forwarding within the detection time, by VPP's own adj-BFD tracking, and comes back once its VPP
// restarts and its agent programs it again.

// startBFDAgent runs a vpp-route-agent with --bfd at interval x 3 for node n (as startAgent does, plus the
// BFD flags); it stops with the test, its log shown if the test fails.
func startBFDAgent(t testing.TB, etcd string, n *vpptopo.Node, interval time.Duration) {
	t.Helper()
	startAgentArgs(t, etcd, n.Name, n.VPP, "--uplink-interface", vpptopo.UplinkInterface,
		"--uplink-address", n.Addr4.String(), "--uplink-address", n.Addr6.String(),
		"--bfd", "--bfd-interval", interval.String(), "--bfd-multiplier", "3")
}

// bfdStates returns node n's BFD sessions, peer -> state (0 admin-down, 1 down, 2 init, 3 up).
func bfdStates(t testing.TB, n *vpptopo.Node) map[netip.Addr]bfd.BfdState {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out := map[netip.Addr]bfd.BfdState{}
	err := n.VPP.Call(ctx, func(ch api.Channel) error {
		req := ch.SendMultiRequest(&bfd.BfdUDPSessionDump{})
		for {
			var d bfd.BfdUDPSessionDetails
			last, err := req.ReceiveReply(&d)
			if err != nil || last {
				return err
			}
			a := d.PeerAddr
			if a.Af == 1 {
				out[netip.AddrFrom16(a.Un.GetIP6())] = d.State
			} else {
				out[netip.AddrFrom4(a.Un.GetIP4())] = d.State
			}
		}
	})
	if err != nil {
		t.Fatalf("%s: dump BFD sessions: %v", n.Name, err)
	}
	return out
}

// fibDrops reports whether node n's FIB entry for block drops (show ip fib: "dpo-drop"): VPP took its
// only path out of forwarding.
func fibDrops(t testing.TB, n *vpptopo.Node, block netip.Prefix) bool {
	t.Helper()
	cmd := "show ip fib " + block.String()
	if block.Addr().Is6() {
		cmd = "show ip6 fib " + block.String()
	}
	out, err := n.VPP.CLI(context.Background(), cmd)
	if err != nil {
		t.Fatalf("%s: %v", n.Name, err)
	}
	return strings.Contains(out, "dpo-drop")
}

// bfdCluster starts a fabric of three single-uplink nodes with their pools and blocks in an embedded etcd
// (as startTopology and newCluster do, for benchmarks too), an agent with --bfd on each, and waits until
// every node's sessions to the others are up.
func bfdCluster(t testing.TB, interval time.Duration) *vpptopo.Topology {
	t.Helper()
	requireLab(t)
	topo := startTopologyWith(t, vpptopo.Config{Kind: vpptopo.Fabric, Nodes: 3})
	c := newCluster(t, topo)
	for _, n := range topo.Nodes {
		startBFDAgent(t, c.etcd.Endpoint(), n, interval)
	}
	waitBFDUp(t, topo.Nodes, 60*time.Second)
	return topo
}

// waitBFDUp waits until each node has an Up session to every other node's two addresses.
func waitBFDUp(t testing.TB, nodes []*vpptopo.Node, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for _, n := range nodes {
		for {
			st := bfdStates(t, n)
			up := 0
			for _, m := range nodes {
				if m != n && st[m.Addr4.Addr()] == bfd.BFD_STATE_API_UP && st[m.Addr6.Addr()] == bfd.BFD_STATE_API_UP {
					up++
				}
			}
			if up == len(nodes)-1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s's BFD sessions not all up after %s: %v", n.Name, within, st)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// killAndTimeDrop kills -9 gone's VPP and returns how long until every other node's FIB drops both of
// gone's blocks (each session has its own detection timer; polled every 10 ms).
func killAndTimeDrop(t testing.TB, topo *vpptopo.Topology, gone *vpptopo.Node, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	if err := gone.VPP.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for _, n := range topo.Nodes {
		if n == gone {
			continue
		}
		for _, block := range []netip.Prefix{gone.Block4, gone.Block6} {
			for !fibDrops(t, n, block) {
				if time.Since(start) > within {
					t.Fatalf("%s still forwards to %s's block %s after %s", n.Name, gone.Name, block, within)
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
	}
	return time.Since(start)
}

// TestBFDKilledVPPLeavesForwarding: three nodes, --bfd at 200 ms x 3 on each. node-3's VPP is killed
// (kill -9): node-1 and node-2 drop both its blocks within 1 s (VPP's BFD, no agent action; its registration
// stays). node-1's uplink goes down and up: its agent re-creates the sessions that are not up, so VPP does
// not forward to the dead node again (VPP's defect). node-3's VPP restarts: its agent reconnects and programs it again, the
// sessions come up, and the pods answer again.
func TestBFDKilledVPPLeavesForwarding(t *testing.T) {
	requireLab(t)
	topo := bfdCluster(t, 200*time.Millisecond)
	gone := topo.Nodes[2]
	if _, ok := pingPods(t, topo.Nodes[0], gone, false); !ok {
		t.Fatalf("%s's pod does not answer %s before the kill", gone.Name, topo.Nodes[0].Name)
	}
	took := killAndTimeDrop(t, topo, gone, time.Second)
	t.Logf("%s's VPP killed: the other nodes drop both its blocks after %s", gone.Name, took.Round(time.Millisecond))

	// node-1's uplink down and up: VPP 26.06 would forward over the BFD-down path again (its defect); the
	// agent re-creates the sessions that are not up, and the block drops again.
	n1 := topo.Nodes[0]
	for _, cmd := range []string{"set interface state " + vpptopo.UplinkInterface + " down", "set interface state " + vpptopo.UplinkInterface + " up"} {
		if out, err := n1.VPP.CLI(context.Background(), cmd); err != nil {
			t.Fatalf("%s: %v", out, err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for !fibDrops(t, n1, gone.Block4) || !fibDrops(t, n1, gone.Block6) {
		if time.Now().After(deadline) {
			out, _ := n1.VPP.CLI(context.Background(), "show ip fib "+gone.Block4.String())
			t.Fatalf("after its uplink went down and up, %s forwards to the dead %s again:\n%s", n1.Name, gone.Name, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := gone.VPP.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	waitBFDUp(t, topo.Nodes, 60*time.Second)
	for _, n := range topo.Nodes[:2] {
		for _, ipv6 := range []bool{false, true} {
			if results, ok := pingPods(t, n, gone, ipv6); !ok {
				t.Errorf("%s's %s pod does not answer %s after its VPP restarted: %v", gone.Name, family(ipv6), n.Name, results)
			}
		}
	}
}

// BenchmarkBFDDetectionToDrop: the default --bfd-interval 300ms x 3; each iteration kills node-3's VPP
// and times until both other nodes' FIBs drop its block (detect-ms: VPP's detection plus the poll), then
// restarts it and waits for the sessions to come up again (not timed).
func BenchmarkBFDDetectionToDrop(b *testing.B) {
	topo := bfdCluster(b, 300*time.Millisecond)
	gone := topo.Nodes[2]
	var total, lo, hi time.Duration
	b.ResetTimer()
	for i := range b.N {
		d := killAndTimeDrop(b, topo, gone, 5*time.Second)
		total += d
		if i == 0 || d < lo {
			lo = d
		}
		hi = max(hi, d)
		b.StopTimer()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		if err := gone.VPP.Restart(ctx); err != nil {
			b.Fatal(err)
		}
		cancel()
		waitBFDUp(b, topo.Nodes, 60*time.Second)
		b.StartTimer()
	}
	b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "detect-ms")
	b.ReportMetric(float64(lo.Milliseconds()), "min-detect-ms")
	b.ReportMetric(float64(hi.Milliseconds()), "max-detect-ms")
}
