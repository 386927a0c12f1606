package calico

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/internal/netaddr"
)

// Block is Calico's AllocationBlock value (key BlockKey(CIDR)). The JSON field order and names are those
// Calico v3.23-v3.31 writes; fields that only newer versions write are kept when read and omitted when
// absent, so a block read from a newer Calico and written back loses nothing routing or IPAM needs.
type Block struct {
	CIDR netip.Prefix `json:"cidr"`
	// Affinity is "host:<node>", "virtual:<name>", or nil for a block without owner.
	Affinity *string `json:"affinity"`
	// AffinityClaimTime is written by Calico v3.32+ only.
	AffinityClaimTime *time.Time `json:"affinity_claim_time,omitempty"`
	// Allocations has one entry per address of the block: nil = free, else an index into Attributes.
	Allocations []*int `json:"allocations"`
	// Unallocated is the FIFO of free ordinals: allocate from the head, release to the tail.
	Unallocated []int                 `json:"unallocated"`
	Attributes  []AllocationAttribute `json:"attributes"`
	// SequenceNumber is incremented on every write (v3.23+).
	SequenceNumber uint64 `json:"sequenceNumber"`
	// SequenceNumberForAllocation maps an allocated ordinal (decimal string) to SequenceNumber at allocation.
	// Nil in blocks written before v3.23.
	SequenceNumberForAllocation map[string]uint64 `json:"sequenceNumberForAllocation"`
	// Deleted is the Kubernetes backend's soft-delete marker: a deleted block is absent.
	Deleted bool `json:"deleted"`
	// HostAffinity is the pre-2016 owner field (a bare node name). Current Calico ignores it.
	HostAffinity *string `json:"hostAffinity,omitempty"`
}

// AllocationAttribute is shared by the allocations that point at it: the handle that holds them and
// free-form secondary attributes (namespace, pod, node, timestamp, ...).
type AllocationAttribute struct {
	HandleID  *string           `json:"handle_id"`
	Secondary map[string]string `json:"secondary"`
	// ReleasedAt marks an address in cool-down (unreleased Calico): still allocated, not reusable yet.
	ReleasedAt json.RawMessage `json:"releasedAt,omitempty"`
	// AlternateOwnerAttrs is written by Calico v3.32+; preserved verbatim.
	AlternateOwnerAttrs json.RawMessage `json:"alternateOwnerAttrs,omitempty"`
}

// Secondary attribute names Calico's CNI plugin writes.
const (
	AttrNamespace = "namespace"
	AttrPod       = "pod"
	AttrNode      = "node"
	AttrTimestamp = "timestamp"
)

// Size returns the number of addresses in the block (2^(bits-prefix)); 0 for an invalid or too large CIDR.
func Size(cidr netip.Prefix) int {
	host := cidr.Addr().BitLen() - cidr.Bits()
	if !cidr.IsValid() || host < 0 || host > 24 {
		return 0
	}
	return 1 << host
}

// DecodeBlock decodes a block value in any form Calico has written. It checks only what every consumer
// relies on (a valid CIDR); call Validate for the full invariants.
func DecodeBlock(data []byte) (*Block, error) {
	var b Block
	if err := decodeBlockValue(data, &b, &b.CIDR); err != nil {
		return nil, err
	}
	return &b, nil
}

// decodeBlockValue unmarshals a block value into v, whose cidr field is cidr, and checks the CIDR.
func decodeBlockValue(data []byte, v any, cidr *netip.Prefix) error {
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("decode block: %w", err)
	}
	if !cidr.IsValid() {
		return errors.New("decode block: missing or invalid cidr")
	}
	return nil
}

