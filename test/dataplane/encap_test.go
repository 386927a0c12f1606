package dataplane

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.fd.io/govpp/api"
	interfaces "go.fd.io/govpp/binapi/interface"
	"go.fd.io/govpp/binapi/interface_types"
	"go.fd.io/govpp/binapi/ip_types"
	"go.fd.io/govpp/binapi/ipip"

	"github.com/vpp-route-agent/vpp-route-agent/agent"
	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/internal/calicotest"
	"github.com/vpp-route-agent/vpp-route-agent/internal/vppproc"
	"github.com/vpp-route-agent/vpp-route-agent/internal/vpptopo"
)

// setIPIPMode rewrites the IPv4 pool with ipipMode mode (the IPv6 pool keeps Never: IPIP is IPv4-only).
func (c *cluster) setIPIPMode(mode calico.EncapMode) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p := calico.IPPool{Name: "default-ipv4-ippool", CIDR: pool4, BlockSize: 26, IPIPMode: mode}
	if err := calicotest.PutPool(ctx, c.cli, p); err != nil {
		c.t.Fatal(err)
	}
}

// tunnel is an IPIP tunnel of a node's VPP, with its interface tag.
type tunnel struct {
	SwIfIndex uint32
	Src, Dst  netip.Addr
	Tag       string
}

// tunnels returns node n's IPIP tunnels by destination.
func tunnels(t *testing.T, n *vpptopo.Node) map[netip.Addr]tunnel {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out := map[netip.Addr]tunnel{}
	err := n.VPP.Call(ctx, func(ch api.Channel) error {
		tags := map[uint32]string{}
		req := ch.SendMultiRequest(&interfaces.SwInterfaceDump{SwIfIndex: ^interface_types.InterfaceIndex(0)})
		for {
			d := new(interfaces.SwInterfaceDetails)
			last, err := req.ReceiveReply(d)
			if err != nil {
				return err
			}
			if last {
				break
			}
			tags[uint32(d.SwIfIndex)] = d.Tag
		}
		treq := ch.SendMultiRequest(&ipip.IpipTunnelDump{SwIfIndex: ^interface_types.InterfaceIndex(0)})
		for {
			d := new(ipip.IpipTunnelDetails)
			last, err := treq.ReceiveReply(d)
			if err != nil {
				return err
			}
			if last {
				return nil
			}
			tun := tunnel{SwIfIndex: uint32(d.Tunnel.SwIfIndex), Src: addr4(d.Tunnel.Src), Dst: addr4(d.Tunnel.Dst),
				Tag: tags[uint32(d.Tunnel.SwIfIndex)]}
			out[tun.Dst] = tun
		}
	})
	if err != nil {
		t.Fatalf("%s: dump tunnels: %v", n.Name, err)
	}
	return out
}

func addr4(a ip_types.Address) netip.Addr {
	if a.Af == ip_types.ADDRESS_IP6 {
		return netip.AddrFrom16(a.Un.GetIP6())
	}
	return netip.AddrFrom4(a.Un.GetIP4())
}

