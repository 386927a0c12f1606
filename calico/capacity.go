package calico

import (
	"math"
	"net/netip"
	"slices"

	"github.com/vpp-route-agent/vpp-route-agent/internal/netaddr"
)

// CapacityInput is what the capacity of the cluster's IPAM is computed from: every IP pool, every
// block, the IPReservations, and address ranges excluded besides them (the CNI network
// configuration's ipam.exclude, which only the node that reads the configuration knows).
type CapacityInput struct {
	Pools        []IPPool
	Blocks       []*Block
	Reservations Reservations
	Exclude      Reservations
	Config       IPAMConfig
}

// PoolCapacity is the capacity of one IP pool. Counts of addresses and blocks are float64: an IPv6
// pool holds more than 2^64 addresses, and Prometheus gauges are float64 anyway.
type PoolCapacity struct {
	Pool   string
	Family string // "ipv4" or "ipv6"
	// Addresses in the pool: calicoctl ipam show's "IPS TOTAL".
	Addresses float64
	// BlockAddresses are the addresses of the pool's claimed blocks (blocks that exist, whatever
	// their affinity).
	BlockAddresses float64
	// Allocated addresses (in the pool's blocks): calicoctl ipam show's "IPS IN USE".
	Allocated float64
	// FreeInBlocks are the addresses of claimed blocks neither allocated nor reserved: what can be
	// handed out without claiming another block.
	FreeInBlocks float64
	// Reserved are the pool's addresses that IPReservations or Exclude cover, each counted once.
	Reserved float64
	// BlocksClaimed are the pool's blocks; BlocksClaimable the block-sized subnets no block overlaps
	// that reservations do not cover whole (those a claim could still take).
	BlocksClaimed, BlocksClaimable float64
	// Borrowed are allocated addresses whose node (secondary.node) is not the block's owner.
	Borrowed float64
}

// NodeCapacity is what one node holds in one pool: the blocks its host affinity names.
type NodeCapacity struct {
	Node, Pool, Family string
	Blocks             int
	Allocated          int
	// Free are the free addresses of its blocks that no reservation covers.
	Free int
}

// CapacityReport is the capacity of every pool and of every node in every pool it holds blocks of,
// both sorted (pools in input order, nodes by node then pool). BlockLimit is the most blocks a node
// claims (the IPAM config's cap) and AutoAllocate whether nodes may claim at all; BlocksOutside
// counts blocks in no pool (not counted anywhere else).
type CapacityReport struct {
	Pools         []PoolCapacity
	Nodes         []NodeCapacity
	BlockLimit    int
	AutoAllocate  bool
	BlocksOutside int
}

// Capacity computes the capacity report. It reads nothing but its input, and deleted blocks are
// absent. A block belongs to the first pool that contains it.
func Capacity(in CapacityInput) CapacityReport {
	reserved := append(slices.Clone(in.Reservations), in.Exclude...)
	skip := reserved.Contains
	rep := CapacityReport{BlockLimit: in.Config.BlockCap(), AutoAllocate: in.Config.AutoAllocateBlocks}
	type nodeKey struct{ node, pool string }
	nodes := map[nodeKey]*NodeCapacity{}
	perPool := make([][]netip.Prefix, len(in.Pools))
	for _, p := range in.Pools {
		rep.Pools = append(rep.Pools, PoolCapacity{
			Pool: p.Name, Family: netaddr.PrefixFamily(p.CIDR).String(),
			Addresses: math.Ldexp(1, p.CIDR.Addr().BitLen()-p.CIDR.Bits()),
			Reserved:  reserved.countWithin(p.CIDR),
		})
	}
	for _, b := range in.Blocks {
		if b == nil || b.Deleted {
			continue
		}
		i := slices.IndexFunc(in.Pools, func(p IPPool) bool { return p.Contains(b.CIDR) })
		if i < 0 {
			rep.BlocksOutside++
			continue
		}
		pc := &rep.Pools[i]
		perPool[i] = append(perPool[i], b.CIDR)
		allocated := 0
		for _, a := range b.Allocations {
			if a != nil {
				allocated++
			}
		}
		free := b.Free(skip)
		owner := OwnerOf(b, false)
		pc.BlocksClaimed++
		pc.BlockAddresses += float64(Size(b.CIDR))
		pc.Allocated += float64(allocated)
		pc.FreeInBlocks += float64(free)
		pc.Borrowed += float64(len(BorrowedAddrs(b, owner)))
		if owner.Kind != OwnerHost {
			continue
		}
		k := nodeKey{owner.Node, in.Pools[i].Name}
		n := nodes[k]
		if n == nil {
			n = &NodeCapacity{Node: owner.Node, Pool: k.pool, Family: pc.Family}
			nodes[k] = n
		}
		n.Blocks++
		n.Allocated += allocated
		n.Free += free
	}
	for i, p := range in.Pools {
		rep.Pools[i].BlocksClaimable = claimable(p, perPool[i], reserved)
	}
	for _, n := range nodes {
		rep.Nodes = append(rep.Nodes, *n)
	}
	slices.SortFunc(rep.Nodes, func(a, b NodeCapacity) int {
		if a.Node != b.Node {
			if a.Node < b.Node {
				return -1
			}
			return 1
		}
		return slices.IndexFunc(in.Pools, func(p IPPool) bool { return p.Name == a.Pool }) -
			slices.IndexFunc(in.Pools, func(p IPPool) bool { return p.Name == b.Pool })
	})
	return rep
}

