package dataplane

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/internal/vpptopo"
)

// TestFabricPodToPod: three nodes on one L2 segment (a fabric VPP bridging their memif uplinks), a real
// agent per node programming the other nodes' blocks from etcd. Every pod answers every other node's pod,
// both directions, IPv4 and IPv6. Then one node's blocks are deleted from etcd: once the other agents have
// withdrawn their routes, that node's pod (still on its loopback) answers nobody, while the other pairs
// still answer.
func TestFabricPodToPod(t *testing.T) {
	requireLab(t)
	topo := startTopology(t, vpptopo.Fabric, 3)
	c := newCluster(t, topo)
	for _, n := range topo.Nodes {
		startAgent(t, c.etcd.Endpoint(), n)
	}
	waitRoutes(t, topo, func(n *vpptopo.Node) map[netip.Prefix]netip.Addr { return wantRoutes(topo, n) })
	checkPairs(t, topo.Nodes)

	gone := topo.Nodes[2]
	c.deleteBlocks(gone)
	waitRoutes(t, topo, func(n *vpptopo.Node) map[netip.Prefix]netip.Addr {
		w := wantRoutes(topo, n)
		delete(w, gone.Block4)
		delete(w, gone.Block6)
		return w
	})
	for _, from := range topo.Nodes[:2] {
		for _, ipv6 := range []bool{false, true} {
			results, ok := pingPods(t, from, gone, ipv6)
			t.Logf("after %s's blocks were withdrawn: %s -> %s %s pod %s: %v", gone.Name, from.Name, gone.Name, family(ipv6), gone.Pod(ipv6), results)
			if ok || received(results) != 0 {
				t.Errorf("%s's pod %s still answers %s after its block was withdrawn: %v", gone.Name, gone.Pod(ipv6), from.Name, results)
			}
		}
	}
	checkPairs(t, topo.Nodes[:2])
}

// checkPairs pings from every node's pod to every other node's pod, IPv4 and IPv6, and fails the test
// for each pair that does not answer.
func checkPairs(t *testing.T, nodes []*vpptopo.Node) {
	t.Helper()
	for _, from := range nodes {
		for _, to := range nodes {
			if from == to {
				continue
			}
			for _, ipv6 := range []bool{false, true} {
				results, ok := pingPods(t, from, to, ipv6)
				t.Logf("%s -> %s %s pod %s: %v", from.Name, to.Name, family(ipv6), to.Pod(ipv6), results)
				if !ok {
					t.Errorf("%s's pod gets no answer from %s's pod %s: %v", from.Name, to.Name, to.Pod(ipv6), results)
				}
			}
		}
	}
}

// TestRoutedPodToPodNeedsEncapsulation: nodes in two subnets joined by a router VPP that knows nothing of
// pod blocks (node-1 and node-3 in 192.168.51.0/24, node-2 in 192.168.52.0/24). The node addresses reach
// each other through the router, and pods on one subnet reach each other. Across the subnets the agent
// programs what it does today, the block via the remote node's address as an attached next hop on the
// uplink; that address is not on the uplink's link, nobody answers its ARP or ND, and the pods do not
// reach each other. The pools here encapsulate nothing (ipipMode and vxlanMode Never); with an IPIP pool
// the pods answer across the router too (TestRoutedIPIP).
func TestRoutedPodToPodNeedsEncapsulation(t *testing.T) {
	requireLab(t)
	topo := startTopology(t, vpptopo.Routed, 3)
	c := newCluster(t, topo)
	for _, n := range topo.Nodes {
		startAgent(t, c.etcd.Endpoint(), n)
	}
	// The agents' routes are there, next hop the remote node's address, on or off the uplink's subnet.
	waitRoutes(t, topo, func(n *vpptopo.Node) map[netip.Prefix]netip.Addr { return wantRoutes(topo, n) })

	sameSubnet := func(a, b *vpptopo.Node) bool { return a.Addr4.Masked() == b.Addr4.Masked() }
	// The underlay: every node address answers every node, through the router across subnets.
	for _, from := range topo.Nodes {
		for _, to := range topo.Nodes {
			if from == to {
				continue
			}
			for _, ipv6 := range []bool{false, true} {
				dst := to.Addr4.Addr()
				if ipv6 {
					dst = to.Addr6.Addr()
				}
				results, ok := ping(t, from, dst, vpptopo.UplinkInterface)
				t.Logf("%s -> %s %s node address %s (same subnet %v): %v", from.Name, to.Name, family(ipv6), dst, sameSubnet(from, to), results)
				if !ok {
					t.Errorf("%s gets no answer from %s's node address %s: %v", from.Name, to.Name, dst, results)
				}
			}
		}
	}
	if t.Failed() {
		t.FailNow() // without an underlay, the pod pings below would prove nothing
	}
	// Pods: answered within a subnet, not across it.
	for _, from := range topo.Nodes {
		for _, to := range topo.Nodes {
			if from == to {
				continue
			}
			for _, ipv6 := range []bool{false, true} {
				results, ok := pingPods(t, from, to, ipv6)
				t.Logf("%s -> %s %s pod %s (same subnet %v): %v", from.Name, to.Name, family(ipv6), to.Pod(ipv6), sameSubnet(from, to), results)
				switch {
				case sameSubnet(from, to) && !ok:
					t.Errorf("%s's pod gets no answer from %s's pod %s on the same subnet: %v", from.Name, to.Name, to.Pod(ipv6), results)
				case !sameSubnet(from, to) && received(results) != 0:
					t.Errorf("%s's pod got answers from %s's pod %s across the router without encapsulation (%v): "+
						"if encapsulation is in, this test should now expect them", from.Name, to.Name, to.Pod(ipv6), results)
				}
			}
		}
	}
	// Why, as an operator sees it: the route's next hop is never resolved on the uplink.
	n1, n2 := topo.Nodes[0], topo.Nodes[1]
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	neighbors, err := n1.VPP.CLI(ctx, "show ip neighbors")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(neighbors, " "+n2.Addr4.Addr().String()+" ") {
		t.Errorf("%s resolved %s's address %s on its uplink, across the router:\n%s", n1.Name, n2.Name, n2.Addr4.Addr(), neighbors)
	}
	fib, _ := n1.VPP.CLI(ctx, "show ip fib "+n2.Block4.String())
	t.Logf("%s: show ip fib %s:\n%s\n%s: show ip neighbors:\n%s", n1.Name, n2.Block4, fib, n1.Name, neighbors)
}
