package dataplane

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"go.fd.io/govpp/api"
	interfaces "go.fd.io/govpp/binapi/interface"
	"go.fd.io/govpp/binapi/interface_types"
	"go.fd.io/govpp/binapi/ip"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/internal/vpptopo"
)

// uplinkMTU is the L3 MTU of a topology's memif uplinks (VPP's default, which vpptopo leaves).
const uplinkMTU = 9000

// refuseFragments makes node n's VPP drop every fragmented packet addressed to it (full reassembly of at
// most one fragment, both families): VPP's ping cannot set DF, and the sender fragments an echo larger
// than the tunnel's MTU, so only this makes "one byte more" fail for the MTU, not for a reassembly limit
// (VPP's default of 3 fragments happens to drop the 5 fragments of a 9 kB echo, which a 1500-byte path
// would not).
func refuseFragments(t *testing.T, n *vpptopo.Node) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := n.VPP.Call(ctx, func(ch api.Channel) error {
		for _, v6 := range []bool{false, true} {
			req := &ip.IPReassemblySet{TimeoutMs: 200, MaxReassemblies: 1024, MaxReassemblyLength: 1,
				ExpireWalkIntervalMs: 50, IsIP6: v6, Type: ip.IP_REASS_TYPE_FULL}
			reply := new(ip.IPReassemblySetReply)
			if err := ch.SendRequest(req).ReceiveReply(reply); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%s: ip_reassembly_set: %v", n.Name, err)
	}
}

// interfaceMTU returns the L3 MTU of node n's interface idx.
func interfaceMTU(t *testing.T, n *vpptopo.Node, idx uint32) uint32 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var mtu uint32
	err := n.VPP.Call(ctx, func(ch api.Channel) error {
		req := ch.SendMultiRequest(&interfaces.SwInterfaceDump{SwIfIndex: interface_types.InterfaceIndex(idx)})
		for {
			d := new(interfaces.SwInterfaceDetails)
			last, err := req.ReceiveReply(d)
			if err != nil || last {
				return err
			}
			if uint32(d.SwIfIndex) == idx && len(d.Mtu) > 0 {
				mtu = d.Mtu[0]
			}
		}
	})
	if err != nil {
		t.Fatalf("%s: %v", n.Name, err)
	}
	return mtu
}

// checkLargestPing pings from's pod to to's pod with the largest echo whose IP packet is podMTU bytes,
// which must be answered, then with one byte more, which must not (the sender fragments it; the
// receiver refuses fragments).
func checkLargestPing(t *testing.T, from, to *vpptopo.Node, ipv6 bool, podMTU int, what string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	size := podMTU - vpptopo.PingOverhead(ipv6)
	dst := to.Pod(ipv6)
	// A round of 3 echoes, up to 5 rounds: the first echoes of a path are lost to ARP/ND.
	var fits vpptopo.PingResult
	for range pingRounds {
		r, err := vpptopo.PingSize(ctx, from.VPP, vpptopo.PodInterface, dst, pingCount, size)
		if err != nil {
			t.Fatal(err)
		}
		if fits = r; r.Received >= pingAtLeast {
			break
		}
	}
	over, err := vpptopo.PingSize(ctx, from.VPP, vpptopo.PodInterface, dst, pingCount, size+1)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s %s -> %s %s: %d-byte packets (size %d) %s, %d bytes %s", what, from.Name, to.Name, family(ipv6),
		podMTU, size, fits, podMTU+1, over)
	if fits.Received < pingAtLeast {
		t.Errorf("%s %s: echoes of %d bytes, the pod MTU, not answered: %s", what, family(ipv6), podMTU, fits)
	}
	if over.Received != 0 {
		t.Errorf("%s %s: echoes of %d bytes, one more than the pod MTU, answered: %s", what, family(ipv6), podMTU+1, over)
	}
}

// TestPathMTU: the agent sets each tunnel's MTU to the uplink's less the encapsulation's overhead (IPIP
// 20, VXLAN 50 over IPv4, 70 over IPv6), and a pod-to-pod echo of exactly that size crosses the router
// while one byte more does not: for IPIP (IPv4) and VXLAN (IPv4 and IPv6), both directions.
func TestPathMTU(t *testing.T) {
	requireLab(t)
	topo := startTopologyWith(t, vpptopo.Config{Kind: vpptopo.Routed, Nodes: 2, VXLAN: true})
	c := newCluster(t, topo)
	c.putCalicoNodes(topo)
	for _, n := range topo.Nodes {
		refuseFragments(t, n)
		startAgent(t, c.etcd.Endpoint(), n)
	}
	n1, n2 := topo.Nodes[0], topo.Nodes[1]

	c.setIPIPMode(calico.EncapAlways)
	waitEncap(t, topo, calico.EncapAlways)
	ipipMTU := uplinkMTU - calico.EncapIPIP.Overhead(false)
	for _, n := range topo.Nodes {
		for _, tun := range tunnels(t, n) {
			if got := interfaceMTU(t, n, tun.SwIfIndex); got != uint32(ipipMTU) {
				t.Errorf("%s: IPIP tunnel to %s has MTU %d, want %d", n.Name, tun.Dst, got, ipipMTU)
			}
		}
	}
	checkLargestPing(t, n1, n2, false, ipipMTU, "IPIP")
	checkLargestPing(t, n2, n1, false, ipipMTU, "IPIP")

	c.setIPIPMode(calico.EncapNever)
	c.setVXLANMode(calico.EncapAlways)
	waitVXLAN(t, topo, func(n *vpptopo.Node) map[netip.Prefix]string { return wantVXLAN(topo, n) })
	for _, n := range topo.Nodes {
		for idx, dst := range vxlanTunnels(t, n) {
			want := uint32(uplinkMTU - calico.EncapVXLAN.Overhead(dst.Is6()))
			if got := interfaceMTU(t, n, idx); got != want {
				t.Errorf("%s: VXLAN tunnel to %s has MTU %d, want %d", n.Name, dst, got, want)
			}
		}
	}
	for _, ipv6 := range []bool{false, true} {
		mtu := uplinkMTU - calico.EncapVXLAN.Overhead(ipv6)
		checkLargestPing(t, n1, n2, ipv6, mtu, fmt.Sprintf("VXLAN (overhead %d)", calico.EncapVXLAN.Overhead(ipv6)))
		checkLargestPing(t, n2, n1, ipv6, mtu, fmt.Sprintf("VXLAN (overhead %d)", calico.EncapVXLAN.Overhead(ipv6)))
	}
}