// encapRoutes returns node n's API routes inside the pools as "via <next hop>" or "tunnel <dst>" (the
// path goes through an IPIP tunnel, without a next hop).
func encapRoutes(t *testing.T, n *vpptopo.Node) map[netip.Prefix]string {
	t.Helper()
	byIndex := map[uint32]netip.Addr{}
	for dst, tun := range tunnels(t, n) {
		byIndex[tun.SwIfIndex] = dst
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	routes, err := n.VPP.Routes(ctx, vppproc.SourceAPI)
	if err != nil {
		t.Fatalf("%s: %v", n.Name, err)
	}
	out := map[netip.Prefix]string{}
	for _, r := range routes {
		if !pool4.Contains(r.Prefix.Addr()) && !pool6.Contains(r.Prefix.Addr()) || len(r.Paths) == 0 {
			continue
		}
		p := r.Paths[0]
		if dst, ok := byIndex[p.SwIfIndex]; ok && !p.NextHop.IsValid() {
			out[r.Prefix] = "tunnel " + dst.String()
		} else {
			out[r.Prefix] = "via " + p.NextHop.String()
		}
	}
	return out
}

// wantEncap is what node n's agent must program with the IPv4 pool in mode ipip: every other node's
// IPv6 block flat; its IPv4 block through a tunnel to its address (Always, or CrossSubnet towards
// another subnet), else flat.
func wantEncap(topo *vpptopo.Topology, n *vpptopo.Node, mode calico.EncapMode) map[netip.Prefix]string {
	want := map[netip.Prefix]string{}
	for _, m := range topo.Nodes {
		if m == n {
			continue
		}
		want[m.Block6] = "via " + m.Addr6.Addr().String()
		tunneled := mode == calico.EncapAlways || mode == calico.EncapCrossSubnet && !sameSubnet(n, m)
		if tunneled {
			want[m.Block4] = "tunnel " + m.Addr4.Addr().String()
		} else {
			want[m.Block4] = "via " + m.Addr4.Addr().String()
		}
	}
	return want
}

func sameSubnet(a, b *vpptopo.Node) bool { return a.Addr4.Masked() == b.Addr4.Masked() }

// waitEncap waits until every node programs wantEncap for mode.
func waitEncap(t *testing.T, topo *vpptopo.Topology, mode calico.EncapMode) {
	t.Helper()
	start := time.Now()
	for _, n := range topo.Nodes {
		want := wantEncap(topo, n, mode)
		deadline := time.Now().Add(60 * time.Second)
		for {
			got := encapRoutes(t, n)
			if maps.Equal(got, want) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s's routes (ipipMode %s) after 60s:\n got %v\nwant %v", n.Name, mode, got, want)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	t.Logf("every node's FIB as wanted for ipipMode %s %s after the wait began", mode, time.Since(start).Round(time.Millisecond))
}

// checkEncapPairs pings every pod pair: IPv4 must answer everywhere (the pool encapsulates where it has
// to); IPv6 (flat) answers within a subnet and not across the router.
func checkEncapPairs(t *testing.T, topo *vpptopo.Topology) {
	t.Helper()
	for _, from := range topo.Nodes {
		for _, to := range topo.Nodes {
			if from == to {
				continue
			}
			for _, ipv6 := range []bool{false, true} {
				results, ok := pingPods(t, from, to, ipv6)
				t.Logf("%s -> %s %s pod %s (same subnet %v): %v", from.Name, to.Name, family(ipv6), to.Pod(ipv6), sameSubnet(from, to), results)
				switch {
				case (!ipv6 || sameSubnet(from, to)) && !ok:
					t.Errorf("%s's pod gets no answer from %s's %s pod %s: %v", from.Name, to.Name, family(ipv6), to.Pod(ipv6), results)
				case ipv6 && !sameSubnet(from, to) && received(results) != 0:
					t.Errorf("%s's pod got answers from %s's IPv6 pod %s across the router with a flat route: %v", from.Name, to.Name, to.Pod(ipv6), results)
				}
			}
		}
	}
}

// lossDuring pings to's IPv4 pod from from's pod (400 echoes, 10 ms apart: 4 s) while do runs, 1 s
// into the pings, and returns the result.
func lossDuring(t *testing.T, from, to *vpptopo.Node, do func()) vpptopo.Echoes {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	type res struct {
		e   vpptopo.Echoes
		err error
	}
	ch := make(chan res, 1)
	go func() {
		e, err := vpptopo.PingEvery(ctx, from.VPP, vpptopo.PodInterface, to.Pod4, 400, 10*time.Millisecond)
		ch <- res{e, err}
	}()
	time.Sleep(time.Second)
	do()
	got := <-ch
	if got.err != nil {
		t.Fatalf("%s: %v", from.Name, got.err)
	}
	return got.e
}

// logSize returns the length of node n's agent log (every run of it appends).
func logSize(n *vpptopo.Node) int {
	out, _ := os.ReadFile(filepath.Join(n.VPP.Dir(), "agent.log"))
	return len(out)
}

// waitLog waits until node n's agent log, from offset from on, has line, within 60 s.
func waitLog(t *testing.T, n *vpptopo.Node, from int, line string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		out, _ := os.ReadFile(filepath.Join(n.VPP.Dir(), "agent.log"))
		if len(out) > from && strings.Contains(string(out[from:]), line) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s's agent log has no %q after 60s", n.Name, line)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestRoutedIPIP: the routed topology of TestRoutedPodToPodNeedsEncapsulation (node-1 and node-3 in one
// subnet, node-2 in another), the IPv4 pool's ipipMode edited while the agents run.
//
//   - Never -> Always while node-1's pod pings node-3's (same subnet): every IPv4 route goes through a
//     p2p tunnel per peer, tagged vpp-route-agent; every IPv4 pod pair answers, across the router too;
//     IPv6 (flat, IPIP is IPv4-only) still fails across it. The pings lost during the switch are logged.
//   - node-1's agent restarted while its pod pings node-2's (across the router): its tunnels keep their
//     sw_if_index and its routes are unchanged (nothing deleted and made again); the loss is logged.
//   - An operator's tunnel made with vppctl stays through all of it, also when the agent deletes its own.
//   - Always -> CrossSubnet while node-1's pod pings node-3's: same-subnet routes go flat, cross-subnet
//     ones keep their tunnels, the tunnels of same-subnet peers are deleted; every IPv4 pair answers.
//   - CrossSubnet -> Never: no tunnel of the agent is left; the operator's stays.
func TestRoutedIPIP(t *testing.T) {
	requireLab(t)
	topo := startTopology(t, vpptopo.Routed, 3)
	c := newCluster(t, topo)
	stops := map[*vpptopo.Node]func(){}
	for _, n := range topo.Nodes {
		stops[n] = startAgent(t, c.etcd.Endpoint(), n)
	}
	n1, n2, n3 := topo.Nodes[0], topo.Nodes[1], topo.Nodes[2]
	waitEncap(t, topo, calico.EncapNever)
	if r, ok := pingPods(t, n1, n3, false); !ok {
		t.Fatalf("flat, same subnet: %s's pod gets no answer from %s's: %v", n1.Name, n3.Name, r)
	}

	// An operator's tunnel, to an address that is no node's.
	operatorDst := netip.MustParseAddr("192.168.51.99")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := n1.VPP.CLI(ctx, fmt.Sprintf("create ipip tunnel src %s dst %s", n1.Addr4.Addr(), operatorDst)); err != nil {
		t.Fatalf("vppctl: %v: %s", err, out)
	}
	operator := tunnels(t, n1)[operatorDst]

	loss := lossDuring(t, n1, n3, func() { c.setIPIPMode(calico.EncapAlways) })
	t.Logf("ping loss %s -> %s (same subnet) while ipipMode went Never -> Always: %d of %d lost (%s)",
		n1.Name, n3.Name, loss.Sent-loss.Received, loss.Sent, loss)
	waitEncap(t, topo, calico.EncapAlways)
	for _, n := range topo.Nodes {
		for dst, tun := range tunnels(t, n) {
			if dst == operatorDst {
				continue
			}
			if tun.Tag != agent.TunnelTag || tun.Src != n.Addr4.Addr() {
				t.Errorf("%s: tunnel %+v: want tag %q, source %s", n.Name, tun, agent.TunnelTag, n.Addr4.Addr())
			}
		}
	}
	checkEncapPairs(t, topo)

	// The agent restarted: nothing in VPP changes.
	tunnelsBefore, routesBefore := tunnels(t, n1), encapRoutes(t, n1)
	logFrom := logSize(n1)
	loss = lossDuring(t, n1, n2, func() {
		stops[n1]()
		stops[n1] = startAgent(t, c.etcd.Endpoint(), n1)
	})
	t.Logf("ping loss %s -> %s (across the router, IPIP) while %s's agent restarted: %d of %d lost (%s)",
		n1.Name, n2.Name, n1.Name, loss.Sent-loss.Received, loss.Sent, loss)
	// The restarted agent has read VPP's tunnels and reconciled (it adopts, then resyncs in one turn).
	waitLog(t, n1, logFrom, "adopted the agent's tunnels VPP has")
	waitLog(t, n1, logFrom, "full resync done")
	waitEncap(t, topo, calico.EncapAlways)
	if after := tunnels(t, n1); !maps.Equal(after, tunnelsBefore) {
		t.Errorf("%s's tunnels changed across its agent's restart:\nbefore %v\n after %v", n1.Name, tunnelsBefore, after)
	}
	if after := encapRoutes(t, n1); !maps.Equal(after, routesBefore) {
		t.Errorf("%s's routes changed across its agent's restart:\nbefore %v\n after %v", n1.Name, routesBefore, after)
	}
	// An outage (a route or tunnel rewritten) loses echoes in a row; a lone one lost is the loaded
	// machine (seen once in CI: 399/400, with routes and tunnels unchanged).
	if loss.LongestLoss() > 1 {
		t.Errorf("pings lost while the agent restarted: %s, %d in a row", loss.PingResult, loss.LongestLoss())
	}

	loss = lossDuring(t, n1, n3, func() { c.setIPIPMode(calico.EncapCrossSubnet) })
	t.Logf("ping loss %s -> %s (same subnet) while ipipMode went Always -> CrossSubnet: %d of %d lost (%s)",
		n1.Name, n3.Name, loss.Sent-loss.Received, loss.Sent, loss)
	waitEncap(t, topo, calico.EncapCrossSubnet)
	for _, n := range topo.Nodes {
		var dsts []netip.Addr
		for dst := range tunnels(t, n) {
			if dst != operatorDst {
				dsts = append(dsts, dst)
			}
		}
		var want []netip.Addr
		for _, m := range topo.Nodes {
			if m != n && !sameSubnet(n, m) {
				want = append(want, m.Addr4.Addr())
			}
		}
		slices.SortFunc(dsts, netip.Addr.Compare)
		slices.SortFunc(want, netip.Addr.Compare)
		if !slices.Equal(dsts, want) {
			t.Errorf("%s: tunnels to %v, want to %v (the nodes of the other subnet)", n.Name, dsts, want)
		}
	}
	checkEncapPairs(t, topo)

	c.setIPIPMode(calico.EncapNever)
	waitEncap(t, topo, calico.EncapNever)
	for _, n := range topo.Nodes {
		left := tunnels(t, n)
		if n == n1 {
			if len(left) != 1 || left[operatorDst] != operator {
				t.Errorf("%s: tunnels %v, want only the operator's %+v", n.Name, left, operator)
			}
		} else if len(left) != 0 {
			t.Errorf("%s: tunnels %v left with no pool using IPIP", n.Name, left)
		}
	}
	fib, _ := n1.VPP.CLI(ctx, "show ipip tunnel")
	t.Logf("%s: show ipip tunnel:\n%s", n1.Name, strings.TrimSpace(fib))
}
