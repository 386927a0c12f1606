package calico

import (
	"net/netip"
	"strings"
)

// OwnerKind says where a block's owner came from.
type OwnerKind int

// Kinds of block ownership.
const (
	// OwnerNone: affinity null (or unparseable): no node owns the block.
	OwnerNone OwnerKind = iota
	// OwnerHost: affinity "host:<node>", felix's rule.
	OwnerHost
	// OwnerVirtual: affinity "virtual:<name>" (Calico v3.30+): no node owns the block.
	OwnerVirtual
	// OwnerLegacyHost: no affinity, but the pre-2016 hostAffinity field names a node, and the caller
	// asked for legacy ownership. Current Calico would not route such a block.
	OwnerLegacyHost
)

func (k OwnerKind) String() string {
	switch k {
	case OwnerHost:
		return "host"
	case OwnerVirtual:
		return "virtual"
	case OwnerLegacyHost:
		return "legacy-host"
	}
	return "none"
}

// Owner is who owns a block. Node is the owning node for OwnerHost and OwnerLegacyHost, the virtual
// owner's name for OwnerVirtual, and "" otherwise.
type Owner struct {
	Kind OwnerKind
	Node string
}

// IsNode reports whether a node owns the block (and so the block's CIDR is routed to it).
func (o Owner) IsNode() bool { return o.Kind == OwnerHost || o.Kind == OwnerLegacyHost }

// Borrowed is an allocated address whose secondary.node differs from the block's owning node: felix
// routes it as a host route (/32 or /128) to that node.
type Borrowed struct {
	Ordinal int
	Addr    netip.Addr
	Node    string
}

// OwnerOf applies felix's rule to a block: the owner is the node after "host:" in affinity; "virtual:"
// blocks and blocks with affinity null belong to no node; a deleted block belongs to no one. A block with
// only the legacy hostAffinity field is owned by that node only when legacyHostAffinity is true (the
// result's Kind then says so, so that the caller can log the choice).
func OwnerOf(b *Block, legacyHostAffinity bool) Owner {
	if b.Deleted {
		return Owner{}
	}
	if b.Affinity != nil {
		a := *b.Affinity
		if node, ok := strings.CutPrefix(a, "host:"); ok && node != "" {
			return Owner{Kind: OwnerHost, Node: node}
		}
		if name, ok := strings.CutPrefix(a, "virtual:"); ok && name != "" {
			return Owner{Kind: OwnerVirtual, Node: name}
		}
		return Owner{}
	}
	if legacyHostAffinity && b.HostAffinity != nil && *b.HostAffinity != "" {
		return Owner{Kind: OwnerLegacyHost, Node: *b.HostAffinity}
	}
	return Owner{}
}

// BorrowedAddrs returns, in ordinal order, the allocated addresses whose secondary.node is set and
// differs from the owning node owner.Node (for blocks no node owns, every allocation with a node).
func BorrowedAddrs(b *Block, owner Owner) []Borrowed {
	var out []Borrowed
	ownerNode := ""
	if owner.IsNode() {
		ownerNode = owner.Node
	}
	for ord, idx := range b.Allocations {
		if idx == nil || *idx < 0 || *idx >= len(b.Attributes) {
			continue
		}
		node := b.Attributes[*idx].Secondary[AttrNode]
		if node == "" || node == ownerNode {
			continue
		}
		addr, err := OrdinalAddr(b.CIDR, ord)
		if err != nil {
			continue
		}
		out = append(out, Borrowed{Ordinal: ord, Addr: addr, Node: node})
	}
	return out
}
