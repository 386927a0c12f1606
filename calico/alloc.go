package calico

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/netip"
	"strconv"

	"github.com/vpp-route-agent/vpp-route-agent/internal/netaddr"
)

// This file holds the pure allocation operations on a block and a handle, as Calico's libcalico-go
// ipam_block.go performs them: FIFO assignment from the head of unallocated, release to its tail,
// attribute sharing and compaction, and per-allocation sequence numbers. Callers write the block back
// with one conditional etcd write per change and call BumpSequence once before that write.

// AssignError reports a specific address that cannot be assigned.
type AssignError struct {
	CIDR    netip.Prefix
	Ordinal int
	Reason  string
}

func (e *AssignError) Error() string {
	return fmt.Sprintf("block %s ordinal %d: %s", e.CIDR, e.Ordinal, e.Reason)
}

// Free reports the number of free ordinals of the block whose address skip does not reject (skip may
// be nil).
func (b *Block) Free(skip func(netip.Addr) bool) int {
	if skip == nil {
		return len(b.Unallocated)
	}
	n := 0
	for _, ord := range b.Unallocated {
		if a, err := OrdinalAddr(b.CIDR, ord); err == nil && !skip(a) {
			n++
		}
	}
	return n
}

// AutoAssign assigns up to n free ordinals to attr, taking them from the head of the unallocated FIFO
// and passing over (leaving in place) ordinals whose address skip rejects. It returns the ordinals
// assigned, fewer than n when the block runs out.
func (b *Block) AutoAssign(n int, attr AllocationAttribute, skip func(netip.Addr) bool) []int {
	var picked []int
	rest := b.Unallocated[:0:0]
	for _, ord := range b.Unallocated {
		if len(picked) < n {
			a, err := OrdinalAddr(b.CIDR, ord)
			if err == nil && (skip == nil || !skip(a)) {
				picked = append(picked, ord)
				continue
			}
		}
		rest = append(rest, ord)
	}
	if len(picked) == 0 {
		return nil
	}
	b.Unallocated = rest
	idx := b.attributeIndex(attr)
	b.ensureSequenceMap()
	for _, ord := range picked {
		b.Allocations[ord] = &idx
		b.SequenceNumberForAllocation[strconv.Itoa(ord)] = b.SequenceNumber
	}
	return picked
}

// Assign assigns the specific free ordinal ord to attr; it fails with an *AssignError when ord is out
// of range or already allocated.
func (b *Block) Assign(ord int, attr AllocationAttribute) error {
	if ord < 0 || ord >= len(b.Allocations) {
		return &AssignError{CIDR: b.CIDR, Ordinal: ord, Reason: "out of range"}
	}
	if b.Allocations[ord] != nil {
		return &AssignError{CIDR: b.CIDR, Ordinal: ord, Reason: "already allocated"}
	}
	pos := -1
	for i, u := range b.Unallocated {
		if u == ord {
			pos = i
			break
		}
	}
	if pos < 0 {
		return &AssignError{CIDR: b.CIDR, Ordinal: ord, Reason: "not in unallocated"}
	}
	b.Unallocated = append(b.Unallocated[:pos:pos], b.Unallocated[pos+1:]...)
	idx := b.attributeIndex(attr)
	b.ensureSequenceMap()
	b.Allocations[ord] = &idx
	b.SequenceNumberForAllocation[strconv.Itoa(ord)] = b.SequenceNumber
	return nil
}

// Release frees the allocated ordinals ords: each goes to the tail of the unallocated FIFO (in the
// order given), loses its sequence entry, and attributes no longer referenced are removed with the
// remaining indexes renumbered. Nothing changes when an ordinal is out of range, free, or repeated.
func (b *Block) Release(ords ...int) error {
	seen := make(map[int]bool, len(ords))
	for _, ord := range ords {
		if ord < 0 || ord >= len(b.Allocations) {
			return &AssignError{CIDR: b.CIDR, Ordinal: ord, Reason: "out of range"}
		}
		if b.Allocations[ord] == nil {
			return &AssignError{CIDR: b.CIDR, Ordinal: ord, Reason: "not allocated"}
		}
		if seen[ord] {
			return &AssignError{CIDR: b.CIDR, Ordinal: ord, Reason: "released twice"}
		}
		seen[ord] = true
	}
	for _, ord := range ords {
		b.Allocations[ord] = nil
		b.Unallocated = append(b.Unallocated, ord)
		delete(b.SequenceNumberForAllocation, strconv.Itoa(ord))
	}
	b.compactAttributes()
	return nil
}