// EncodeBlock encodes a block in the form Calico v3.23-v3.31 writes: exactly what encoding/json
// writes for it (encodeBlockJSON), appended field by field. Blocks with fields of other versions
// (affinity_claim_time, releasedAt, alternateOwnerAttrs), and strings that need escaping, go through
// encoding/json itself.
func EncodeBlock(b *Block) ([]byte, error) {
	if b.Allocations == nil {
		return nil, fmt.Errorf("encode block %s: no allocations", b.CIDR)
	}
	if b.AffinityClaimTime != nil || slices.ContainsFunc(b.Attributes, func(a AllocationAttribute) bool {
		return len(a.ReleasedAt) > 0 || len(a.AlternateOwnerAttrs) > 0
	}) {
		return encodeBlockJSON(b)
	}
	buf := make([]byte, 0, 160+8*len(b.Allocations)+4*len(b.Unallocated)+300*len(b.Attributes))
	var keys []string
	buf = append(buf, `{"cidr":"`...)
	if b.CIDR.IsValid() {
		buf = b.CIDR.AppendTo(buf)
	}
	buf = append(buf, `","affinity":`...)
	buf = appendStringPtr(buf, b.Affinity)
	buf = append(buf, `,"allocations":[`...)
	for i, a := range b.Allocations {
		if i > 0 {
			buf = append(buf, ',')
		}
		if a == nil {
			buf = append(buf, "null"...)
		} else {
			buf = strconv.AppendInt(buf, int64(*a), 10)
		}
	}
	buf = append(buf, `],"unallocated":[`...)
	for i, o := range b.Unallocated {
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = strconv.AppendInt(buf, int64(o), 10)
	}
	buf = append(buf, `],"attributes":[`...)
	for i, a := range b.Attributes {
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = append(buf, `{"handle_id":`...)
		buf = appendStringPtr(buf, a.HandleID)
		buf = append(buf, `,"secondary":`...)
		if a.Secondary == nil {
			buf = append(buf, "null"...)
		} else {
			buf = append(buf, '{')
			keys = keys[:0]
			for k := range a.Secondary {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			for j, k := range keys {
				if j > 0 {
					buf = append(buf, ',')
				}
				buf = appendString(buf, k)
				buf = append(buf, ':')
				buf = appendString(buf, a.Secondary[k])
			}
			buf = append(buf, '}')
		}
		buf = append(buf, '}')
	}
	buf = append(buf, `],"sequenceNumber":`...)
	buf = strconv.AppendUint(buf, b.SequenceNumber, 10)
	buf = append(buf, `,"sequenceNumberForAllocation":{`...)
	for j, k := range slices.Sorted(maps.Keys(b.SequenceNumberForAllocation)) {
		if j > 0 {
			buf = append(buf, ',')
		}
		buf = appendString(buf, k)
		buf = append(buf, ':')
		buf = strconv.AppendUint(buf, b.SequenceNumberForAllocation[k], 10)
	}
	buf = append(buf, `},"deleted":`...)
	buf = strconv.AppendBool(buf, b.Deleted)
	if b.HostAffinity != nil {
		buf = append(buf, `,"hostAffinity":`...)
		buf = appendString(buf, *b.HostAffinity)
	}
	return append(buf, '}'), nil
}

// encodeBlockJSON is EncodeBlock by encoding/json: Calico's form, the reference of EncodeBlock.
func encodeBlockJSON(b *Block) ([]byte, error) {
	out := *b
	if out.Unallocated == nil {
		out.Unallocated = []int{}
	}
	if out.Attributes == nil {
		out.Attributes = []AllocationAttribute{}
	}
	if out.SequenceNumberForAllocation == nil {
		out.SequenceNumberForAllocation = map[string]uint64{}
	}
	return json.Marshal(&out)
}

func appendStringPtr(buf []byte, s *string) []byte {
	if s == nil {
		return append(buf, "null"...)
	}
	return appendString(buf, *s)
}

// appendString appends s as encoding/json writes it: printable ASCII other than '"', '\\', '<', '>'
// and '&' as is, anything else through encoding/json.
func appendString(buf []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s)
			return append(buf, q...)
		}
	}
	buf = append(buf, '"')
	buf = append(buf, s...)
	return append(buf, '"')
}

// NewBlock returns an empty block for cidr with the given affinity ("host:<node>" or "" for none), in the
// state Calico creates: every ordinal free in order, sequence number seq (Calico uses time.Now().UnixNano()).
func NewBlock(cidr netip.Prefix, affinity string, seq uint64) *Block {
	cidr = netaddr.Canonical(cidr)
	n := Size(cidr)
	b := &Block{
		CIDR:                        cidr,
		Allocations:                 make([]*int, n),
		Unallocated:                 make([]int, n),
		Attributes:                  []AllocationAttribute{},
		SequenceNumber:              seq,
		SequenceNumberForAllocation: map[string]uint64{},
	}
	if affinity != "" {
		b.Affinity = &affinity
	}
	for i := range b.Unallocated {
		b.Unallocated[i] = i
	}
	return b
}

// InvariantError names the first block invariant that does not hold.
type InvariantError struct {
	CIDR      netip.Prefix
	Invariant string
}

func (e *InvariantError) Error() string {
	return fmt.Sprintf("block %s: invariant broken: %s", e.CIDR, e.Invariant)
}

