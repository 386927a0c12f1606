package dataplane

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/internal/vppproc"
	"github.com/vpp-route-agent/vpp-route-agent/internal/vpptopo"
)

// dualHomedPods is the number of pods on each node of the dual-homed tests: several flows between two
// nodes, which VPP hashes over the paths of an ECMP route (by source and destination address; an echo
// and its reply are each one flow, hashed by the sender).
const dualHomedPods = 4

// startDualHomed starts n dual-homed nodes (vpptopo.DualHomed, dualHomedPods pods each) and a cluster
// holding their blocks.
func startDualHomed(t testing.TB, n int) (*vpptopo.Topology, *cluster) {
	t.Helper()
	topo := startTopologyWith(t, vpptopo.Config{Kind: vpptopo.DualHomed, Nodes: n, Pods: dualHomedPods})
	return topo, newCluster(t, topo)
}

// startDualHomedAgent runs node n's agent with both its uplinks (--uplink-interface and --uplink-address
// once per uplink, in fabric order, so that it registers peerip/<family>/1 on fabric A and /2 on fabric
// B) and the flags extra.
func startDualHomedAgent(t testing.TB, etcd string, n *vpptopo.Node, extra ...string) (stop func()) {
	t.Helper()
	var args []string
	for _, u := range n.Uplinks {
		args = append(args, "--uplink-interface", u.Interface, "--uplink-address", u.Flag())
	}
	return startAgentArgs(t, etcd, n.Name, n.VPP, append(args, extra...)...)
}

// pathsOf names the paths of a route as "via <next hop> <interface>", sorted.
type pathsOf map[netip.Prefix][]string

// wantECMP are the routes the agent on dual-homed node n must program: every other node's blocks, each
// one route with a path out of each of n's uplinks to that node's address on the uplink's fabric.
func wantECMP(topo *vpptopo.Topology, n *vpptopo.Node) pathsOf {
	want := pathsOf{}
	for _, m := range topo.Nodes {
		if m == n {
			continue
		}
		for _, ipv6 := range []bool{false, true} {
			block := m.Block4
			if ipv6 {
				block = m.Block6
			}
			for k, u := range n.Uplinks {
				want[block] = append(want[block], fmt.Sprintf("via %s %s", m.Uplinks[k].Addr(ipv6), u.Interface))
			}
			slices.Sort(want[block])
		}
	}
	return want
}

// ecmpRoutes returns node n's API routes inside the pools with their paths, as VPP dumps them.
func ecmpRoutes(t testing.TB, n *vpptopo.Node) pathsOf {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	names := map[uint32]string{}
	for _, u := range n.Uplinks {
		idx, err := n.InterfaceIndex(ctx, u.Interface)
		if err != nil {
			t.Fatal(err)
		}
		names[idx] = u.Interface
	}
	routes, err := n.VPP.Routes(ctx, vppproc.SourceAPI)
	if err != nil {
		t.Fatalf("%s: %v", n.Name, err)
	}
	out := pathsOf{}
	for _, r := range routes {
		if !pool4.Contains(r.Prefix.Addr()) && !pool6.Contains(r.Prefix.Addr()) {
			continue
		}
		for _, p := range r.Paths {
			name, ok := names[p.SwIfIndex]
			if !ok {
				name = fmt.Sprintf("sw_if_index %d", p.SwIfIndex)
			}
			out[r.Prefix] = append(out[r.Prefix], fmt.Sprintf("via %s %s", p.NextHop, name))
		}
		slices.Sort(out[r.Prefix])
	}
	return out
}

