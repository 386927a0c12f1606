package calicointerop_test

import (
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/cni/ipamd"
	"github.com/vpp-route-agent/vpp-route-agent/internal/metricstest"
)

// ipamShowRow is one row of calicoctl ipam show's table.
type ipamShowRow struct {
	grouping string
	cidr     netip.Prefix
	total    float64
	inUse    float64
	free     float64
}

// parseIPAMShow reads the rows of `calicoctl ipam show [--show-blocks]`: GROUPING | CIDR | IPS TOTAL |
// IPS IN USE (with a percentage) | IPS FREE (with a percentage).
func parseIPAMShow(t *testing.T, out string) []ipamShowRow {
	t.Helper()
	var rows []ipamShowRow
	for _, line := range strings.Split(out, "\n") {
		f := strings.Split(line, "|")
		if len(f) != 7 {
			continue
		}
		cidr, err := netip.ParsePrefix(strings.TrimSpace(f[2]))
		if err != nil {
			continue // the header
		}
		num := func(s string) float64 {
			s, _, _ = strings.Cut(strings.TrimSpace(s), " ")
			v, err := strconv.ParseFloat(s, 64)
			if err != nil {
				t.Fatalf("calicoctl ipam show: %q in %q: %v", s, line, err)
			}
			return v
		}
		rows = append(rows, ipamShowRow{grouping: strings.TrimSpace(f[1]), cidr: cidr, total: num(f[3]), inUse: num(f[4]), free: num(f[5])})
	}
	if len(rows) == 0 {
		t.Fatalf("no rows in calicoctl ipam show's output:\n%s", out)
	}
	return rows
}

