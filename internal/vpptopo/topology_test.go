package vpptopo

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/internal/vpptest"
)

// startLab starts a topology of cfg for t on the lab build (skipping t without one, as make test-vpp
// without VPP_LAB_PKG does); it stops with the test.
func startLab(t *testing.T, cfg Config) *Topology {
	t.Helper()
	bin, err := FindLab()
	switch {
	case !vpptest.Real():
		t.Skip("needs real VPP: " + vpptest.EnvBackend + "=real and " + EnvLabPackage + " (make test-vpp)")
	case errors.Is(err, ErrNoLab):
		t.Skip(err.Error())
	case err != nil:
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "vt")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg.Dir = dir
	start := time.Now()
	topo, err := Start(ctx, bin, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(topo.Stop)
	t.Logf("%s topology of %d nodes linked in %s", cfg.Kind, cfg.Nodes, time.Since(start).Round(time.Millisecond))
	return topo
}

// TestDualHomed: three dual-homed nodes. Every node address answers node-1 over the fabric it is on,
// IPv4 and IPv6, and the pods are on the nodes' loopbacks; a route of node-2's blocks over both fabrics
// forwards by both (Forwarding), a drop route by none. node-2's port on fabric A down: its fabric-A
// address answers nobody while both memif ends stay linked and node-1 still forwards over both paths (a
// silent failure), and its fabric-B address still answers; the port up again, it answers. node-1's own
// fabric-B interface down: that path leaves forwarding, and is back with the interface. node-2's own
// fabric-B interface down: that address answers nobody; up again, it answers. node-2's VPP killed:
// neither address answers; restarted, both answer.
func TestDualHomed(t *testing.T) {
	topo := startLab(t, Config{Kind: DualHomed, Nodes: 3, Pods: 2})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	n1, n2 := topo.Nodes[0], topo.Nodes[1]
	if len(topo.Switches) != 2 || topo.Switch != topo.Switches[0] {
		t.Fatalf("switches %v, switch %v: want fabrics A and B", topo.Switches, topo.Switch)
	}
	// check pings node to's address on uplink k from node-1's uplink k, both families: want true waits
	// out ARP and ND (PingUntil) for answers, want false needs silence.
	check := func(what string, to *Node, k int, want bool) {
		t.Helper()
		for _, ipv6 := range []bool{false, true} {
			dst := to.Uplinks[k].Addr(ipv6)
			var (
				results []PingResult
				ok      bool
				err     error
			)
			if want {
				results, ok, err = PingUntil(ctx, n1.VPP, n1.Uplinks[k].Interface, dst, 3, 2, 5)
			} else {
				var r PingResult
				r, err = Ping(ctx, n1.VPP, n1.Uplinks[k].Interface, dst, 3)
				results, ok = []PingResult{r}, r.Received > 0
			}
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: %s -> %s %s: %v", what, n1.Name, to.Name, dst, results)
			if ok != want {
				t.Errorf("%s: %s's %s answered %s: %v, want answered %v", what, to.Name, dst, n1.Name, results, want)
			}
		}
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	cli := func(n *Node, cmd string) {
		t.Helper()
		_, err := n.VPP.CLI(ctx, cmd)
		must(err)
	}
	for _, to := range topo.Nodes[1:] {
		for k := range to.Uplinks {
			check("all links up", to, k, true)
		}
	}
	for _, n := range topo.Nodes {
		out, err := n.VPP.CLI(ctx, "show interface address "+PodInterface)
		if err != nil {
			t.Fatal(err)
		}
		for j := range n.Pods4 {
			if !strings.Contains(out, n.Pods4[j].String()+"/32") || !strings.Contains(out, n.Pods6[j].String()+"/128") {
				t.Errorf("%s's %s lacks pod %s or %s:\n%s", n.Name, PodInterface, n.Pods4[j], n.Pods6[j], out)
			}
		}
	}

	// node-1 routes node-2's blocks over both fabrics (as an agent with two uplinks does), and a prefix
	// to drop. forwarding checks what those routes forward by.
	drop := netip.MustParsePrefix("10.99.0.0/24")
	for _, ipv6 := range []bool{false, true} {
		block := n2.Block4
		if ipv6 {
			block = n2.Block6
		}
		for k, u := range n2.Uplinks {
			cli(n1, fmt.Sprintf("ip route add %s via %s %s", block, u.Addr(ipv6), n1.Uplinks[k].Interface))
		}
	}
	cli(n1, "ip route add "+drop.String()+" via drop")
	forwarding := func(what string, p netip.Prefix, want ...netip.Addr) {
		t.Helper()
		got, err := n1.Forwarding(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s: %s's %s forwards via %v, want %v", what, n1.Name, p, got, want)
		}
	}
	both := func(ipv6 bool) []netip.Addr { return []netip.Addr{n2.Uplinks[0].Addr(ipv6), n2.Uplinks[1].Addr(ipv6)} }
	forwarding("all links up", n2.Block4, both(false)...)
	forwarding("all links up", n2.Block6, both(true)...)
	forwarding("a drop route", drop)

	mustLinked := func(what string) {
		t.Helper()
		for _, n := range []*Node{n1, n2} {
			for k := range n.Uplinks {
				if up, err := n.LinkUp(ctx, k); err != nil || !up {
					t.Errorf("%s: %s's %s linked %v (%v), want linked", what, n.Name, n.Uplinks[k].Interface, up, err)
				}
			}
		}
	}
	must(topo.SetSwitchPort(ctx, n2, 0, false))
	check("node-2's fabric-A port down", n2, 0, false)
	check("node-2's fabric-A port down", n2, 1, true)
	mustLinked("node-2's fabric-A port down")
	// node-1 cannot tell: both paths stay in forwarding.
	forwarding("node-2's fabric-A port down", n2.Block4, both(false)...)
	must(topo.SetSwitchPort(ctx, n2, 0, true))
	check("node-2's fabric-A port up again", n2, 0, true)

	// node-1's own fabric-B interface down: the path through it leaves forwarding.
	must(n1.SetUplink(ctx, 1, false))
	forwarding("node-1's fabric-B interface down", n2.Block4, n2.Uplinks[0].Addr(false))
	forwarding("node-1's fabric-B interface down", n2.Block6, n2.Uplinks[0].Addr(true))
	must(n1.SetUplink(ctx, 1, true))
	forwarding("node-1's fabric-B interface up again", n2.Block4, both(false)...)

	must(n2.SetUplink(ctx, 1, false))
	check("node-2's fabric-B interface down", n2, 1, false)
	check("node-2's fabric-B interface down", n2, 0, true)
	must(n2.SetUplink(ctx, 1, true))
	check("node-2's fabric-B interface up again", n2, 1, true)

	must(n2.Kill())
	for k := range n2.Uplinks {
		check("node-2's VPP killed", n2, k, false)
	}
	start := time.Now()
	must(n2.Restart(ctx))
	t.Logf("node-2's VPP restarted and linked in %s", time.Since(start).Round(time.Millisecond))
	for k := range n2.Uplinks {
		check("node-2's VPP restarted", n2, k, true)
	}
	mustLinked("node-2's VPP restarted")
}