// Validate checks the invariants of a well-formed block and returns an *InvariantError naming the first
// one broken: a canonical CIDR; len(allocations) == 2^(bits-prefix); allocated and unallocated ordinals
// are disjoint and together cover every ordinal exactly once; every attribute index is valid and every
// attribute is referenced; every key of sequenceNumberForAllocation is an ordinal of the block.
//
// The sequence map is not required to match the allocations, in either direction, because Calico's own
// writes do not keep it so: its CNI DEL (releaseByHandle in libcalico-go lib/ipam/ipam_block.go, every
// version v3.23 to v3.31) leaves the entry of every ordinal it frees, and a block written before v3.23
// gets a map holding only the ordinals allocated since (SetSequenceNumberForOrdinal in
// lib/backend/model/block.go creates it on first use). A reader that rejected either form could
// neither release nor assign in most blocks of a real cluster.
func (b *Block) Validate() error {
	fail := func(format string, args ...any) error {
		return &InvariantError{CIDR: b.CIDR, Invariant: fmt.Sprintf(format, args...)}
	}
	if b.CIDR != netaddr.Canonical(b.CIDR) {
		return fail("cidr is not canonical (host bits set or IPv4-mapped)")
	}
	n := Size(b.CIDR)
	if n == 0 {
		return fail("block size 2^%d is out of range", b.CIDR.Addr().BitLen()-b.CIDR.Bits())
	}
	if len(b.Allocations) != n {
		return fail("len(allocations) = %d, want %d", len(b.Allocations), n)
	}
	referenced := make([]bool, len(b.Attributes))
	allocated := 0
	for ord, a := range b.Allocations {
		if a == nil {
			continue
		}
		allocated++
		if *a < 0 || *a >= len(b.Attributes) {
			return fail("allocations[%d] = %d is not an attribute index (have %d)", ord, *a, len(b.Attributes))
		}
		referenced[*a] = true
	}
	seen := make([]bool, n)
	for _, ord := range b.Unallocated {
		if ord < 0 || ord >= n {
			return fail("unallocated ordinal %d out of range", ord)
		}
		if seen[ord] {
			return fail("unallocated ordinal %d listed twice", ord)
		}
		seen[ord] = true
		if b.Allocations[ord] != nil {
			return fail("ordinal %d is both allocated and unallocated", ord)
		}
	}
	if allocated+len(b.Unallocated) != n {
		for ord := range n {
			if b.Allocations[ord] == nil && !seen[ord] {
				return fail("ordinal %d is neither allocated nor unallocated", ord)
			}
		}
	}
	for i, r := range referenced {
		if !r {
			return fail("attribute %d is not referenced by any allocation", i)
		}
	}
	for k := range b.SequenceNumberForAllocation {
		ord, err := strconv.Atoi(k)
		if err != nil || ord < 0 || ord >= n || strconv.Itoa(ord) != k {
			return fail("sequenceNumberForAllocation key %q is not an ordinal", k)
		}
	}
	return nil
}

// Allocated reports the number of allocated ordinals.
func (b *Block) Allocated() int {
	n := 0
	for _, a := range b.Allocations {
		if a != nil {
			n++
		}
	}
	return n
}

// AttributeOf returns the attribute of an allocated ordinal, or nil if the ordinal is free or invalid.
func (b *Block) AttributeOf(ord int) *AllocationAttribute {
	if ord < 0 || ord >= len(b.Allocations) || b.Allocations[ord] == nil {
		return nil
	}
	i := *b.Allocations[ord]
	if i < 0 || i >= len(b.Attributes) {
		return nil
	}
	return &b.Attributes[i]
}

// Handle returns the attribute's handle ID, or "" when it has none.
func (a *AllocationAttribute) Handle() string {
	if a == nil || a.HandleID == nil {
		return ""
	}
	return *a.HandleID
}

// SanitizeHandle returns a handle ID as Calico compares it: up to its first carriage return. Host-local
// to Calico IPAM migrations wrote such malformed handles into blocks (sanitizeHandle in libcalico-go
// lib/ipam/ipam_block.go, cni-plugin issue 821).
func SanitizeHandle(id string) string {
	id, _, _ = strings.Cut(id, "\r")
	return id
}

// HeldBy reports whether the attribute's handle is id, as Calico compares handles (SanitizeHandle).
func (a *AllocationAttribute) HeldBy(id string) bool {
	return a != nil && SanitizeHandle(a.Handle()) == id
}

// Clone returns a deep copy of the block (raw JSON fields of other Calico versions are shared: they
// are never changed in place).
func (b *Block) Clone() *Block {
	c := *b
	if b.Affinity != nil {
		a := *b.Affinity
		c.Affinity = &a
	}
	if b.AffinityClaimTime != nil {
		t := *b.AffinityClaimTime
		c.AffinityClaimTime = &t
	}
	if b.HostAffinity != nil {
		h := *b.HostAffinity
		c.HostAffinity = &h
	}
	c.Allocations = make([]*int, len(b.Allocations))
	for i, p := range b.Allocations {
		if p != nil {
			v := *p
			c.Allocations[i] = &v
		}
	}
	c.Unallocated = slices.Clone(b.Unallocated)
	c.Attributes = make([]AllocationAttribute, len(b.Attributes))
	for i, a := range b.Attributes {
		if a.HandleID != nil {
			h := *a.HandleID
			a.HandleID = &h
		}
		a.Secondary = maps.Clone(a.Secondary)
		c.Attributes[i] = a
	}
	c.SequenceNumberForAllocation = maps.Clone(b.SequenceNumberForAllocation)
	return &c
}
