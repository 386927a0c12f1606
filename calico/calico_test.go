package calico

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

type testdataFile struct {
	Key   string          `json:"key"`
	Value json.RawMessage `json:"value"`
}

func loadTestdata(t testing.TB, name string) testdataFile {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	var f testdataFile
	if err := json.Unmarshal(raw, &f); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return f
}

func mustPrefix(s string) netip.Prefix { return netip.MustParsePrefix(s) }
func mustAddr(s string) netip.Addr     { return netip.MustParseAddr(s) }

// TestTestdataBlocks decodes every example block Calico has written and checks key, invariants,
// ownership and borrowed addresses against what the example's README says of it.
func TestTestdataBlocks(t *testing.T) {
	tests := []struct {
		file       string
		cidr       string
		owner      Owner
		legacy     Owner // owner with legacyHostAffinity enabled
		borrowed   []Borrowed
		allocated  int
		deleted    bool
		claimTime  bool
		wantHandle string // handle of ordinal 1
	}{
		{file: "mixed-borrowed-v4.json", cidr: "10.244.1.64/26",
			owner: Owner{OwnerHost, "node-a"}, legacy: Owner{OwnerHost, "node-a"},
			borrowed:   []Borrowed{{Ordinal: 4, Addr: mustAddr("10.244.1.68"), Node: "node-b"}},
			allocated:  4,
			wantHandle: "k8s-pod-network.5e0c3f6a9b8d7c6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1"},
		{file: "ipv6-v332.json", cidr: "fd00:10:244:0:8e1f:1a2b:3c4d:5e40/122",
			owner: Owner{OwnerHost, "node-a"}, legacy: Owner{OwnerHost, "node-a"}, allocated: 2, claimTime: true,
			wantHandle: "k8s-pod-network.5e0c3f6a9b8d7c6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1"},
		{file: "legacy-hostaffinity.json", cidr: "192.168.45.0/26",
			owner: Owner{}, legacy: Owner{OwnerLegacyHost, "node-old"}, allocated: 2, wantHandle: "default.frontend-2"},
		{file: "virtual-loadbalancer.json", cidr: "203.0.113.0/26",
			owner: Owner{OwnerVirtual, "load-balancer"}, legacy: Owner{OwnerVirtual, "load-balancer"}, allocated: 1},
		{file: "deleted-kdd.json", cidr: "10.244.9.192/26", owner: Owner{}, legacy: Owner{}, deleted: true},
		// After calico-ipam v3.31 deleted the pod at ordinal 1: its sequence entry stays.
		{file: "ipam/calico-del-stale-seq.json", cidr: "10.50.12.0/26", owner: Owner{OwnerHost, "node-y"}, legacy: Owner{OwnerHost, "node-y"}, allocated: 2},
	}
	for _, tc := range tests {
		t.Run(tc.file, func(t *testing.T) {
			f := loadTestdata(t, tc.file)
			k, err := ParseKey(f.Key)
			if err != nil {
				t.Fatal(err)
			}
			if k.Kind != KindBlock || k.CIDR != mustPrefix(tc.cidr) || k.String() != f.Key {
				t.Fatalf("key %q parsed as %+v (formats %q)", f.Key, k, k.String())
			}
			b, err := DecodeBlock(f.Value)
			if err != nil {
				t.Fatal(err)
			}
			if b.CIDR != k.CIDR {
				t.Errorf("value cidr %s != key cidr %s", b.CIDR, k.CIDR)
			}
			if err := b.Validate(); err != nil {
				t.Errorf("Validate: %v", err)
			}
			if got := OwnerOf(b, false); got != tc.owner {
				t.Errorf("OwnerOf(legacy=false) = %+v, want %+v", got, tc.owner)
			}
			if got := OwnerOf(b, true); got != tc.legacy {
				t.Errorf("OwnerOf(legacy=true) = %+v, want %+v", got, tc.legacy)
			}
			got := BorrowedAddrs(b, OwnerOf(b, true))
			if len(got) != len(tc.borrowed) {
				t.Fatalf("borrowed = %+v, want %+v", got, tc.borrowed)
			}
			for i := range got {
				if got[i] != tc.borrowed[i] {
					t.Errorf("borrowed[%d] = %+v, want %+v", i, got[i], tc.borrowed[i])
				}
			}
			if b.Allocated() != tc.allocated {
				t.Errorf("allocated = %d, want %d", b.Allocated(), tc.allocated)
			}
			if b.Deleted != tc.deleted {
				t.Errorf("deleted = %v", b.Deleted)
			}
			if (b.AffinityClaimTime != nil) != tc.claimTime {
				t.Errorf("affinity_claim_time present = %v", b.AffinityClaimTime != nil)
			}
			if h := b.AttributeOf(1).Handle(); h != tc.wantHandle {
				t.Errorf("handle of ordinal 1 = %q, want %q", h, tc.wantHandle)
			}
		})
	}
}