// waitECMP waits until every node's API routes in the pools, with their paths, are exactly want(node).
func waitECMP(t testing.TB, topo *vpptopo.Topology, want func(*vpptopo.Node) pathsOf) {
	t.Helper()
	start := time.Now()
	for _, n := range topo.Nodes {
		w := want(n)
		deadline := time.Now().Add(60 * time.Second)
		for {
			got := ecmpRoutes(t, n)
			if maps.EqualFunc(got, w, slices.Equal) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s's routes after 60s:\n got %v\nwant %v", n.Name, got, w)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	t.Logf("every node's routes as wanted %s after the wait began", time.Since(start).Round(time.Millisecond))
}

// forwarding returns the next hops node n forwards block by (show ip fib: the data plane's view).
func forwarding(t testing.TB, n *vpptopo.Node, block netip.Prefix) []netip.Addr {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	via, err := n.Forwarding(ctx, block)
	if err != nil {
		t.Fatal(err)
	}
	return via
}

// peerAddrs returns node m's addresses of a family on every fabric, sorted.
func peerAddrs(m *vpptopo.Node, ipv6 bool) []netip.Addr {
	var out []netip.Addr
	for _, u := range m.Uplinks {
		out = append(out, u.Addr(ipv6))
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

// checkForwardsOverBoth fails t unless every node forwards every other node's blocks over both of that
// node's addresses.
func checkForwardsOverBoth(t testing.TB, topo *vpptopo.Topology, what string) {
	t.Helper()
	for _, n := range topo.Nodes {
		for _, m := range topo.Nodes {
			if m == n {
				continue
			}
			for _, ipv6 := range []bool{false, true} {
				block := m.Block4
				if ipv6 {
					block = m.Block6
				}
				if got, want := forwarding(t, n, block), peerAddrs(m, ipv6); !slices.Equal(got, want) {
					t.Errorf("%s: %s forwards %s's block %s via %v, want %v", what, n.Name, m.Name, block, got, want)
				}
			}
		}
	}
}

// podAddrs returns node m's pods of a family.
func podAddrs(m *vpptopo.Node, ipv6 bool) []netip.Addr {
	if ipv6 {
		return m.Pods6
	}
	return m.Pods4
}

// checkAllPodsAnswer fails t unless every pod of to answers from's pod, both families (waiting out
// ARP and ND like checkPairs).
func checkAllPodsAnswer(t testing.TB, from, to *vpptopo.Node, what string) {
	t.Helper()
	for _, ipv6 := range []bool{false, true} {
		for _, pod := range podAddrs(to, ipv6) {
			results, ok := ping(t, from, pod, vpptopo.PodInterface)
			if !ok {
				t.Errorf("%s: %s's pod gets no answer from %s's pod %s: %v", what, from.Name, to.Name, pod, results)
			}
		}
	}
}

// TestDualHomedECMP: three dual-homed nodes (one uplink into fabric A, one into fabric B), an agent on
// each with both uplinks. Every remote block is one route with two paths, one per uplink to the owner's
// address on that fabric, as dumped and as VPP forwards it; every pod pair answers, both ways, IPv4 and
// IPv6, and every pod of node-2 answers node-1 and node-3.
//
// Then node-2's port on fabric A goes down (on the fabric: node-1's, node-3's and node-2's own
// interfaces stay up), WITHOUT BFD. Nothing tells the nodes: the routes keep both paths in forwarding,
// and the flows VPP hashes onto the dead link (either way: an echo by node-1's hash, its reply by
// node-2's) are lost. Asserted: the paths stay, some flows to node-2's pods are lost and some get
// through (the hash is of addresses, not of time, so which ones is the same every run). The counts are
// logged. With the port up again every pod answers.
func TestDualHomedECMP(t *testing.T) {
	requireLab(t)
	topo, c := startDualHomed(t, 3)
	for _, n := range topo.Nodes {
		startDualHomedAgent(t, c.etcd.Endpoint(), n)
	}
	waitECMP(t, topo, func(n *vpptopo.Node) pathsOf { return wantECMP(topo, n) })
	n1, n2, n3 := topo.Nodes[0], topo.Nodes[1], topo.Nodes[2]
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if fib, err := n1.VPP.CLI(ctx, "show ip fib "+n2.Block4.String()); err == nil {
		t.Logf("%s: show ip fib %s:\n%s", n1.Name, n2.Block4, fib)
	}
	checkForwardsOverBoth(t, topo, "all links up")
	checkPairs(t, topo.Nodes)
	for _, from := range []*vpptopo.Node{n1, n3} {
		checkAllPodsAnswer(t, from, n2, "all links up")
	}
	if t.Failed() {
		t.FailNow() // the failure below would prove nothing
	}

	if err := topo.SetSwitchPort(ctx, n2, 0, false); err != nil {
		t.Fatal(err)
	}
	lost, answered := 0, 0
	for _, from := range []*vpptopo.Node{n1, n3} {
		for _, ipv6 := range []bool{false, true} {
			var line []string
			for _, pod := range podAddrs(n2, ipv6) {
				r, err := vpptopo.Ping(ctx, from.VPP, vpptopo.PodInterface, pod, pingCount)
				if err != nil {
					t.Fatal(err)
				}
				line = append(line, fmt.Sprintf("%s %v", pod, r))
				if r.Received == 0 {
					lost++
				} else {
					answered++
				}
			}
			t.Logf("without BFD, node-2's fabric-A port down: %s -> node-2's %s pods: %v", from.Name, family(ipv6), line)
		}
	}
	t.Logf("FIGURE without BFD, node-2's fabric-A port down: %d of %d pod flows (node-1 and node-3 to node-2's %d pods, IPv4 and IPv6) got no answer",
		lost, lost+answered, dualHomedPods)
	if lost == 0 || answered == 0 {
		t.Errorf("without BFD, node-2's fabric-A port down: %d flows lost, %d answered; want some of each (ECMP hashing flows over a live and a dead path)", lost, answered)
	}
	// The agents know nothing: still two paths, as dumped and as forwarded.
	waitECMP(t, topo, func(n *vpptopo.Node) pathsOf { return wantECMP(topo, n) })
	checkForwardsOverBoth(t, topo, "without BFD, node-2's fabric-A port down")

	if err := topo.SetSwitchPort(ctx, n2, 0, true); err != nil {
		t.Fatal(err)
	}
	for _, from := range []*vpptopo.Node{n1, n3} {
		checkAllPodsAnswer(t, from, n2, "node-2's fabric-A port up again")
	}
}
