package calico

import (
	"math"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"testing"
)

// allocated returns a block of node (affinity host:<node>, "" for none) with the given ordinals
// assigned, each to the node named in nodes (or the block's node).
func allocatedBlock(t *testing.T, cidr, node string, ords map[int]string) *Block {
	t.Helper()
	aff := ""
	if node != "" {
		aff = "host:" + node
	}
	b := NewBlock(mustPrefix(cidr), aff, 1)
	for ord, n := range ords {
		if err := b.Assign(ord, attr("h-"+n, n)); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

func TestCapacity(t *testing.T) {
	pool := IPPool{Name: "p4", CIDR: mustPrefix("10.0.0.0/24"), BlockSize: 26}
	pool6 := IPPool{Name: "p6", CIDR: mustPrefix("fd00::/64"), BlockSize: 122}
	deleted := NewBlock(mustPrefix("10.0.0.192/26"), "host:c", 1)
	deleted.Deleted = true
	cases := []struct {
		name string
		in   func(t *testing.T) CapacityInput
		want CapacityReport
	}{{
		name: "two nodes, a borrowed address, reservations inside and outside blocks",
		in: func(t *testing.T) CapacityInput {
			return CapacityInput{
				Pools: []IPPool{pool},
				Blocks: []*Block{
					allocatedBlock(t, "10.0.0.0/26", "a", map[int]string{0: "a", 1: "a", 2: "b"}),
					allocatedBlock(t, "10.0.0.64/26", "b", map[int]string{3: "b"}),
					deleted,
					allocatedBlock(t, "192.168.0.0/26", "a", nil),
				},
				// .5 is free in a's block; .128/26 a whole unclaimed block; .200/30 part of one.
				Reservations: Reservations{mustPrefix("10.0.0.5/32"), mustPrefix("10.0.0.128/26")},
				Exclude:      Reservations{mustPrefix("10.0.0.200/30"), mustPrefix("10.0.0.128/27")},
				Config:       IPAMConfig{MaxBlocksPerHost: 5},
			}
		},
		want: CapacityReport{
			Pools: []PoolCapacity{{Pool: "p4", Family: "ipv4", Addresses: 256, BlockAddresses: 128, Allocated: 4,
				FreeInBlocks: 60 + 63, Reserved: 1 + 64 + 4, BlocksClaimed: 2, BlocksClaimable: 1, Borrowed: 1}},
			Nodes: []NodeCapacity{
				{Node: "a", Pool: "p4", Family: "ipv4", Blocks: 1, Allocated: 3, Free: 60},
				{Node: "b", Pool: "p4", Family: "ipv4", Blocks: 1, Allocated: 1, Free: 63},
			},
			BlockLimit: 5, BlocksOutside: 1,
		},
	}, {
		name: "small reservations covering a block together, a reservation over the whole pool",
		in: func(t *testing.T) CapacityInput {
			return CapacityInput{
				Pools:        []IPPool{pool, {Name: "small", CIDR: mustPrefix("10.1.0.0/26"), BlockSize: 26}},
				Reservations: Reservations{mustPrefix("10.0.0.192/27"), mustPrefix("10.0.0.224/27"), mustPrefix("10.1.0.0/16")},
				Config:       DefaultIPAMConfig(),
			}
		},
		want: CapacityReport{
			Pools: []PoolCapacity{
				{Pool: "p4", Family: "ipv4", Addresses: 256, Reserved: 64, BlocksClaimable: 3},
				{Pool: "small", Family: "ipv4", Addresses: 64, Reserved: 64, BlocksClaimable: 0},
			},
			BlockLimit: 20, AutoAllocate: true,
		},
	}, {
		name: "IPv6 pool larger than 2^64 blocks' worth, a block without affinity",
		in: func(t *testing.T) CapacityInput {
			return CapacityInput{
				Pools:  []IPPool{pool6},
				Blocks: []*Block{allocatedBlock(t, "fd00::/122", "", map[int]string{0: "x"})},
				Config: DefaultIPAMConfig(),
			}
		},
		want: CapacityReport{
			Pools: []PoolCapacity{{Pool: "p6", Family: "ipv6", Addresses: math.Ldexp(1, 64), BlockAddresses: 64,
				Allocated: 1, FreeInBlocks: 63, BlocksClaimed: 1, BlocksClaimable: math.Ldexp(1, 58) - 1, Borrowed: 1}},
			BlockLimit: 20, AutoAllocate: true,
		},
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := Capacity(c.in(t))
			if !reflect.DeepEqual(got, c.want) {
				t.Errorf("Capacity:\n got %+v\nwant %+v", got, c.want)
			}
		})
	}
}

// TestClaimableMatchesClaims checks BlocksClaimable against what claims really take: claiming with
// NextFreeBlock until it finds nothing claims exactly BlocksClaimable blocks, with random blocks
// (of the pool's size and others) and random reservations.
func TestClaimableMatchesClaims(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	pool := IPPool{Name: "p", CIDR: mustPrefix("10.0.0.0/22"), BlockSize: 26}
	randPrefix := func(minBits, maxBits int) netip.Prefix {
		bits := minBits + rng.IntN(maxBits-minBits+1)
		a := netip.AddrFrom4([4]byte{10, 0, byte(rng.IntN(4)), byte(rng.IntN(256))})
		return netip.PrefixFrom(a, bits).Masked()
	}
	for i := range 500 {
		var blocks []*Block
		var used []netip.Prefix
		for range rng.IntN(6) {
			p := randPrefix(24, 28)
			if rng.IntN(3) > 0 {
				p = netip.PrefixFrom(p.Addr(), 26).Masked()
			}
			overlaps := false
			for _, u := range used {
				overlaps = overlaps || u.Overlaps(p)
			}
			if !overlaps {
				used = append(used, p)
				blocks = append(blocks, NewBlock(p, "host:n", 1))
			}
		}
		var reserved Reservations
		for range rng.IntN(5) {
			reserved = append(reserved, randPrefix(23, 30))
		}
		rep := Capacity(CapacityInput{Pools: []IPPool{pool}, Blocks: blocks, Reservations: reserved, Config: DefaultIPAMConfig()})
		claims := 0
		for {
			cidr, ok := NextFreeBlock(pool, "n", used, reserved)
			if !ok {
				break
			}
			used = append(used, cidr)
			claims++
		}
		if got := rep.Pools[0].BlocksClaimable; got != float64(claims) {
			t.Fatalf("case %d: blocks %v reserved %v: BlocksClaimable %v, claims take %d", i, used[:len(blocks)], reserved, got, claims)
		}
	}
}
