package agent_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"testing"
	"time"

	"go.fd.io/govpp/binapi/ip"

	"github.com/vpp-route-agent/vpp-route-agent/agent"
	"github.com/vpp-route-agent/vpp-route-agent/blockwatch"
	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/test/vppsim"
	"github.com/vpp-route-agent/vpp-route-agent/vppapi"
)

// listingSource is a Source whose parts and snapshots the test hands out.
type listingSource struct {
	updates chan *blockwatch.Snapshot
	listing chan *blockwatch.Listed
}

func (s *listingSource) Updates() <-chan *blockwatch.Snapshot { return s.updates }
func (s *listingSource) Listing() <-chan *blockwatch.Listed   { return s.listing }
func (s *listingSource) Status() blockwatch.Status            { return blockwatch.Status{Synced: true} }
func (s *listingSource) Relist()                              {}

// TestProgramsWhileListing: the parts of the first list are programmed before its Full snapshot, as
// adds of routes VPP does not have; a route of the agent's that etcd no longer has, and one via a
// stale next hop, are left alone until the Full snapshot, whose resync then fixes them, and what
// changed after the list, without dumping the table again.
func TestProgramsWhileListing(t *testing.T) {
	dir := t.TempDir()
	sim, err := vppsim.New(vppsim.Config{Interfaces: []string{uplinkName}})
	if err != nil {
		t.Fatal(err)
	}
	sock := dir + "/vpp.sock"
	if err := sim.Listen(sock); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	var uplink uint32
	for _, i := range sim.Interfaces() {
		if i.Name == uplinkName {
			uplink = i.SwIfIndex
		}
	}
	pool := netip.MustParsePrefix("10.0.0.0/8")
	b := netip.MustParseAddr("192.168.100.2")
	stale, moved := netip.MustParsePrefix("10.9.0.0/26"), netip.MustParsePrefix("10.1.0.0/26")
	for p, via := range map[netip.Prefix]string{stale: "192.168.100.2", moved: "192.168.100.9"} {
		if err := sim.AddRoute(vppsim.Route{Prefix: p, Paths: []vppsim.Path{{NextHop: netip.MustParseAddr(via), SwIfIndex: uplink}}}); err != nil {
			t.Fatal(err)
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo}))
	vpp, err := vppapi.New(vppapi.Config{Socket: sock, ReplyTimeout: time.Second, ReconnectDelay: 50 * time.Millisecond, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	src := &listingSource{updates: make(chan *blockwatch.Snapshot, 1), listing: make(chan *blockwatch.Listed, 1)}
	a, err := agent.New(agent.Config{NodeName: "a", Pools: []netip.Prefix{pool}, Uplink: vppapi.Uplink{Name: uplinkName},
		SyncTimeout: 10 * time.Second, Logger: log}, vpp, src, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{}, 2)
	go func() { vpp.Run(ctx); done <- struct{}{} }()
	go func() { a.Run(ctx); done <- struct{}{} }()
	defer func() { cancel(); <-done; <-done }()

	block := func(cidr netip.Prefix) *blockwatch.Block {
		return &blockwatch.Block{CIDR: cidr, Owner: calico.Owner{Kind: calico.OwnerHost, Node: "b"}}
	}
	peers := map[string]blockwatch.Peer{"b": {IPv4: b, IPv4Created: 2, IPv4Leased: true}}
	var blocks []*blockwatch.Block
	for i := range 3 {
		blocks = append(blocks, block(netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(1 + i), 0, 0}), 26)))
	}
	fib := func() []string {
		var out []string
		for _, r := range sim.APIRoutes(0) {
			if pool.Contains(r.Prefix.Addr()) {
				out = append(out, fmt.Sprintf("%s via %s", r.Prefix, r.Paths[0].NextHop))
			}
		}
		return out
	}
	waitFIB := func(want ...string) {
		t.Helper()
		deadline := time.Now().Add(settle)
		for !slices.Equal(fib(), want) {
			if time.Now().After(deadline) {
				t.Fatalf("FIB %q, want %q", fib(), want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	// Whether VPP is up before the first part or connects after it, the parts are programmed as they come.
	for i, part := range [][]*blockwatch.Block{blocks[:2], blocks[2:]} {
		src.listing <- &blockwatch.Listed{Revision: 7, Blocks: part, Peers: peers}
		want := []string{"10.1.0.0/26 via 192.168.100.9", "10.2.0.0/26 via 192.168.100.2", "10.9.0.0/26 via 192.168.100.2"}
		if i == 1 {
			want = slices.Insert(want, 2, "10.3.0.0/26 via 192.168.100.2")
		}
		waitFIB(want...)
	}
	dumps := sim.CountRequests("ip_route_v2_dump")
	for _, r := range sim.Requests() {
		if m, ok := r.Msg.(*ip.IPRouteAddDel); ok && (!m.IsAdd || m.Route.Prefix.String() == moved.String()) {
			t.Errorf("while listing: %+v", m)
		}
	}

	// The Full snapshot, folded with changes made after the list (a node registered, a block moved to
	// it, a block created): the stale route goes, the moved ones are replaced, the new one is added;
	// the table is not dumped again.
	c := netip.MustParseAddr("192.168.100.3")
	moved3 := &blockwatch.Block{CIDR: blocks[2].CIDR, Owner: calico.Owner{Kind: calico.OwnerHost, Node: "c"}}
	created := &blockwatch.Block{CIDR: netip.MustParsePrefix("10.4.0.0/26"), Owner: calico.Owner{Kind: calico.OwnerHost, Node: "c"}}
	src.updates <- &blockwatch.Snapshot{Revision: 9, Full: true, RelistReason: blockwatch.ReasonInitial,
		Blocks: blockwatch.BlocksOf(map[netip.Prefix]*blockwatch.Block{blocks[0].CIDR: blocks[0], blocks[1].CIDR: blocks[1],
			moved3.CIDR: moved3, created.CIDR: created}),
		Peers: map[string]blockwatch.Peer{"b": peers["b"], "c": {IPv4: c, IPv4Created: 8, IPv4Leased: true}}}
	waitFIB("10.1.0.0/26 via 192.168.100.2", "10.2.0.0/26 via 192.168.100.2", "10.3.0.0/26 via 192.168.100.3", "10.4.0.0/26 via 192.168.100.3")
	for deadline := time.Now().Add(settle); !a.Resynced(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no full resync")
		}
	}
	if n := sim.CountRequests("ip_route_v2_dump"); n != dumps {
		t.Errorf("the first full resync dumped the table again (%d dumps, %d while listing)", n, dumps)
	}
}
