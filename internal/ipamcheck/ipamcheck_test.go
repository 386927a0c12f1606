package ipamcheck

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
)

// world builds a consistent datastore: node1's block with two allocations of handle h1 and one of
// h2 (borrowed by node2), and node2's block.
func world(t *testing.T) map[string][]byte {
	t.Helper()
	kvs := map[string][]byte{}
	put := func(key string, v []byte, err error) {
		if err != nil {
			t.Fatal(err)
		}
		kvs[key] = v
	}
	h1, h2 := "net.h1", "net.h2"
	b1 := calico.NewBlock(netip.MustParsePrefix("10.0.0.0/29"), "host:node1", 1)
	b1.AutoAssign(2, calico.AllocationAttribute{HandleID: &h1, Secondary: map[string]string{"node": "node1"}}, nil)
	b1.AutoAssign(1, calico.AllocationAttribute{HandleID: &h2, Secondary: map[string]string{"node": "node2"}}, nil)
	b2 := calico.NewBlock(netip.MustParsePrefix("10.0.0.8/29"), "host:node2", 1)
	for _, b := range []*calico.Block{b1, b2} {
		data, err := calico.EncodeBlock(b)
		put(calico.BlockKey(b.CIDR), data, err)
		aff, err := calico.EncodeAffinity(calico.AffinityValue{State: calico.AffinityConfirmed})
		put(calico.HostAffinityKey(strings.TrimPrefix(*b.Affinity, "host:"), b.CIDR), aff, err)
	}
	for id, n := range map[string]int{h1: 2, h2: 1} {
		h := calico.NewHandle()
		h.Add(b1.CIDR, n)
		data, err := calico.EncodeHandle(h)
		put(calico.HandleKey(id), data, err)
	}
	return kvs
}

func check(t *testing.T, kvs map[string][]byte, opts Options) error {
	t.Helper()
	s, err := Parse(kvs)
	if err != nil {
		return err
	}
	return s.Check(opts)
}

func TestConsistentWorld(t *testing.T) {
	kvs := world(t)
	if err := check(t, kvs, Options{}); err != nil {
		t.Fatal(err)
	}
	s, _ := Parse(kvs)
	if len(s.Allocations) != 3 || s.Allocations[2].Node != "node2" || s.Allocations[2].Owner != "node1" {
		t.Fatalf("allocations %+v", s.Allocations)
	}
}

// TestViolations breaks the consistent world one way at a time; the checker must name each.
func TestViolations(t *testing.T) {
	block := func(kvs map[string][]byte, cidr string, mutate func(*calico.Block)) {
		key := calico.BlockKey(netip.MustParsePrefix(cidr))
		b, _ := calico.DecodeBlock(kvs[key])
		mutate(b)
		kvs[key], _ = calico.EncodeBlock(b)
	}
	tests := []struct {
		name    string
		corrupt func(map[string][]byte)
		want    string
	}{
		{"block invariant", func(kvs map[string][]byte) {
			block(kvs, "10.0.0.0/29", func(b *calico.Block) { b.Unallocated = append(b.Unallocated, 0) })
		}, "invariant broken"},
		{"overlapping blocks", func(kvs map[string][]byte) {
			b := calico.NewBlock(netip.MustParsePrefix("10.0.0.8/30"), "", 1)
			kvs[calico.BlockKey(b.CIDR)], _ = calico.EncodeBlock(b)
		}, "overlap"},
		{"handle count too high", func(kvs map[string][]byte) {
			h := calico.NewHandle()
			h.Add(netip.MustParsePrefix("10.0.0.0/29"), 3)
			kvs[calico.HandleKey("net.h1")], _ = calico.EncodeHandle(h)
		}, "handle net.h1 counts 3"},
		{"allocation without handle", func(kvs map[string][]byte) {
			delete(kvs, calico.HandleKey("net.h2"))
		}, "which does not count them"},
		{"empty handle", func(kvs map[string][]byte) {
			kvs[calico.HandleKey("net.h9")], _ = calico.EncodeHandle(calico.NewHandle())
		}, "holds nothing"},
		{"pending affinity", func(kvs map[string][]byte) {
			kvs[calico.HostAffinityKey("node1", netip.MustParsePrefix("10.0.0.0/29"))] = []byte(`{"state":"pending","deleted":false}`)
		}, "not confirmed"},
		{"affinity without block", func(kvs map[string][]byte) {
			kvs[calico.HostAffinityKey("node3", netip.MustParsePrefix("10.0.1.0/29"))] = []byte(`{"state":"confirmed","deleted":false}`)
		}, "has no block"},
		{"block without affinity", func(kvs map[string][]byte) {
			delete(kvs, calico.HostAffinityKey("node2", netip.MustParsePrefix("10.0.0.8/29")))
		}, "without a confirmed affinity"},
		{"undecodable block", func(kvs map[string][]byte) {
			kvs[calico.BlockKey(netip.MustParsePrefix("10.0.2.0/29"))] = []byte("{")
		}, "decode block"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			kvs := world(t)
			tc.corrupt(kvs)
			err := check(t, kvs, Options{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to mention %q", err, tc.want)
			}
		})
	}
	// Real Calico data may hold stale affinities: the options accept them.
	kvs := world(t)
	kvs[calico.HostAffinityKey("node1", netip.MustParsePrefix("10.0.0.0/29"))] = []byte(`{"state":"pending","deleted":false}`)
	if err := check(t, kvs, Options{AllowStaleAffinities: true, AllowMissingAffinities: true}); err != nil {
		t.Fatalf("with stale affinities allowed: %v", err)
	}
}
