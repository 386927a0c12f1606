package vppapi_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/internal/vppproc"
	"github.com/vpp-route-agent/vpp-route-agent/internal/vpptest"
	"github.com/vpp-route-agent/vpp-route-agent/internal/vpptopo"
	"github.com/vpp-route-agent/vpp-route-agent/vppapi"
)

// run runs a command, failing the test with its output if it fails.
func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := vpptopo.Command(name, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestVXLANLinuxInterop: a lab VPP and a Linux network namespace configured as felix configures a node
// (vxlan.calico: VNI 4096, port 4789, its VTEP MAC and address, a permanent neighbour and FDB entry for
// the VPP node's VTEP, its block routed via that VTEP onlink), linked by a veth pair whose VPP end is an
// af_packet interface; the VPP side is made with EnsureVXLANTunnel, EnsureNeighbor and a route via the
// Linux node's VTEP. Pods ping each other both ways. Everything stays inside the namespace, the veth and
// VPP (TEST-NET-2 underlay). Needs root, VPP_TEST_BACKEND=real, VPP_LAB_PKG, and a kernel with VXLAN.
func TestVXLANLinuxInterop(t *testing.T) {
	bin, err := vpptopo.FindLab()
	switch {
	case !vpptest.Real():
		t.Skip("needs real VPP: " + vpptest.EnvBackend + "=real and " + vpptopo.EnvLabPackage)
	case errors.Is(err, vpptopo.ErrNoLab):
		t.Skip(err.Error())
	case err != nil:
		t.Fatal(err)
	case os.Geteuid() != 0:
		t.Skip("needs root: a network namespace, a veth pair and a kernel VXLAN device")
	}
	id := fmt.Sprintf("vxt%d", os.Getpid()%100000)
	vppEnd, lnxEnd := id+"v", id+"l"
	ns, err := vpptopo.NewVXLANNetns(id)
	if err != nil {
		t.Skip(err)
	}
	t.Cleanup(ns.Delete) // takes the veth pair with it
	inNS := func(args ...string) string {
		t.Helper()
		out, err := ns.Exec(args...)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}

	const (
		vppNode, lnxNode = "vpp-node", "linux-node"
		vppIP, lnxIP     = "198.51.100.1", "198.51.100.2"
		vppVTEP, lnxVTEP = "10.244.1.0", "10.244.3.0" // each node's first block address
		vppPod, lnxPod   = "10.244.1.1", "10.244.3.1"
	)
	vppMAC, lnxMAC := vppapi.MAC(calico.GeneratedVTEPMAC(vppNode, false)), vppapi.MAC(calico.GeneratedVTEPMAC(lnxNode, false))

	run(t, "ip", "link", "add", vppEnd, "type", "veth", "peer", "name", lnxEnd)
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", vppEnd).Run() })
	// The VPP end stays in this namespace without addresses; keep the kernel from speaking IPv6 on it.
	_ = exec.Command("sysctl", "-qw", "net.ipv6.conf."+vppEnd+".disable_ipv6=1").Run()
	run(t, "ip", "link", "set", vppEnd, "up")
	run(t, "ip", "link", "set", lnxEnd, "netns", string(ns))
	// The Linux node, as felix's vxlan_mgr and vxlanfdb leave it, but for noudpcsum: over a veth the
	// kernel leaves the outer UDP checksum partial (to be completed by a NIC), and VPP's af_packet
	// interface then either drops the packets (bad udp checksum, without its checksum offload) or, with
	// it, sends the replies it forwards with a bad UDP checksum (UdpInCsumErrors here). A real NIC
	// completes the checksum; a zero one is valid for IPv4.
	inNS("ip", "link", "set", "lo", "up")
	inNS("ip", "addr", "add", lnxIP+"/24", "dev", lnxEnd)
	inNS("ip", "link", "set", lnxEnd, "up")
	inNS("ip", "link", "add", "vxlan.calico", "address", lnxMAC.String(), "type", "vxlan", "id", "4096", "dstport", "4789",
		"local", lnxIP, "dev", lnxEnd, "nolearning", "noudpcsum")
	inNS("ip", "link", "set", "vxlan.calico", "up")
	inNS("ip", "addr", "add", lnxVTEP+"/32", "dev", "vxlan.calico")
	inNS("ip", "neigh", "add", vppVTEP, "lladdr", vppMAC.String(), "dev", "vxlan.calico", "nud", "permanent")
	inNS("bridge", "fdb", "add", vppMAC.String(), "dev", "vxlan.calico", "dst", vppIP, "self", "permanent")
	inNS("ip", "route", "add", "10.244.1.0/26", "via", vppVTEP, "dev", "vxlan.calico", "onlink")
	inNS("ip", "addr", "add", lnxPod+"/32", "dev", "lo")

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "vl")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	uplinkName := "host-" + vppEnd
	p, err := vppproc.Start(ctx, bin, vppproc.Options{Dir: filepath.Join(dir, "vpp"), InterruptMode: true, HeapMB: 128,
		Plugins: []string{"af_packet_plugin.so", "ping_plugin.so", vpptopo.VXLANPlugin},
		Setup: []string{
			"create host-interface name " + vppEnd,
			"create loopback interface instance 1",
			"set interface state loop1 up",
			"set interface ip address loop1 " + vppPod + "/32",
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	h := start(t, p.Socket(), func(c *vppapi.Config) { c.ReplyTimeout = vppapi.DefaultReplyTimeout })
	h.expect(vppapi.Connected)
	var uplink uint32
	for deadline := time.Now().Add(30 * time.Second); ; {
		if uplink, err = h.c.SetupUplink(ctx, vppapi.Uplink{Name: uplinkName, Addresses: []netip.Prefix{pfx(vppIP + "/24")}}); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("uplink %s: %v", uplinkName, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	tun, err := h.c.EnsureVXLANTunnel(ctx, vppapi.VXLANSpec{Src: addr(vppIP), Dst: addr(lnxIP), VNI: vppapi.DefaultVXLANVNI,
		Port: vppapi.DefaultVXLANPort, MAC: vppMAC, Unnumbered: uplink, MTU: 1450})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.c.EnsureNeighbor(ctx, tun, addr(lnxVTEP), lnxMAC); err != nil {
		t.Fatal(err)
	}
	if res := h.c.Apply(ctx, []vppapi.Route{{Prefix: pfx("10.244.3.0/26"), NextHop: addr(lnxVTEP), SwIfIndex: tun}}, nil); res.Err() != nil {
		t.Fatal(res.Err())
	}

	results, ok, err := vpptopo.PingUntil(ctx, p, "loop1", addr(lnxPod), 3, 2, 5)
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		t.Errorf("VPP pod -> Linux pod %s: %v, want replies", lnxPod, results)
	}
	_, _ = p.CLI(ctx, "trace add af-packet-input 20")
	// Linux -> VPP: an ICMP echo from the namespace (no ping binary needed).
	var replies int
	for range 5 {
		if replies, err = vpptopo.PingFromNetns(string(ns), addr(lnxPod), addr(vppPod), 3); err != nil {
			t.Fatal(err)
		}
		if replies >= 2 {
			break
		}
	}
	if replies < 2 {
		t.Errorf("Linux pod -> VPP pod %s: %d of 3 echoes answered", vppPod, replies)
	}
	if t.Failed() {
		t.Logf("vxlan.calico: %s", inNS("ip", "-s", "link", "show", "vxlan.calico"))
		t.Logf("lnx: %s", inNS("ip", "-s", "link", "show", lnxEnd))
		t.Logf("nstat: %s", inNS("nstat", "-az"))
		for _, cmd := range []string{"show interface", "show errors", "show ip neighbors", "show trace"} {
			out, _ := p.CLI(ctx, cmd)
			t.Logf("VPP %s: %s", cmd, out)
		}
	}
}
