package e2e

import (
	"maps"
	"net/netip"
	"testing"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/internal/calicotest"
	"github.com/vpp-route-agent/vpp-route-agent/internal/vpptest"
)

// TestSourceGoneWithdrawn, on the simulator and on real VPP: a /0 pool with a /0 block owned by a
// remote node gives no default route (a block of prefix length 0 never becomes one), while a block of
// that pool does get its route; deleting the pools withdraws the routes the agent programmed in them,
// and leaves the others and VPP's own default route alone.
func TestSourceGoneWithdrawn(t *testing.T) {
	c := newCluster(t)
	blocks := remoteCluster(c, 2, 4)
	c.putPool("everything", "0.0.0.0/0", 26)
	c.put(calico.BlockKey(netip.MustParsePrefix("0.0.0.0/0")),
		`{"cidr":"0.0.0.0/0","affinity":"host:`+remoteNode(0)+`","allocations":[],"unallocated":[],"attributes":[]}`)
	extra := netip.MustParsePrefix("172.20.1.0/26")
	if err := calicotest.PutBlock(c.ctx(), c.cli, calicotest.Block(extra, remoteNode(1), 0)); err != nil {
		t.Fatal(err)
	}
	v := vpptest.New(t, vpptest.Options{})
	a := startAgent(t, agentConfig{node: "node-self", etcd: c.etcd.Endpoint(), socket: v.Socket(), uplink: selfAddr, uplinkIf: v.Uplink()})
	a.waitReady(20 * time.Second)
	all := netip.MustParsePrefix("0.0.0.0/0")
	want := wantRoutes(blocks, 2)
	// waitAPIRoutes waits until VPP's API routes anywhere are exactly want.
	waitAPIRoutes := func(what string, want map[netip.Prefix]netip.Addr) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			got := v.APIRoutes(all)
			if maps.Equal(got, want) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: API routes %v, want %v", what, got, want)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	want[extra] = remotePeer(1)
	waitAPIRoutes("with the /0 pool", want)
	if nh, ok := v.APIRoutes(all)[all]; ok {
		t.Fatalf("a default route via %s was programmed from the /0 block", nh)
	}

	if _, err := c.cli.Delete(c.ctx(), calico.IPPoolKey("everything")); err != nil {
		t.Fatal(err)
	}
	delete(want, extra)
	waitAPIRoutes("after the /0 pool was deleted", want)
	if msg := vppFIB(v, wantRoutes(blocks, 2)); msg != "" {
		t.Error(msg)
	}
	a.stop()
}