// TestCapacityMatchesIPAMShow: with blocks of calico-ipam and block-ipam, a pool with no block left
// to claim, addresses borrowed from another node's block and an IPReservation, every capacity gauge
// calicoctl shows a number for equals it: the pool's IPS TOTAL and IPS IN USE, its blocks (rows,
// addresses, in use and free: no reservation falls in a block), the borrowed addresses of
// --show-borrowed, and a node's own gauges against the rows of its blocks.
func TestCapacityMatchesIPAMShow(t *testing.T) {
	w := newWorld(t)
	// 4 blocks of 16 in the pool; a spare pool no ADD chooses (Manual), a block of it reserved whole.
	w.apply(poolRes("pool", "10.110.0.0/26", 28, ""), poolRes("spare", "10.111.0.0/24", 26, `,"assignmentMode":"Manual"`),
		nodeRes("nodea", nil), nodeRes("nodeb", nil), nodeRes("nodec", nil), nodeRes("noded", nil),
		`{"apiVersion":"projectcalico.org/v3","kind":"IPReservation","metadata":{"name":"r"},"spec":{"reservedCIDRs":["10.111.0.64/26"]}}`)
	// Three nodes claim a block each, then nodea claims the last and borrows once it is full.
	w.run([]op{{p: calicoIPAM, node: "nodeb", cid: "b0", f: v4only}, {p: blockIPAM, node: "nodec", cid: "c0", f: v4only},
		{p: calicoIPAM, node: "noded", cid: "d0", f: v4only}})
	w.run(batch(false, blockIPAM, "nodea", "a", 18, v4only))
	w.syncEndpoints()
	w.check()

	poolOut := w.calicoctl("", "ipam", "show", "--show-blocks")
	t.Logf("calicoctl ipam show --show-blocks:\n%s", poolOut)
	borrowedOut := w.calicoctl("", "ipam", "show", "--show-borrowed")
	t.Logf("calicoctl ipam show --show-borrowed:\n%s", borrowedOut)

	reg := prometheus.NewRegistry()
	c := ipamd.NewCapacity(ipamd.CapacityConfig{Client: w.cli, Node: "nodea", Leader: func() bool { return true }}, reg)
	if err := c.Refresh(t.Context(), true); err != nil {
		t.Fatal(err)
	}
	gauge := func(name string, labels ...string) float64 { return metricstest.Value(t, reg, name, labels...) }

	snap := w.snapshot()
	var blocks, blockAddrs, blockInUse, blockFree, nodeaInUse, nodeaFree, nodeaBlocks float64
	pools := map[netip.Prefix]ipamShowRow{}
	for _, r := range parseIPAMShow(t, poolOut) {
		switch r.grouping {
		case "IP Pool":
			pools[r.cidr] = r
		case "Block":
			if !netip.MustParsePrefix("10.110.0.0/26").Contains(r.cidr.Addr()) {
				continue
			}
			blocks++
			blockAddrs += r.total
			blockInUse += r.inUse
			blockFree += r.free
			if b := snap.Blocks[r.cidr]; b != nil && calico.OwnerOf(b, false).Node == "nodea" {
				nodeaBlocks++
				nodeaInUse += r.inUse
				nodeaFree += r.free
			}
		}
	}
	for name, cidr := range map[string]string{"pool": "10.110.0.0/26", "spare": "10.111.0.0/24"} {
		r, ok := pools[netip.MustParsePrefix(cidr)]
		if !ok {
			t.Fatalf("calicoctl ipam show has no row for pool %s", cidr)
		}
		l := []string{"pool", name, "family", "ipv4"}
		if g := gauge("block_ipam_pool_addresses", l...); g != r.total {
			t.Errorf("pool %s: block_ipam_pool_addresses %v, IPS TOTAL %v", name, g, r.total)
		}
		if g := gauge("block_ipam_pool_allocated_addresses", l...); g != r.inUse {
			t.Errorf("pool %s: block_ipam_pool_allocated_addresses %v, IPS IN USE %v", name, g, r.inUse)
		}
	}
	l := []string{"pool", "pool", "family", "ipv4"}
	for _, c := range []struct {
		gauge string
		show  float64
		what  string
	}{
		{"block_ipam_pool_blocks", blocks, "block rows"},
		{"block_ipam_pool_block_addresses", blockAddrs, "the blocks' IPS TOTAL"},
		{"block_ipam_pool_allocated_addresses", blockInUse, "the blocks' IPS IN USE"},
		{"block_ipam_pool_free_block_addresses", blockFree, "the blocks' IPS FREE"},
	} {
		if g := gauge(c.gauge, l...); g != c.show {
			t.Errorf("%s %v, %s %v", c.gauge, g, c.what, c.show)
		}
	}
	if blocks != 4 {
		t.Errorf("calicoctl shows %v blocks in the pool, want all 4 claimed", blocks)
	}
	if g := gauge("block_ipam_pool_claimable_blocks", l...); g != 0 {
		t.Errorf("block_ipam_pool_claimable_blocks %v with every block claimed", g)
	}
	// The spare pool: 4 blocks, one reserved whole, none claimed.
	if g := gauge("block_ipam_pool_claimable_blocks", "pool", "spare"); g != 3 {
		t.Errorf("spare pool: block_ipam_pool_claimable_blocks %v, want 3 (4 less 1 reserved)", g)
	}
	if g := gauge("block_ipam_pool_reserved_addresses", "pool", "spare"); g != 64 {
		t.Errorf("spare pool: block_ipam_pool_reserved_addresses %v, want 64", g)
	}
	borrowed := 0.0
	for _, line := range strings.Split(borrowedOut, "\n") {
		if f := strings.Split(line, "|"); len(f) > 2 {
			if _, err := netip.ParseAddr(strings.TrimSpace(f[1])); err == nil {
				borrowed++
			}
		}
	}
	if g := gauge("block_ipam_pool_borrowed_addresses", l...); g != borrowed || borrowed != 2 {
		t.Errorf("block_ipam_pool_borrowed_addresses %v, --show-borrowed lists %v (want 2)", g, borrowed)
	}
	nl := []string{"node", "nodea", "pool", "pool"}
	for name, want := range map[string]float64{
		"block_ipam_node_blocks":              nodeaBlocks,
		"block_ipam_node_allocated_addresses": nodeaInUse,
		"block_ipam_node_free_addresses":      nodeaFree,
	} {
		if g := gauge(name, nl...); g != want {
			t.Errorf("%s{node=nodea} %v, calicoctl's rows of nodea's blocks say %v", name, g, want)
		}
	}
}