// countWithin returns how many addresses of outer the reservations cover, each counted once.
func (r Reservations) countWithin(outer netip.Prefix) float64 {
	var inside []netip.Prefix
	for _, q := range r {
		q = netaddr.Canonical(q)
		if q.Addr().Is4() != outer.Addr().Is4() || !q.Overlaps(outer) {
			continue
		}
		if netaddr.Covers(q, outer) {
			return math.Ldexp(1, outer.Addr().BitLen()-outer.Bits())
		}
		inside = append(inside, q)
	}
	slices.SortFunc(inside, func(a, b netip.Prefix) int { return a.Bits() - b.Bits() })
	total := 0.0
	for i, q := range inside {
		if slices.ContainsFunc(inside[:i], func(o netip.Prefix) bool { return o.Contains(q.Addr()) }) {
			continue
		}
		total += math.Ldexp(1, q.Addr().BitLen()-q.Bits())
	}
	return total
}

// claimable returns how many block-sized subnets of the pool a claim could take: all of them, less
// those a block overlaps and those reservations cover whole (NextFreeBlock's two exclusions). A
// subnet reservations cover whole is one inside a reservation at least block-sized, or the block
// around a smaller reservation that CoversWhole; each is counted once.
func claimable(p IPPool, blocks []netip.Prefix, reserved Reservations) float64 {
	total := math.Ldexp(1, p.BlockSize-p.CIDR.Bits())
	taken := map[netip.Prefix]bool{}
	for _, b := range blocks {
		// A block of another size (the pool's block size changed) overlaps one or more subnets.
		if b.Bits() >= p.BlockSize {
			taken[netip.PrefixFrom(b.Addr(), p.BlockSize).Masked()] = true
			continue
		}
		total -= math.Ldexp(1, p.BlockSize-b.Bits())
	}
	total -= float64(len(taken))
	// Reservations: large ones by arithmetic, less the taken subnets inside them.
	var large []netip.Prefix
	for _, q := range reserved {
		q = netaddr.Canonical(q)
		if q.Addr().Is4() != p.CIDR.Addr().Is4() || !q.Overlaps(p.CIDR) {
			continue
		}
		if q.Bits() < p.CIDR.Bits() {
			q = p.CIDR
		}
		if q.Bits() <= p.BlockSize {
			large = append(large, q)
		}
	}
	slices.SortFunc(large, func(a, b netip.Prefix) int { return a.Bits() - b.Bits() })
	for i, q := range large {
		if slices.ContainsFunc(large[:i], func(o netip.Prefix) bool { return o.Contains(q.Addr()) }) {
			continue
		}
		// Subnets a block already took are not subtracted twice.
		if slices.ContainsFunc(blocks, func(b netip.Prefix) bool { return netaddr.Covers(b, q) }) {
			continue
		}
		total -= math.Ldexp(1, p.BlockSize-q.Bits())
		for t := range taken {
			if q.Contains(t.Addr()) {
				total++
			}
		}
		for _, b := range blocks {
			if b.Bits() < p.BlockSize && netaddr.Covers(q, b) {
				total += math.Ldexp(1, p.BlockSize-b.Bits())
			}
		}
	}
	// Smaller reservations: the subnet around each, when together they cover it whole.
	seen := map[netip.Prefix]bool{}
	for _, q := range reserved {
		q = netaddr.Canonical(q)
		if q.Addr().Is4() != p.CIDR.Addr().Is4() || !p.CIDR.Contains(q.Addr()) || q.Bits() <= p.BlockSize {
			continue
		}
		s := netip.PrefixFrom(q.Addr(), p.BlockSize).Masked()
		if seen[s] || taken[s] || slices.ContainsFunc(large, func(o netip.Prefix) bool { return o.Contains(s.Addr()) }) ||
			slices.ContainsFunc(blocks, func(b netip.Prefix) bool { return b.Overlaps(s) }) {
			continue
		}
		seen[s] = true
		if reserved.CoversWhole(s) {
			total--
		}
	}
	return max(total, 0)
}
