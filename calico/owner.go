package calico

import (
	"bytes"
	"encoding/json"
	"fmt"
	"iter"
	"math"
	"net/netip"
	"strconv"
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
	return ownerOf(b.Affinity, b.HostAffinity, b.Deleted, legacyHostAffinity)
}

func ownerOf(affinity, hostAffinity *string, deleted, legacyHostAffinity bool) Owner {
	if deleted {
		return Owner{}
	}
	if affinity != nil {
		a := *affinity
		if node, ok := strings.CutPrefix(a, "host:"); ok && node != "" {
			return Owner{Kind: OwnerHost, Node: node}
		}
		if name, ok := strings.CutPrefix(a, "virtual:"); ok && name != "" {
			return Owner{Kind: OwnerVirtual, Node: name}
		}
		return Owner{}
	}
	if legacyHostAffinity && hostAffinity != nil && *hostAffinity != "" {
		return Owner{Kind: OwnerLegacyHost, Node: *hostAffinity}
	}
	return Owner{}
}

// BorrowedAddrs returns, in ordinal order, the allocated addresses whose secondary.node is set and
// differs from the owning node owner.Node (for blocks no node owns, every allocation with a node).
func BorrowedAddrs(b *Block, owner Owner) []Borrowed {
	allocated := func(yield func(ord, idx int) bool) {
		for ord, idx := range b.Allocations {
			if idx != nil && !yield(ord, *idx) {
				return
			}
		}
	}
	return borrowed(b.CIDR, allocated, len(b.Attributes), owner, func(i int) string { return b.Attributes[i].Secondary[AttrNode] })
}

// borrowed is BorrowedAddrs over the allocated ordinals with their attribute index, in ordinal order,
// and n attributes, nodeOf(i) naming attribute i's node.
func borrowed(cidr netip.Prefix, allocated iter.Seq2[int, int], n int, owner Owner, nodeOf func(int) string) []Borrowed {
	var out []Borrowed
	ownerNode := ""
	if owner.IsNode() {
		ownerNode = owner.Node
	}
	for ord, i := range allocated {
		if i < 0 || i >= n {
			continue
		}
		node := nodeOf(i)
		if node == "" || node == ownerNode {
			continue
		}
		addr, err := OrdinalAddr(cidr, ord)
		if err != nil {
			continue
		}
		out = append(out, Borrowed{Ordinal: ord, Addr: addr, Node: node})
	}
	return out
}

// Routing is the part of a block value that routing reads: its CIDR, owner, and which node each
// allocation belongs to. DecodeRouting skips everything else (handles, the other secondary attributes,
// the free list, sequence numbers, timestamps) without allocating for it.
type Routing struct {
	CIDR         netip.Prefix       `json:"cidr"`
	Affinity     *string            `json:"affinity"`
	Allocations  allocations        `json:"allocations"`
	Attributes   []routingAttribute `json:"attributes"`
	Deleted      bool               `json:"deleted"`
	HostAffinity *string            `json:"hostAffinity"`
}

type routingAttribute struct {
	Secondary secondaryNode `json:"secondary"`
}

// secondaryNode is the node of a secondary attributes object. Calico reads that object as a map, whose
// "node" key matches exactly, where a Go struct field would match "Node" or "NODE" too: an object
// naming the node once, exactly and without escapes is read into a struct (no allocation for the other
// attributes), any other as a map.
type secondaryNode string

func (s *secondaryNode) UnmarshalJSON(data []byte) error {
	if exactNodeKey(data) {
		var v struct {
			Node string `json:"node"`
		}
		err := json.Unmarshal(data, &v)
		*s = secondaryNode(v.Node)
		return err
	}
	var m map[string]string
	err := json.Unmarshal(data, &m)
	*s = secondaryNode(m[AttrNode])
	return err
}

// exactNodeKey reports whether data has no escape and at most one `"node"` in any letter case, exactly
// so written.
func exactNodeKey(data []byte) bool {
	if bytes.IndexByte(data, '\\') >= 0 {
		return false
	}
	const key = `"node"`
	seen := 0
	for i := 0; i+len(key) <= len(data); i++ {
		if data[i] == '"' && bytes.EqualFold(data[i:i+len(key)], []byte(key)) {
			if seen++; seen > 1 || string(data[i:i+len(key)]) != key {
				return false
			}
		}
	}
	return true
}

// DecodeRouting decodes the routing part of a block value. Like DecodeBlock it fails on a value that is
// not JSON or has no valid CIDR, and on a wrongly typed field it reads; unlike it, it does not look at
// the types of the fields it skips. Values as Calico writes them are read in one pass (scanRouting),
// any other with encoding/json.
func DecodeRouting(data []byte) (*Routing, error) {
	var r Routing
	if scanRouting(data, &r) {
		return &r, nil
	}
	r = Routing{}
	if err := decodeBlockValue(data, &r, &r.CIDR); err != nil {
		return nil, err
	}
	return &r, nil
}

// Owner is OwnerOf the block r was decoded from.
func (r *Routing) Owner(legacyHostAffinity bool) Owner {
	return ownerOf(r.Affinity, r.HostAffinity, r.Deleted, legacyHostAffinity)
}

// Borrowed is BorrowedAddrs of the block r was decoded from.
func (r *Routing) Borrowed(owner Owner) []Borrowed {
	allocated := func(yield func(ord, idx int) bool) {
		for _, a := range r.Allocations {
			if !yield(int(a.ord), int(a.idx)) {
				return
			}
		}
	}
	return borrowed(r.CIDR, allocated, len(r.Attributes), owner, func(i int) string { return string(r.Attributes[i].Secondary) })
}

// allocations are a block's allocated ordinals with their attribute index, read without reflection:
// decoded as []*int (a pointer per allocation, the slice grown as it is read) the array was a third of
// the bytes a list allocated. Free ordinals (null) are not kept.
type allocations []allocation

type allocation struct{ ord, idx int32 }

// UnmarshalJSON reads an array of nulls and integers; json.Unmarshal has checked that data is JSON. An
// index that is negative or beyond int32 is kept as -1: out of range, like any index past the attributes.
func (a *allocations) UnmarshalJSON(data []byte) error {
	data = bytes.TrimSpace(data)
	if string(data) == "null" {
		return nil
	}
	inner, ok := bytes.CutPrefix(data, []byte("["))
	if inner, ok = bytes.CutSuffix(inner, []byte("]")); !ok {
		return fmt.Errorf("allocations: want an array, got %.20s", data)
	}
	if len(bytes.TrimSpace(inner)) == 0 {
		return nil
	}
	var out allocations
	ord := int32(0)
	for f := range bytes.SplitSeq(inner, []byte(",")) {
		f = bytes.TrimSpace(f)
		if string(f) != "null" {
			v, err := strconv.ParseInt(string(f), 10, 64)
			if err != nil {
				return fmt.Errorf("allocations: element %.20q is neither null nor an integer", f)
			}
			if v < 0 || v > math.MaxInt32 {
				v = -1
			}
			out = append(out, allocation{ord: ord, idx: int32(v)})
		}
		ord++
	}
	*a = out
	return nil
}
