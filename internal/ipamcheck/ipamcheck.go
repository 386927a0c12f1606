// Package ipamcheck verifies that a Calico IPAM datastore is consistent: every block satisfies
// Calico's invariants, no two blocks overlap, no address is held twice, every handle's counts match
// the allocations in the blocks, and affinities agree with the blocks' owners. Tests of block-ipam and
// the lab run it after every scenario.
package ipamcheck

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
)

// Allocation is one allocated address found in a block.
type Allocation struct {
	Addr    netip.Addr
	Block   netip.Prefix
	Ordinal int
	Handle  string
	// Node is the allocation's secondary "node" attribute (the borrowing node for a borrowed address).
	Node string
	// Owner is the node owning the block (felix's rule), "" when no node does.
	Owner     string
	Secondary map[string]string
}

// Snapshot is the IPAM state read at one revision.
type Snapshot struct {
	Revision   int64
	Blocks     map[netip.Prefix]*calico.Block
	Handles    map[string]*calico.Handle
	Affinities map[string]calico.AffinityValue // key -> value, host affinities only
	// Allocations lists every allocated address, sorted by address.
	Allocations []Allocation
}

// Options relax checks that real Calico data may legitimately fail.
type Options struct {
	// AllowStaleAffinities accepts affinity keys that are not confirmed or have no matching block
	// (Calico leaves such keys behind: issues #4471, #6867). block-ipam never does.
	AllowStaleAffinities bool
	// AllowMissingAffinities accepts blocks owned by a node without a confirmed affinity key.
	AllowMissingAffinities bool
}

// Read takes a snapshot of every IPAM key through c in one read.
func Read(ctx context.Context, c *clientv3.Client) (*Snapshot, map[string][]byte, error) {
	resp, err := c.Get(ctx, calico.IPAMPrefix, clientv3.WithPrefix())
	if err != nil {
		return nil, nil, fmt.Errorf("read %s: %w", calico.IPAMPrefix, err)
	}
	kvs := make(map[string][]byte, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		kvs[string(kv.Key)] = kv.Value
	}
	s, err := Parse(kvs)
	if s != nil {
		s.Revision = resp.Header.Revision
	}
	return s, kvs, err
}

// MustRead is Read for tests: it fails t when etcd cannot be read within 10 s.
func MustRead(t testing.TB, c *clientv3.Client) *Snapshot {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, _, err := Read(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Check reads the datastore through c and returns every broken invariant, joined; nil means
// consistent.
func Check(ctx context.Context, c *clientv3.Client, opts Options) error {
	s, _, err := Read(ctx, c)
	if err != nil {
		return err
	}
	return s.Check(opts)
}

// Parse decodes a snapshot of IPAM keys. Keys or values that cannot be decoded are errors (joined);
// the snapshot holds everything else.
func Parse(kvs map[string][]byte) (*Snapshot, error) {
	s := &Snapshot{Blocks: map[netip.Prefix]*calico.Block{}, Handles: map[string]*calico.Handle{},
		Affinities: map[string]calico.AffinityValue{}}
	var errs []error
	keys := make([]string, 0, len(kvs))
	for k := range kvs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, key := range keys {
		val := kvs[key]
		k, err := calico.ParseKey(key)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		switch k.Kind {
		case calico.KindBlock:
			b, err := calico.DecodeBlock(val)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", key, err))
				continue
			}
			if b.CIDR != k.CIDR {
				errs = append(errs, fmt.Errorf("%s: value cidr %s differs from the key", key, b.CIDR))
			}
			if !b.Deleted {
				s.Blocks[k.CIDR] = b
			}
		case calico.KindHandle:
			h, err := calico.DecodeHandle(val)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", key, err))
				continue
			}
			if !h.Deleted {
				s.Handles[k.Name] = h
			}
		case calico.KindHostAffinity:
			a, err := calico.DecodeAffinity(val)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", key, err))
				continue
			}
			s.Affinities[key] = a
		}
	}
	for cidr, b := range s.Blocks {
		owner := calico.OwnerOf(b, false)
		for ord := range b.Allocations {
			a := b.AttributeOf(ord)
			if a == nil {
				continue
			}
			addr, err := calico.OrdinalAddr(cidr, ord)
			if err != nil {
				continue
			}
			al := Allocation{Addr: addr, Block: cidr, Ordinal: ord, Handle: a.Handle(), Node: a.Secondary[calico.AttrNode], Secondary: a.Secondary}
			if owner.IsNode() {
				al.Owner = owner.Node
			}
			s.Allocations = append(s.Allocations, al)
		}
	}
	slices.SortFunc(s.Allocations, func(a, b Allocation) int { return a.Addr.Compare(b.Addr) })
	return s, errors.Join(errs...)
}