// TestEncodeBlockCalicoForm checks that a v3.23-v3.31 block re-encodes to exactly the value Calico wrote
// (same fields, same order, same values), and that a v3.32 block keeps its newer fields.
func TestEncodeBlockCalicoForm(t *testing.T) {
	for _, name := range []string{"mixed-borrowed-v4.json", "virtual-loadbalancer.json", "deleted-kdd.json", "ipv6-v332.json"} {
		f := loadTestdata(t, name)
		b, err := DecodeBlock(f.Value)
		if err != nil {
			t.Fatal(err)
		}
		out, err := EncodeBlock(b)
		if err != nil {
			t.Fatal(err)
		}
		var want bytes.Buffer
		if err := json.Compact(&want, f.Value); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(out, want.Bytes()) {
			t.Errorf("%s: re-encoded block differs\n got: %s\nwant: %s", name, out, want.Bytes())
		}
	}
}

func TestLegacyBlockEncodesCurrentForm(t *testing.T) {
	b, err := DecodeBlock(loadTestdata(t, "legacy-hostaffinity.json").Value)
	if err != nil {
		t.Fatal(err)
	}
	out, err := EncodeBlock(b)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"affinity":null`, `"hostAffinity":"node-old"`, `"sequenceNumberForAllocation":{}`} {
		if !strings.Contains(string(out), want) {
			t.Errorf("encoded legacy block lacks %s: %s", want, out)
		}
	}
	if strings.Contains(string(out), "strictAffinity") {
		t.Errorf("encoded block still carries the removed strictAffinity field: %s", out)
	}
}

// TestValidateNamesBrokenInvariant breaks each invariant of a good block in turn.
func TestValidateNamesBrokenInvariant(t *testing.T) {
	good := func() *Block {
		b, err := DecodeBlock(loadTestdata(t, "mixed-borrowed-v4.json").Value)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	idx := func(i int) *int { return &i }
	tests := []struct {
		name   string
		mutate func(b *Block)
		want   string
	}{
		{"short allocations", func(b *Block) { b.Allocations = b.Allocations[:63] }, "len(allocations) = 63, want 64"},
		{"bad attribute index", func(b *Block) { b.Allocations[0] = idx(9) }, "allocations[0] = 9 is not an attribute index"},
		{"both allocated and free", func(b *Block) { b.Unallocated = append(b.Unallocated[:len(b.Unallocated)-1], 0) }, "ordinal 0 is both allocated and unallocated"},
		{"ordinal missing", func(b *Block) { b.Unallocated = b.Unallocated[1:] }, "ordinal 5 is neither allocated nor unallocated"},
		{"free listed twice", func(b *Block) { b.Unallocated = append(b.Unallocated, 5) }, "unallocated ordinal 5 listed twice"},
		{"out of range", func(b *Block) { b.Unallocated = append(b.Unallocated, 64) }, "unallocated ordinal 64 out of range"},
		{"unreferenced attribute", func(b *Block) {
			b.Attributes = append(b.Attributes, AllocationAttribute{})
		}, "attribute 4 is not referenced"},
		{"seq key out of range", func(b *Block) { b.SequenceNumberForAllocation["64"] = 1 }, `key "64" is not an ordinal`},
		{"seq bad key", func(b *Block) { b.SequenceNumberForAllocation["01"] = 1 }, `key "01" is not an ordinal`},
		{"host bits", func(b *Block) { b.CIDR = mustPrefix("10.244.1.65/26") }, "cidr is not canonical"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := good()
			tc.mutate(b)
			err := b.Validate()
			var ie *InvariantError
			if !errors.As(err, &ie) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate() = %v, want an InvariantError containing %q", err, tc.want)
			}
		})
	}
}

func TestNewBlockIsValid(t *testing.T) {
	for _, c := range []string{"10.0.0.0/26", "10.0.0.0/20", "10.0.0.7/32", "fd00::/122", "fd00::/116"} {
		b := NewBlock(mustPrefix(c), "host:n1", 42)
		if err := b.Validate(); err != nil {
			t.Errorf("%s: %v", c, err)
		}
		if len(b.Allocations) != Size(b.CIDR) || b.Unallocated[0] != 0 || *b.Affinity != "host:n1" {
			t.Errorf("%s: unexpected new block %+v", c, b)
		}
	}
}

func TestKeys(t *testing.T) {
	valid := []struct {
		key  string
		want Key
	}{
		{"/calico/ipam/v2/assignment/ipv4/block/10.244.1.64-26", Key{Kind: KindBlock, CIDR: mustPrefix("10.244.1.64/26")}},
		{"/calico/ipam/v2/assignment/ipv6/block/fd00:10:244::c0-122", Key{Kind: KindBlock, CIDR: mustPrefix("fd00:10:244::c0/122")}},
		{"/calico/ipam/v2/assignment/ipv6/block/fd00:10:244:0:8e1f:1a2b:3c4d:5e40-122", Key{Kind: KindBlock, CIDR: mustPrefix("fd00:10:244:0:8e1f:1a2b:3c4d:5e40/122")}},
		{"/calico/ipam/v2/host/node-1/ipv4/block/10.244.1.64-26", Key{Kind: KindHostAffinity, CIDR: mustPrefix("10.244.1.64/26"), Name: "node-1"}},
		{"/calico/ipam/v2/host/node.example.com/ipv6/block/fd00::-122", Key{Kind: KindHostAffinity, CIDR: mustPrefix("fd00::/122"), Name: "node.example.com"}},
		{"/calico/ipam/v2/virtual/load-balancer/ipv4/block/203.0.113.0-26", Key{Kind: KindVirtualAffinity, CIDR: mustPrefix("203.0.113.0/26"), Name: "load-balancer"}},
		{"/calico/ipam/v2/handle/k8s-pod-network.abc123", Key{Kind: KindHandle, Name: "k8s-pod-network.abc123"}},
		{"/calico/ipam/v2/config", Key{Kind: KindIPAMConfig}},
		{"/calico/resources/v3/projectcalico.org/ippools/default-ipv4-ippool", Key{Kind: KindIPPool, Name: "default-ipv4-ippool"}},
	}
	for _, tc := range valid {
		k, err := ParseKey(tc.key)
		if err != nil {
			t.Errorf("ParseKey(%q): %v", tc.key, err)
			continue
		}
		if k != tc.want {
			t.Errorf("ParseKey(%q) = %+v, want %+v", tc.key, k, tc.want)
		}
		if k.String() != tc.key {
			t.Errorf("round trip %q -> %q", tc.key, k.String())
		}
	}
	invalid := []string{
		"/calico/ipam/v2/assignment/ipv4/block/10.244.1.65-26",         // host bits
		"/calico/ipam/v2/assignment/ipv6/block/FD00::-122",             // upper case
		"/calico/ipam/v2/assignment/ipv6/block/fd00:0:0:0:0:0:0:0-122", // not compressed
		"/calico/ipam/v2/assignment/ipv6/block/fd00::0:1:0:0:0-122",    // wrong compression
		"/calico/ipam/v2/assignment/ipv4/block/fd00::-122",             // family mismatch
		"/calico/ipam/v2/assignment/ipv6/block/10.0.0.0-26",            // family mismatch
		"/calico/ipam/v2/assignment/ipv6/block/::ffff:10.0.0.0-122",    // mapped
		"/calico/ipam/v2/assignment/ipv4/block/10.244.1.64/26",         // slash
		"/calico/ipam/v2/assignment/ipv4/block/010.244.1.64-26",        // leading zero
		"/calico/ipam/v2/assignment/ipv4/blocks/10.244.1.64-26",        // typo
		"/calico/ipam/v2/assignment/ipv4/block/10.244.1.64-26/extra",   // trailing
		"/calico/ipam/v2/assignment/ipv5/block/10.244.1.64-26",         // family
		"/calico/ipam/v2/host//ipv4/block/10.244.1.64-26",              // empty node
		"/calico/ipam/v2/handle/",                                      // empty handle
		"/calico/ipam/v2/handle/a/b",                                   // slash in handle
		"/calico/ipam/v2/configx",                                      // foreign
		"/calico/resources/v3/projectcalico.org/ippools/",              // empty pool
		"/vpp-calico/hosts/node-1/peerip/ipv4/1",                       // foreign
		"",                                                             // empty
		"/calico/ipam/v2/assignment/ipv4/block/10.244.1.64-33",         // length
		"/calico/ipam/v2/assignment/ipv6/block/fe80::1%eth0-128",       // zone
	}
	for _, s := range invalid {
		_, err := ParseKey(s)
		var ke *KeyError
		if !errors.As(err, &ke) || ke.Key != s {
			t.Errorf("ParseKey(%q) = %v, want a KeyError naming the key", s, err)
		}
	}
}

func TestKeyBuildersCanonicalise(t *testing.T) {
	if got := BlockKey(mustPrefix("10.244.1.65/26")); got != "/calico/ipam/v2/assignment/ipv4/block/10.244.1.64-26" {
		t.Errorf("BlockKey masks: %s", got)
	}
	if got := BlockKey(mustPrefix("::ffff:10.1.0.0/122")); got != "/calico/ipam/v2/assignment/ipv4/block/10.1.0.0-26" {
		t.Errorf("BlockKey unmaps: %s", got)
	}
	if got := HostAffinityKey("n1", mustPrefix("fd00:0:0:1::/122")); got != "/calico/ipam/v2/host/n1/ipv6/block/fd00:0:0:1::-122" {
		t.Errorf("HostAffinityKey: %s", got)
	}
}

func TestOrdinals(t *testing.T) {
	tests := []struct {
		cidr string
		ord  int
		addr string
	}{
		{"10.244.1.64/26", 0, "10.244.1.64"},
		{"10.244.1.64/26", 4, "10.244.1.68"},
		{"10.244.1.64/26", 63, "10.244.1.127"},
		{"10.0.0.0/20", 300, "10.0.1.44"},
		{"10.0.255.0/24", 255, "10.0.255.255"},
		{"fd00::c0/122", 63, "fd00::ff"},
		{"fd00::ff00/120", 255, "fd00::ffff"},
		{"fd00:0:0:1::/116", 4095, "fd00:0:0:1::fff"},
		{"10.0.0.5/32", 0, "10.0.0.5"},
	}
	for _, tc := range tests {
		a, err := OrdinalAddr(mustPrefix(tc.cidr), tc.ord)
		if err != nil || a != mustAddr(tc.addr) {
			t.Errorf("OrdinalAddr(%s, %d) = %v, %v; want %s", tc.cidr, tc.ord, a, err, tc.addr)
		}
		ord, ok := Ordinal(mustPrefix(tc.cidr), mustAddr(tc.addr))
		if !ok || ord != tc.ord {
			t.Errorf("Ordinal(%s, %s) = %d, %v; want %d", tc.cidr, tc.addr, ord, ok, tc.ord)
		}
	}
	if _, err := OrdinalAddr(mustPrefix("10.0.0.0/26"), 64); err == nil {
		t.Error("OrdinalAddr accepted ordinal 64 of a /26")
	}
	if _, ok := Ordinal(mustPrefix("10.0.0.0/26"), mustAddr("10.0.0.64")); ok {
		t.Error("Ordinal accepted an address outside the block")
	}
	if ord, ok := Ordinal(mustPrefix("10.0.0.0/26"), mustAddr("::ffff:10.0.0.9")); !ok || ord != 9 {
		t.Errorf("Ordinal of a mapped address = %d, %v", ord, ok)
	}
	// Every ordinal of a /20 round-trips.
	p := mustPrefix("172.16.16.0/20")
	for i := range Size(p) {
		a, _ := OrdinalAddr(p, i)
		if o, ok := Ordinal(p, a); !ok || o != i {
			t.Fatalf("round trip of ordinal %d via %s gave %d", i, a, o)
		}
	}
}

func TestIPAMConfig(t *testing.T) {
	tests := []struct {
		in   string
		want IPAMConfig
		cap  int
	}{
		{`{}`, IPAMConfig{AutoAllocateBlocks: true}, 20},
		{`{"strict_affinity":true,"auto_allocate_blocks":true,"maxBlocksPerHost":4}`, IPAMConfig{true, true, 4}, 4},
		{`{"auto_allocate_blocks":false}`, IPAMConfig{AutoAllocateBlocks: false}, 20},
	}
	for _, tc := range tests {
		got, err := DecodeIPAMConfig([]byte(tc.in))
		if err != nil || got != tc.want || got.BlockCap() != tc.cap {
			t.Errorf("DecodeIPAMConfig(%s) = %+v (cap %d), %v; want %+v cap %d", tc.in, got, got.BlockCap(), err, tc.want, tc.cap)
		}
		enc, _ := EncodeIPAMConfig(got)
		if back, _ := DecodeIPAMConfig(enc); back != got {
			t.Errorf("round trip %s -> %s -> %+v", tc.in, enc, back)
		}
	}
	if _, err := DecodeIPAMConfig([]byte(`{"maxBlocksPerHost":-1}`)); err == nil {
		t.Error("negative maxBlocksPerHost accepted")
	}
	if DefaultIPAMConfig().BlockCap() != 20 || !DefaultIPAMConfig().AutoAllocateBlocks {
		t.Error("bad default IPAM config")
	}
}

func TestIPPool(t *testing.T) {
	raw := `{"kind":"IPPool","apiVersion":"projectcalico.org/v3","metadata":{"name":"default-ipv4-ippool","uid":"x","creationTimestamp":"2024-01-01T00:00:00Z"},"spec":{"cidr":"10.244.0.0/16","vxlanMode":"Never","ipipMode":"Always","natOutgoing":true,"nodeSelector":"all()","allowedUses":["Workload","Tunnel"]}}`
	p, err := DecodeIPPool([]byte(raw))
	if err != nil {
		t.Fatal(err)
	}
	if p.Name != "default-ipv4-ippool" || p.CIDR != mustPrefix("10.244.0.0/16") || p.BlockSize != 26 || p.Disabled || !p.AllowsWorkloads() || !p.Automatic() {
		t.Errorf("decoded pool %+v", p)
	}
	v6, err := DecodeIPPool([]byte(`{"metadata":{"name":"v6"},"spec":{"cidr":"fd00:10:244::/48","disabled":true}}`))
	if err != nil || v6.BlockSize != 122 || !v6.Disabled {
		t.Errorf("v6 pool %+v, %v", v6, err)
	}
	enc, err := EncodeIPPool(p)
	if err != nil {
		t.Fatal(err)
	}
	back, err := DecodeIPPool(enc)
	if err != nil || back.CIDR != p.CIDR || back.BlockSize != p.BlockSize || back.Name != p.Name {
		t.Errorf("round trip: %+v, %v", back, err)
	}
	for _, bad := range []string{
		`{"metadata":{"name":"p"},"spec":{"cidr":"10.0.0.0/16","blockSize":33}}`,
		`{"metadata":{"name":"p"},"spec":{"cidr":"10.0.0.0/26","blockSize":24}}`,
		`{"metadata":{"name":"p"},"spec":{"cidr":"nonsense"}}`,
		`{"metadata":{"name":"p"},"spec":{"cidr":"fd00::/64","blockSize":100}}`,
		`not json`,
	} {
		if _, err := DecodeIPPool([]byte(bad)); err == nil {
			t.Errorf("DecodeIPPool(%s) accepted", bad)
		}
	}
	if (IPPool{AllowedUses: []string{"Tunnel"}}).AllowsWorkloads() {
		t.Error("a Tunnel-only pool allows workloads")
	}
	if (IPPool{AssignmentMode: "Manual"}).Automatic() {
		t.Error("a Manual pool is automatic")
	}
}

func TestHandleAndAffinity(t *testing.T) {
	h, err := DecodeHandle([]byte(`{"block":{"10.244.1.64/26":1,"10.244.2.0/26":2},"deleted":false}`))
	if err != nil || h.Count() != 3 {
		t.Errorf("handle %+v, %v", h, err)
	}
	a, err := DecodeAffinity([]byte(`{"state":"confirmed","deleted":false}`))
	if err != nil || a.State != AffinityConfirmed {
		t.Errorf("affinity %+v, %v", a, err)
	}
	if _, err := DecodeHandle([]byte(`[`)); err == nil {
		t.Error("bad handle accepted")
	}
}

func FuzzParseKey(f *testing.F) {
	for _, s := range []string{
		"/calico/ipam/v2/assignment/ipv4/block/10.244.1.64-26",
		"/calico/ipam/v2/assignment/ipv6/block/fd00:10:244::c0-122",
		"/calico/ipam/v2/host/node-1/ipv4/block/10.244.1.64-26",
		"/calico/ipam/v2/virtual/lb/ipv6/block/fd00::-122",
		"/calico/ipam/v2/handle/k8s-pod-network.abc",
		"/calico/ipam/v2/config",
		"/calico/resources/v3/projectcalico.org/ippools/p",
		"/calico/resources/v3/projectcalico.org/nodes/node-a",
		"/calico/resources/v3/projectcalico.org/felixconfigurations/node.node-a",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		k, err := ParseKey(s)
		if err != nil {
			return
		}
		if k.String() != s {
			t.Fatalf("ParseKey(%q) accepted a key that formats as %q", s, k.String())
		}
	})
}

// TestDecodeRoutingMalformed: a value whose routing fields cannot be read fails to decode, as it does
// with DecodeBlock.
func TestDecodeRoutingMalformed(t *testing.T) {
	for _, v := range []string{
		`{"cidr":"10.0.0.0/30","allocations":[0,1.5]}`,
		`{"cidr":"10.0.0.0/30","allocations":[0,"1"]}`,
		`{"cidr":"10.0.0.0/30","allocations":{"0":1}}`,
		`{"cidr":"10.0.0.0/30","allocations":7}`,
		`{"cidr":"10.0.0.0/30","attributes":[{"secondary":{"node":5}}]}`,
		`{"cidr":"10.0.0.0/30","affinity":5}`,
		`{"cidr":"10.0.0.0/30",`,
		`{"affinity":"host:x"}`,
	} {
		if _, err := DecodeBlock([]byte(v)); err == nil {
			t.Errorf("DecodeBlock(%s) read it", v)
		}
		if r, err := DecodeRouting([]byte(v)); err == nil {
			t.Errorf("DecodeRouting(%s) = %+v, want an error", v, r)
		}
	}
}

func FuzzDecodeBlock(f *testing.F) {
	entries, _ := os.ReadDir("testdata")
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".json") {
			f.Add([]byte(loadTestdata(f, e.Name()).Value))
		}
	}
	f.Add([]byte(`{"cidr":"10.0.0.0/30","affinity":"host:x","allocations":[ 1 ,null, 0,9999999999],"attributes":[{"secondary":{"node":"x"}},{"secondary":{"node":"y","pod":"p"}}]}`))
	f.Add([]byte(`{"cidr":"10.0.0.0/30","affinity":"host:x","allocations":[0,null,5,-1],"unallocated":[1,1,9],"attributes":[{"handle_id":null,"secondary":{"node":"y"}}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		b, err := DecodeBlock(data)
		if err != nil {
			return
		}
		_ = b.Validate()
		o := OwnerOf(b, true)
		_ = BorrowedAddrs(b, o)
		// The routing decoder reads every value the full one reads, to the same routes.
		r, err := DecodeRouting(data)
		if err != nil {
			t.Fatalf("DecodeRouting fails on a value DecodeBlock reads: %v", err)
		}
		for _, legacy := range []bool{false, true} {
			o := OwnerOf(b, legacy)
			if got := r.Owner(legacy); got != o || r.CIDR != b.CIDR {
				t.Fatalf("legacy %v: DecodeRouting owner %v of %s, DecodeBlock %v of %s", legacy, got, r.CIDR, o, b.CIDR)
			}
			if got, want := r.Borrowed(o), BorrowedAddrs(b, o); !slices.Equal(got, want) {
				t.Fatalf("legacy %v: DecodeRouting borrowed %v, DecodeBlock %v", legacy, got, want)
			}
		}
		for i := range b.Allocations {
			_ = b.AttributeOf(i).Handle()
		}
		got, err := EncodeBlock(b)
		if err != nil && b.Allocations != nil {
			t.Fatalf("EncodeBlock of a decoded block: %v", err)
		}
		if want, _ := encodeBlockJSON(b); err == nil && string(got) != string(want) {
			t.Fatalf("EncodeBlock wrote\n%s\nencoding/json writes\n%s", got, want)
		}
	})
}

// TestEncodeBlockIsEncodingJSON: EncodeBlock writes byte for byte what encoding/json writes, for
// blocks in every state an allocation leaves them and strings that need escaping.
func TestEncodeBlockIsEncodingJSON(t *testing.T) {
	odd := []string{"plain", "", `quote"back\\slash`, "<tag>&amp;", "tab\tnl\ncr\r\x01\x1f", "caf\u00e9 \u2028\u2029", "bad\xffutf8", "del\x7f"}
	for i, str := range odd {
		b := NewBlock(netip.MustParsePrefix("10.0.0.0/29"), "host:"+str, uint64(i)*1e18)
		for j, v := range odd {
			h := str + v
			b.AutoAssign(1, AllocationAttribute{HandleID: &h, Secondary: map[string]string{"node": v, v + "k": str, "z": ""}}, nil)
			if j == 2 {
				b.AutoAssign(1, AllocationAttribute{}, nil)
				b.AutoAssign(1, AllocationAttribute{Secondary: map[string]string{}}, nil)
			}
		}
		b.Release(1, 3)
		if i%2 == 1 {
			b.HostAffinity = &str
			b.Deleted = true
			b.SequenceNumberForAllocation = nil
			b.Unallocated = nil
		}
		got, err := EncodeBlock(b)
		want, _ := encodeBlockJSON(b)
		if err != nil || string(got) != string(want) {
			t.Fatalf("block %d: EncodeBlock wrote (%v)\n%s\nencoding/json writes\n%s", i, err, got, want)
		}
	}
}

// BenchmarkEncodeBlock: a full /26 block as the daemon writes it on every ADD and DEL.
func BenchmarkEncodeBlock(b *testing.B) {
	blk := NewBlock(netip.MustParsePrefix("10.244.0.0/26"), "host:node1", 1)
	for i := range 60 {
		h := fmt.Sprintf("net1.%064d", i)
		blk.AutoAssign(1, AllocationAttribute{HandleID: &h, Secondary: map[string]string{"node": "node1", "pod": "p", "namespace": "default",
			"timestamp": "2024-05-02 10:11:12.483920113 +0000 UTC", "ifname": "eth0", "network": "net1"}}, nil)
	}
	for _, enc := range []struct {
		name string
		f    func(*Block) ([]byte, error)
	}{{"append", EncodeBlock}, {"encoding-json", encodeBlockJSON}} {
		b.Run(enc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := enc.f(blk); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestBlockClone: a clone encodes like the original and shares nothing a change could reach.
func TestBlockClone(t *testing.T) {
	b := NewBlock(netip.MustParsePrefix("10.0.0.0/30"), "host:n1", 7)
	h := "h1"
	b.AutoAssign(2, AllocationAttribute{HandleID: &h, Secondary: map[string]string{"node": "n1"}}, nil)
	want, _ := EncodeBlock(b)
	c := b.Clone()
	got, _ := EncodeBlock(c)
	if string(got) != string(want) {
		t.Fatalf("clone encodes as\n%s\nwant\n%s", got, want)
	}
	*c.Allocations[0] = 5
	c.Attributes[0].Secondary["node"] = "n2"
	*c.Attributes[0].HandleID = "h2"
	*c.Affinity = "host:n2"
	c.Unallocated[0] = 9
	c.SequenceNumberForAllocation["0"] = 99
	if again, _ := EncodeBlock(b); string(again) != string(want) {
		t.Fatalf("changing the clone changed the original:\n%s", again)
	}
}
