package calico

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/vpp-route-agent/vpp-route-agent/internal/netaddr"
)

// This file holds the allocation decisions Calico's IPAM takes beyond one block (libcalico-go lib/ipam
// ipam.go, ipam_block_reader_writer.go, pools.go), as pure functions, so that every allocator of this
// project takes them the same way: which pools serve a pod on a node, how many blocks a node may
// claim, which subnet it claims next, what an affinity key in each state asks for, and when a block
// is deleted.

// WindowsReservedHandle is the handle Calico's Windows nodes pre-allocate the first three and the last
// addresses of their blocks with; a block holding only those counts as empty (ipam_block.go).
const WindowsReservedHandle = "windows-reserved-ipam-handle"

// Allowed uses of an IP pool (spec.allowedUses).
const (
	UseWorkload     = "Workload"
	UseTunnel       = "Tunnel"
	UseLoadBalancer = "LoadBalancer"
)

// SelectsNode reports whether the pool's nodeSelector selects the node. An empty selector and all()
// select every node without looking at labels; any other selector is matched against the labels of
// the node's Calico Node resource. Without one (node nil) such a pool selects nothing: Calico fails
// every automatic assignment of a node without a Node resource (prepareAffinityBlocksForHost in
// ipam.go), this package only withholds the pools whose choice needs the labels, so that nodes that
// run no calico/node still use the pools meant for every node. A selector that does not parse is an
// error (Calico's determinePools fails the assignment on it).
func (p IPPool) SelectsNode(node *Node) (bool, error) {
	if s := strings.TrimSpace(p.NodeSelector); s == "" || s == "all()" {
		return true, nil
	}
	sel, err := ParseSelector(p.NodeSelector)
	if err != nil {
		return false, fmt.Errorf("IP pool %q: nodeSelector: %w", p.Name, err)
	}
	return node != nil && sel.Matches(node.Labels), nil
}

// SelectsNamespace reports whether the pool's namespaceSelector selects a namespace without labels:
// what calico-ipam evaluates it against on an etcd datastore without Kubernetes configuration
// (cni-plugin pkg/ipamplugin/ipam_plugin.go passes no namespace; pools.go SelectsNamespace).
func (p IPPool) SelectsNamespace() (bool, error) {
	if strings.TrimSpace(p.NamespaceSelector) == "" {
		return true, nil
	}
	sel, err := ParseSelector(p.NamespaceSelector)
	if err != nil {
		return false, fmt.Errorf("IP pool %q: namespaceSelector: %w", p.Name, err)
	}
	return sel.Matches(nil), nil
}

// WorkloadPools returns, in the order given (Calico lists pools by name), the pools of one family
// that automatic assignment of a pod address on node may use: enabled, in automatic assignment mode,
// selecting the node and a label-less namespace, and allowing Workload (determinePools and
// filterPoolsByUse in ipam.go). The first selector error is returned.
func WorkloadPools(pools []IPPool, v6 bool, node *Node) ([]IPPool, error) {
	var out []IPPool
	for _, p := range pools {
		if p.CIDR.Addr().Is6() != v6 || p.Disabled || !p.Automatic() {
			continue
		}
		ok, err := p.SelectsNode(node)
		if err != nil {
			return nil, err
		}
		if ok {
			ok, err = p.SelectsNamespace()
			if err != nil {
				return nil, err
			}
		}
		if ok && p.AllowsWorkloads() {
			out = append(out, p)
		}
	}
	return out, nil
}

// NeedsNode reports whether selecting among the pools needs the node's labels.
func NeedsNode(pools []IPPool) bool {
	for _, p := range pools {
		if s := strings.TrimSpace(p.NodeSelector); s != "" && s != "all()" {
			return true
		}
	}
	return false
}

// BlockLimit returns how many blocks of one family a node may hold: the request's own limit (0: none)
// and the config's maxBlocksPerHost, the more restrictive of the two, else 20 (autoAssign in ipam.go).
// A node at the limit claims no new block, and neither borrows: Calico fails the assignment.
func (c IPAMConfig) BlockLimit(request int) int {
	limit := request
	switch {
	case c.MaxBlocksPerHost > 0 && request > c.MaxBlocksPerHost:
		limit = c.MaxBlocksPerHost
	case request == 0:
		limit = c.MaxBlocksPerHost
	}
	if limit <= 0 {
		return DefaultMaxBlocksPerHost
	}
	return limit
}

// NextFreeBlock returns the subnet of pool a node claims next: the first block-sized subnet, walking
// from the node's start index (BlockStartIndex) and wrapping around, that overlaps no prefix in used
// (existing blocks of any size) and is not wholly reserved (findUsableBlock in
// ipam_block_reader_writer.go skips such subnets; a partly reserved one is claimed). ok is false when
// no subnet is left.
func NextFreeBlock(pool IPPool, node string, used []netip.Prefix, reserved Reservations) (netip.Prefix, bool) {
	used = append([]netip.Prefix(nil), used...)
	for _, r := range reserved {
		if r.Bits() <= pool.BlockSize {
			used = append(used, r)
		}
	}
	start := startIndex(node, pool.CIDR, pool.BlockSize)
	for {
		cidr, ok := freeBlock(pool.CIDR, pool.BlockSize, start, used)
		if !ok || !reserved.CoversWhole(cidr) {
			return cidr, ok
		}
		// Reserved by several smaller ranges together: each such subnet costs one more walk.
		used = append(used, cidr)
	}
}