// Check verifies the snapshot's invariants and returns every violation, joined.
func (s *Snapshot) Check(opts Options) error {
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }

	cidrs := make([]netip.Prefix, 0, len(s.Blocks))
	for cidr, b := range s.Blocks {
		cidrs = append(cidrs, cidr)
		if err := b.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	// No two blocks overlap: sorted by first address (shorter prefix first), a block overlaps an
	// earlier one exactly when it starts at or before the furthest last address seen so far.
	slices.SortFunc(cidrs, netip.Prefix.Compare)
	var far netip.Addr
	var farBlock netip.Prefix
	for _, c := range cidrs {
		if far.IsValid() && c.Addr().Is4() == far.Is4() && c.Addr().Compare(far) <= 0 {
			fail("blocks %s and %s overlap", farBlock, c)
		}
		if last := calico.LastAddr(c); !far.IsValid() || last.Is4() != far.Is4() || last.Compare(far) > 0 {
			far, farBlock = last, c
		}
	}

	// No address held twice (blocks may still overlap if the check above failed).
	for i := 1; i < len(s.Allocations); i++ {
		if s.Allocations[i].Addr == s.Allocations[i-1].Addr {
			fail("address %s is held twice: by %q in %s and by %q in %s", s.Allocations[i].Addr,
				s.Allocations[i-1].Handle, s.Allocations[i-1].Block, s.Allocations[i].Handle, s.Allocations[i].Block)
		}
	}

	// Handles match the blocks in both directions.
	held := map[string]map[string]int{} // handle -> block -> count
	for _, a := range s.Allocations {
		if a.Handle == "" {
			continue
		}
		if held[a.Handle] == nil {
			held[a.Handle] = map[string]int{}
		}
		held[a.Handle][a.Block.String()]++
	}
	for id, h := range s.Handles {
		for blk, n := range h.Block {
			if got := held[id][blk]; got != n {
				fail("handle %s counts %d addresses in %s, the block holds %d", id, n, blk, got)
			}
		}
		if len(h.Block) == 0 {
			fail("handle %s holds nothing but exists", id)
		}
	}
	for id, blocks := range held {
		h := s.Handles[id]
		for blk, n := range blocks {
			if h == nil || h.Block[blk] != n {
				fail("block %s holds %d addresses of handle %s, which does not count them", blk, n, id)
			}
		}
	}

	// Affinities agree with the blocks' owners.
	for key, a := range s.Affinities {
		k, _ := calico.ParseKey(key)
		b := s.Blocks[k.CIDR]
		switch {
		case opts.AllowStaleAffinities:
		case a.State != calico.AffinityConfirmed || a.Deleted:
			fail("affinity %s is %q (deleted=%v), not confirmed", key, a.State, a.Deleted)
		case b == nil:
			fail("affinity %s has no block", key)
		case calico.OwnerOf(b, false).Node != k.Name:
			fail("affinity %s names node %s, the block's affinity is %v", key, k.Name, strOrNil(b.Affinity))
		}
	}
	if !opts.AllowMissingAffinities {
		for cidr, b := range s.Blocks {
			o := calico.OwnerOf(b, false)
			if o.Kind != calico.OwnerHost {
				continue
			}
			key := calico.HostAffinityKey(o.Node, cidr)
			if a, ok := s.Affinities[key]; !ok || a.State != calico.AffinityConfirmed {
				fail("block %s is owned by %s without a confirmed affinity %s", cidr, o.Node, key)
			}
		}
	}
	sortErrs(errs)
	return errors.Join(errs...)
}

func strOrNil(s *string) string {
	if s == nil {
		return "null"
	}
	return *s
}

func sortErrs(errs []error) {
	slices.SortFunc(errs, func(a, b error) int { return strings.Compare(a.Error(), b.Error()) })
}