// BumpSequence increments the block's sequence number; Calico does it once on every write, after the
// allocations of that write took the previous value.
func (b *Block) BumpSequence() { b.SequenceNumber++ }

// SequenceOf returns the sequence number recorded when ord was allocated, and false if there is none.
func (b *Block) SequenceOf(ord int) (uint64, bool) {
	s, ok := b.SequenceNumberForAllocation[strconv.Itoa(ord)]
	return s, ok
}

// Ordinals returns, in ordinal order, the allocated ordinals whose attribute match accepts.
func (b *Block) Ordinals(match func(*AllocationAttribute) bool) []int {
	var out []int
	for ord := range b.Allocations {
		if a := b.AttributeOf(ord); a != nil && match(a) {
			out = append(out, ord)
		}
	}
	return out
}

// attributeIndex returns the index of an attribute equal to attr, appending attr when there is none
// (Calico's findOrAddAttribute).
func (b *Block) attributeIndex(attr AllocationAttribute) int {
	for i := range b.Attributes {
		a := &b.Attributes[i]
		if a.Handle() == attr.Handle() && (a.HandleID == nil) == (attr.HandleID == nil) &&
			maps.Equal(a.Secondary, attr.Secondary) && len(a.ReleasedAt) == 0 && len(a.AlternateOwnerAttrs) == 0 &&
			len(attr.ReleasedAt) == 0 && len(attr.AlternateOwnerAttrs) == 0 {
			return i
		}
	}
	attr.Secondary = maps.Clone(attr.Secondary)
	b.Attributes = append(b.Attributes, attr)
	return len(b.Attributes) - 1
}

// ensureSequenceMap creates the per-allocation sequence map of a block written before Calico v3.23,
// recording the current sequence number for the allocations it already has so that the map's keys stay
// exactly the allocated ordinals.
func (b *Block) ensureSequenceMap() {
	if b.SequenceNumberForAllocation != nil {
		return
	}
	b.SequenceNumberForAllocation = map[string]uint64{}
	for ord, a := range b.Allocations {
		if a != nil {
			b.SequenceNumberForAllocation[strconv.Itoa(ord)] = b.SequenceNumber
		}
	}
}

// compactAttributes removes attributes no allocation references and renumbers the allocations.
func (b *Block) compactAttributes() {
	used := make([]bool, len(b.Attributes))
	for _, a := range b.Allocations {
		if a != nil && *a >= 0 && *a < len(used) {
			used[*a] = true
		}
	}
	remap := make([]int, len(b.Attributes))
	kept := b.Attributes[:0:0]
	for i, u := range used {
		remap[i] = len(kept)
		if u {
			kept = append(kept, b.Attributes[i])
		}
	}
	if len(kept) == len(b.Attributes) {
		return
	}
	b.Attributes = kept
	for ord, a := range b.Allocations {
		if a != nil && *a >= 0 && *a < len(remap) {
			n := remap[*a]
			b.Allocations[ord] = &n
		}
	}
}

// NewHandle returns an empty handle value.
func NewHandle() *Handle { return &Handle{Block: map[string]int{}} }

// Add records n more addresses of the block cidr held by the handle.
func (h *Handle) Add(cidr netip.Prefix, n int) {
	if h.Block == nil {
		h.Block = map[string]int{}
	}
	h.Block[netaddr.Canonical(cidr).String()] += n
}

// Remove records that the handle no longer holds n addresses of the block cidr, dropping the block
// from the handle when none remain. A count that would go negative becomes zero: the handle is
// corrected to what the blocks hold rather than refused.
func (h *Handle) Remove(cidr netip.Prefix, n int) {
	k := netaddr.Canonical(cidr).String()
	if h.Block[k] <= n {
		delete(h.Block, k)
		return
	}
	h.Block[k] -= n
}

// EncodeHandle encodes a handle value as Calico writes it.
func EncodeHandle(h *Handle) ([]byte, error) {
	out := *h
	if out.Block == nil {
		out.Block = map[string]int{}
	}
	return json.Marshal(&out)
}

// EncodeAffinity encodes an affinity value as Calico writes it.
func EncodeAffinity(v AffinityValue) ([]byte, error) { return json.Marshal(v) }