// BorrowOrder returns, of the given block CIDRs, those Calico's allocator visits when node borrows
// from pool, in the order it visits them: the pool's block-sized subnets from the node's start index
// upwards, wrapping around (autoAssign in ipam.go walks randomBlockGenerator again); blocks of
// another size are not visited. The first with a free address that is not reserved serves.
func BorrowOrder(pool IPPool, node string, cidrs []netip.Prefix) []netip.Prefix {
	p := netaddr.Canonical(pool.CIDR)
	n := pool.BlockSize - p.Bits()
	if n < 0 || n > 127 {
		return nil
	}
	hostBits := p.Addr().BitLen() - pool.BlockSize
	start, base := startIndex(node, p, pool.BlockSize), toU128(p.Addr())
	type visit struct {
		cidr netip.Prefix
		key  u128
	}
	var vs []visit
	for _, c := range cidrs {
		c = netaddr.Canonical(c)
		if c.Bits() != pool.BlockSize || !p.Contains(c.Addr()) {
			continue
		}
		idx := toU128(c.Addr()).sub(base).shr(hostBits)
		// (idx - start) modulo the number of subnets: the distance walked from the start.
		key := idx.sub(start).shl(128 - n).shr(128 - n)
		vs = append(vs, visit{c, key})
	}
	slices.SortFunc(vs, func(a, b visit) int { return a.key.cmp(b.key) })
	out := make([]netip.Prefix, len(vs))
	for i, v := range vs {
		out[i] = v.cidr
	}
	return out
}

// ReleaseWhenUnselected reports whether node, when it allocates, lets go of its affinity to block b of
// pool p (the enabled pool holding b, not one the allocation uses): b is the node's and empty, and p's
// nodeSelector no longer selects the node; the block is then deleted with the affinity
// (prepareAffinityBlocksForHost in ipam.go). Without the node's labels (n nil) it never does.
func ReleaseWhenUnselected(p IPPool, n *Node, b *Block, node string) bool {
	if n == nil || b == nil || !b.Empty() {
		return false
	}
	if o := OwnerOf(b, false); o.Kind != OwnerHost || o.Node != node {
		return false
	}
	ok, err := p.SelectsNode(n)
	return err == nil && !ok
}

// Empty reports whether no address of the block is in use: every allocation, if any, is held by the
// Windows reserved handle (allocationBlock.empty in ipam_block.go).
func (b *Block) Empty() bool {
	for ord, idx := range b.Allocations {
		if idx == nil {
			continue
		}
		if a := b.AttributeOf(ord); a == nil || !strings.EqualFold(a.Handle(), WindowsReservedHandle) {
			return false
		}
	}
	return true
}

// DeleteWhenReleased reports whether a release that leaves the block in this state deletes it instead
// of writing it: an empty block without affinity belongs to nobody, and only its deletion returns its
// subnet to every node's claims (releaseIPsFromBlock and releaseByHandle in ipam.go). An empty block
// with an affinity stays with its node.
func (b *Block) DeleteWhenReleased() bool { return b.Affinity == nil && b.Empty() }

// AffinityStep is what an allocator on a node does with one of that node's affinity keys when it
// looks for a block to assign from (getBlockFromAffinity in ipam.go).
type AffinityStep int

// The steps, by the affinity's state and the block it names.
const (
	// AffinityUse: the block exists and is the node's, and the affinity is confirmed: assign from it.
	AffinityUse AffinityStep = iota
	// AffinityCreate: the block does not exist (a claim interrupted after writing its pending
	// affinity, or a block deleted under a live affinity): create exactly that block for the node and
	// confirm the affinity.
	AffinityCreate
	// AffinityConfirm: the block is the node's but the affinity is pending: confirm it in the same
	// write that uses the block (Calico rewrites the block to fence off a concurrent release).
	AffinityConfirm
	// AffinityStale: the block belongs to another owner or to none: the affinity is stale; delete it.
	AffinityStale
)

func (s AffinityStep) String() string {
	switch s {
	case AffinityCreate:
		return "create"
	case AffinityConfirm:
		return "confirm"
	case AffinityStale:
		return "stale"
	}
	return "use"
}

// SortAffinities orders a node's affinity CIDRs the way an allocator tries them: those not confirmed
// first, so that a claim Calico left half done is finished before anything else and none stays behind
// (Calico tries them in listing order), then by address.
func SortAffinities(cidrs []netip.Prefix, state func(netip.Prefix) string) {
	confirmed := func(c netip.Prefix) bool { s := state(c); return s == AffinityConfirmed || s == "" }
	slices.SortFunc(cidrs, func(a, b netip.Prefix) int {
		if ca, cb := confirmed(a), confirmed(b); ca != cb {
			if cb {
				return -1
			}
			return 1
		}
		return a.Compare(b)
	})
}

// StepFor decides what node does with its affinity in the given state to a block b (nil when the
// block does not exist). The empty state counts as confirmed, as Calico reads affinities written
// before states existed.
func StepFor(node, state string, b *Block) AffinityStep {
	if b == nil || b.Deleted {
		return AffinityCreate
	}
	if o := OwnerOf(b, false); o.Kind != OwnerHost || o.Node != node {
		return AffinityStale
	}
	if state == AffinityConfirmed || state == "" {
		return AffinityUse
	}
	return AffinityConfirm
}
