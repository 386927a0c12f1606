package dataplane

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"go.fd.io/govpp/api"
	"go.fd.io/govpp/binapi/interface_types"
	"go.fd.io/govpp/binapi/vxlan"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/internal/vpptopo"
)

// vnis returns the VNIs of node n's VXLAN tunnels.
func vnis(t *testing.T, n *vpptopo.Node) []uint32 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out []uint32
	err := n.VPP.Call(ctx, func(ch api.Channel) error {
		req := ch.SendMultiRequest(&vxlan.VxlanTunnelV2Dump{SwIfIndex: ^interface_types.InterfaceIndex(0)})
		for {
			d := new(vxlan.VxlanTunnelV2Details)
			last, err := req.ReceiveReply(d)
			if err != nil || last {
				return err
			}
			out = append(out, d.Vni)
		}
	})
	if err != nil {
		t.Fatalf("%s: dump VXLAN tunnels: %v", n.Name, err)
	}
	return out
}

// waitVNI waits until every VXLAN tunnel of every node has VNI vni.
func waitVNI(t *testing.T, topo *vpptopo.Topology, vni uint32) {
	t.Helper()
	for _, n := range topo.Nodes {
		deadline := time.Now().Add(60 * time.Second)
		for {
			got := vnis(t, n)
			ok := len(got) > 0
			for _, v := range got {
				ok = ok && v == vni
			}
			if ok {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s's VXLAN tunnels have VNIs %v after 60s, want all %d", n.Name, got, vni)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// setVNI writes the default FelixConfiguration with vxlanVNI vni.
func (c *cluster) setVNI(vni int) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	v := fmt.Sprintf(`{"kind":"FelixConfiguration","apiVersion":"projectcalico.org/v3","metadata":{"name":"default"},"spec":{"vxlanVNI":%d}}`, vni)
	if _, err := c.cli.Put(ctx, calico.FelixConfigurationKey("default"), v); err != nil {
		c.t.Fatal(err)
	}
}

// TestEncapChangeLoss measures (t.Log, no bound asserted: a figure for docs/performance.md) the pod-to-pod
// IPv4 pings lost while the encapsulation changes under them, on the routed topology with the agents
// running: 400 echoes 10 ms apart, the change made 1 s in.
//
//   - ipipMode Never -> Always, node-1 -> node-3 (same subnet: flat, then IPIP);
//   - IPIP -> VXLAN (one pool write: ipipMode Never, vxlanMode Always), node-1 -> node-2 (across the
//     router: answered before and after);
//   - FelixConfiguration vxlanVNI 4096 -> 4097 (every tunnel made again), node-1 -> node-2;
//   - node-1's agent restarted, node-1 -> node-2 through VXLAN.
//
// After each change every pod pair that must answer does (checked, not timed).
func TestEncapChangeLoss(t *testing.T) {
	requireLab(t)
	topo := startTopologyWith(t, vpptopo.Config{Kind: vpptopo.Routed, Nodes: 3, VXLAN: true})
	c := newCluster(t, topo)
	c.putCalicoNodes(topo)
	stops := map[*vpptopo.Node]func(){}
	for _, n := range topo.Nodes {
		stops[n] = startAgent(t, c.etcd.Endpoint(), n)
	}
	n1, n2, n3 := topo.Nodes[0], topo.Nodes[1], topo.Nodes[2]
	waitEncap(t, topo, calico.EncapNever)
	if r, ok := pingPods(t, n1, n3, false); !ok {
		t.Fatalf("flat, same subnet: no answer: %v", r)
	}
	report := func(what string, from, to *vpptopo.Node, r vpptopo.Echoes) {
		t.Logf("FIGURE ping loss %s -> %s while %s: %d of %d lost (%.1f ms at 10 ms per echo), longest outage %s",
			from.Name, to.Name, what, r.Sent-r.Received, r.Sent, float64(r.Sent-r.Received)*10, r.Outage())
	}
	mustAnswer := func(from, to *vpptopo.Node) {
		t.Helper()
		if r, ok := pingPods(t, from, to, false); !ok {
			t.Errorf("%s -> %s IPv4: no answer after the change: %v", from.Name, to.Name, r)
		}
	}

	r := lossDuring(t, n1, n3, func() { c.setIPIPMode(calico.EncapAlways) })
	report("ipipMode went Never -> Always (same subnet: flat -> IPIP)", n1, n3, r)
	waitEncap(t, topo, calico.EncapAlways)
	mustAnswer(n1, n2)

	r = lossDuring(t, n1, n2, func() { c.setVXLANMode(calico.EncapAlways) })
	report("the pool went IPIP -> VXLAN (across the router)", n1, n2, r)
	waitVXLAN(t, topo, func(n *vpptopo.Node) map[netip.Prefix]string { return wantVXLAN(topo, n) })
	mustAnswer(n1, n2)

	r = lossDuring(t, n1, n2, func() { c.setVNI(4097) })
	report("vxlanVNI went 4096 -> 4097 (across the router, VXLAN)", n1, n2, r)
	waitVNI(t, topo, 4097)
	mustAnswer(n1, n2)

	r = lossDuring(t, n1, n2, func() {
		stops[n1]()
		stops[n1] = startAgent(t, c.etcd.Endpoint(), n1)
	})
	report("node-1's agent restarted (across the router, VXLAN)", n1, n2, r)
	mustAnswer(n1, n2)
}
