package dataplane

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/internal/calicotest"
	"github.com/vpp-route-agent/vpp-route-agent/internal/etcdtest"
	"github.com/vpp-route-agent/vpp-route-agent/internal/vppproc"
	"github.com/vpp-route-agent/vpp-route-agent/internal/vpptopo"
)

// TestMixedVXLAN: a mixed cluster. Two lab VPPs run real agents; a Linux network namespace is a third
// node as felix configures a VXLAN node (vxlan.calico: VNI 4096, port 4789, its generated VTEP MAC and
// address, a permanent neighbour and FDB entry and an onlink route per VPP node's VTEP), with no agent
// and no registration under /vpp-calico/hosts: only its Calico Node. The namespace's bridge is the
// underlay (TEST-NET-2), each VPP attached by af_packet on a veth. The IPv4 pool is vxlanMode Always.
// Every pod pair answers, both ways: VPP <-> Linux and VPP <-> VPP through the Linux bridge.
//
// vxlan.calico is made with noudpcsum, unlike felix's: over a veth the kernel leaves the outer UDP
// checksum partial (for a NIC to complete), and VPP's af_packet input then drops the packets (bad UDP
// checksum), or, with its checksum offload, sends replies with a bad one; a real NIC completes it, and a
// zero checksum is valid for IPv4 (vppapi's TestVXLANLinuxInterop found it).
func TestMixedVXLAN(t *testing.T) {
	requireLab(t)
	if os.Geteuid() != 0 {
		t.Skip("needs root: a network namespace, veth pairs, a bridge and a kernel VXLAN device")
	}
	if _, err := exec.LookPath("bridge"); err != nil {
		t.Skip("needs iproute2's ip and bridge")
	}
	id := fmt.Sprintf("mx%d", os.Getpid()%100000)
	ns, err := vpptopo.NewVXLANNetns(id)
	if err != nil {
		t.Skip(err)
	}
	t.Cleanup(ns.Delete) // takes the veth pairs with it
	inNS := func(args ...string) string {
		t.Helper()
		return must(t)(ns.Exec(args...))
	}

	type vppNode struct {
		name      string
		ip        netip.Prefix
		block     netip.Prefix
		vtep, pod netip.Addr
		end       string // the veth end VPP takes with af_packet
		vpp       *vppproc.VPP
	}
	lnxName, lnxIP := "linux-node", netip.MustParsePrefix("198.51.100.3/24")
	lnxBlock := netip.MustParsePrefix("10.244.3.0/26")
	lnxVTEP, lnxPod := netip.MustParseAddr("10.244.3.0"), netip.MustParseAddr("10.244.3.1")
	nodes := []*vppNode{
		{name: "vpp-1", ip: netip.MustParsePrefix("198.51.100.1/24"), block: netip.MustParsePrefix("10.244.1.0/26"),
			vtep: netip.MustParseAddr("10.244.1.0"), pod: netip.MustParseAddr("10.244.1.1"), end: id + "a"},
		{name: "vpp-2", ip: netip.MustParsePrefix("198.51.100.2/24"), block: netip.MustParsePrefix("10.244.2.0/26"),
			vtep: netip.MustParseAddr("10.244.2.0"), pod: netip.MustParseAddr("10.244.2.1"), end: id + "b"},
	}

	// The Linux node: a bridge as its underlay interface, one veth per VPP node on it.
	inNS("ip", "link", "set", "lo", "up")
	inNS("ip", "link", "add", "br0", "type", "bridge")
	inNS("ip", "addr", "add", lnxIP.String(), "dev", "br0")
	inNS("ip", "link", "set", "br0", "up")
	for _, n := range nodes {
		sh(t, "ip", "link", "add", n.end, "type", "veth", "peer", "name", n.end+"l")
		t.Cleanup(func() { _ = exec.Command("ip", "link", "del", n.end).Run() })
		_ = exec.Command("sysctl", "-qw", "net.ipv6.conf."+n.end+".disable_ipv6=1").Run()
		sh(t, "ip", "link", "set", n.end, "up")
		sh(t, "ip", "link", "set", n.end+"l", "netns", string(ns))
		inNS("ip", "link", "set", n.end+"l", "master", "br0")
		inNS("ip", "link", "set", n.end+"l", "up")
	}
	lnxMAC := calico.GeneratedVTEPMAC(lnxName, false)
	inNS("ip", "link", "add", "vxlan.calico", "address", lnxMAC.String(), "type", "vxlan", "id", "4096", "dstport", "4789",
		"local", lnxIP.Addr().String(), "dev", "br0", "nolearning", "noudpcsum")
	inNS("ip", "link", "set", "vxlan.calico", "up")
	inNS("ip", "addr", "add", lnxVTEP.String()+"/32", "dev", "vxlan.calico")
	for _, n := range nodes {
		mac := calico.GeneratedVTEPMAC(n.name, false).String()
		inNS("ip", "neigh", "add", n.vtep.String(), "lladdr", mac, "dev", "vxlan.calico", "nud", "permanent")
		inNS("bridge", "fdb", "add", mac, "dev", "vxlan.calico", "dst", n.ip.Addr().String(), "self", "permanent")
		inNS("ip", "route", "add", n.block.String(), "via", n.vtep.String(), "dev", "vxlan.calico", "onlink")
	}
	inNS("ip", "addr", "add", lnxPod.String()+"/32", "dev", "lo")

	// etcd: the VXLAN pool, a block per node, the Calico Nodes (the Linux node's too).
	srv, cli := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(calicotest.PutPool(ctx, cli, calico.IPPool{Name: "default-ipv4-ippool", CIDR: pool4, BlockSize: 26, VXLANMode: calico.EncapAlways, IPIPMode: calico.EncapNever}))
	putNode := func(name string, ip netip.Prefix, vtep netip.Addr) {
		_, err := cli.Put(ctx, calico.NodeKey(name), fmt.Sprintf(`{"kind":"Node","apiVersion":"projectcalico.org/v3","metadata":{"name":%q},"spec":{"bgp":{"ipv4Address":%q},"ipv4VXLANTunnelAddr":%q}}`,
			name, ip.String(), vtep.String()))
		must(err)
	}
	putNode(lnxName, lnxIP, lnxVTEP)
	must(calicotest.PutBlock(ctx, cli, calicotest.Block(lnxBlock, lnxName, 0)))
	for i, n := range nodes {
		putNode(n.name, n.ip, n.vtep)
		must(calicotest.PutBlock(ctx, cli, calicotest.Block(n.block, n.name, i+1)))
	}

	dir, err := os.MkdirTemp("", "mx")
	must(err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	for _, n := range nodes {
		n.vpp, err = vppproc.Start(ctx, labBin, vppproc.Options{Dir: filepath.Join(dir, n.name), InterruptMode: true, HeapMB: 128,
			Plugins: []string{"af_packet_plugin.so", "ping_plugin.so", vpptopo.VXLANPlugin},
			Setup: []string{
				"create host-interface name " + n.end,
				"create loopback interface instance 1",
				"set interface state loop1 up",
				"set interface ip address loop1 " + n.pod.String() + "/32",
			}})
		must(err)
		t.Cleanup(n.vpp.Stop)
		startAgentOn(t, srv.Endpoint(), n.name, n.vpp, "host-"+n.end, n.ip)
	}

	// Each VPP node: the other's block and the Linux node's via their VTEPs, through VXLAN tunnels.
	for _, n := range nodes {
		want := map[netip.Prefix]string{lnxBlock: "vxlan " + lnxIP.Addr().String() + " via " + lnxVTEP.String()}
		for _, m := range nodes {
			if m != n {
				want[m.block] = "vxlan " + m.ip.Addr().String() + " via " + m.vtep.String()
			}
		}
		tn := &vpptopo.Node{Name: n.name, VPP: n.vpp}
		deadline := time.Now().Add(60 * time.Second)
		for {
			got := vxlanRoutes(t, tn)
			if maps.Equal(got, want) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s's routes after 60s:\n got %v\nwant %v", n.name, got, want)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}

	for _, n := range nodes {
		results, ok, err := vpptopo.PingUntil(ctx, n.vpp, "loop1", lnxPod, 3, 2, 5)
		must(err)
		t.Logf("%s pod -> Linux pod %s: %v", n.name, lnxPod, results)
		if !ok {
			t.Errorf("%s's pod gets no answer from the Linux node's pod %s: %v", n.name, lnxPod, results)
		}
		replies := 0
		for range 5 {
			if replies, err = vpptopo.PingFromNetns(string(ns), lnxPod, n.pod, 3); err != nil {
				t.Fatal(err)
			}
			if replies >= 2 {
				break
			}
		}
		t.Logf("Linux pod -> %s pod %s: %d of 3 answered", n.name, n.pod, replies)
		if replies < 2 {
			t.Errorf("the Linux node's pod gets %d of 3 answers from %s's pod %s", replies, n.name, n.pod)
		}
		for _, m := range nodes {
			if m == n {
				continue
			}
			results, ok, err := vpptopo.PingUntil(ctx, n.vpp, "loop1", m.pod, 3, 2, 5)
			must(err)
			t.Logf("%s pod -> %s pod %s: %v", n.name, m.name, m.pod, results)
			if !ok {
				t.Errorf("%s's pod gets no answer from %s's pod %s: %v", n.name, m.name, m.pod, results)
			}
		}
	}
	if t.Failed() {
		t.Logf("vxlan.calico: %s", inNS("ip", "-s", "link", "show", "vxlan.calico"))
		for _, n := range nodes {
			for _, cmd := range []string{"show interface", "show errors", "show ip neighbors", "show vxlan tunnel"} {
				out, _ := n.vpp.CLI(ctx, cmd)
				t.Logf("%s %s: %s", n.name, cmd, out)
			}
		}
	}
}

// sh runs a command, failing the test with its output if it fails.
func sh(t *testing.T, name string, args ...string) string {
	t.Helper()
	return must(t)(vpptopo.Command(name, args...))
}

// must fails t with err, else returns out.
func must(t *testing.T) func(out string, err error) string {
	return func(out string, err error) string {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
}
