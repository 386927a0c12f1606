package blockwatch

import (
	"fmt"
	"iter"
	"net/netip"
)

// numShards is the number of maps Blocks spreads its blocks over: a change copies one of them (about
// 400 entries at 100,000 blocks) instead of the whole set.
const numShards = 256

// Blocks is an immutable set of blocks by CIDR, as a snapshot hands it out. Successive snapshots share
// the parts that did not change, so that a change costs the Watcher O(blocks / numShards), not
// O(blocks). The zero Blocks is empty.
type Blocks struct {
	shards *[numShards]map[netip.Prefix]*Block
	n      int
}

// BlocksOf returns the Blocks holding the blocks of m (for consumers that build snapshots, such as
// tests). m is not retained.
func BlocksOf(m map[netip.Prefix]*Block) Blocks {
	var s blockSet
	for cidr, b := range m {
		s.set(cidr, b)
	}
	return s.freeze()
}

// Get returns the block of cidr, nil if there is none.
func (bs Blocks) Get(cidr netip.Prefix) *Block {
	if bs.shards == nil {
		return nil
	}
	return bs.shards[shardOf(cidr)][cidr]
}

// Lookup returns the block of cidr and whether there is one.
func (bs Blocks) Lookup(cidr netip.Prefix) (*Block, bool) {
	if bs.shards == nil {
		return nil, false
	}
	b, ok := bs.shards[shardOf(cidr)][cidr]
	return b, ok
}

// String formats the blocks as a map (for test failures and logs).
func (bs Blocks) String() string { return fmt.Sprint(bs.Map()) }

// Len returns the number of blocks.
func (bs Blocks) Len() int { return bs.n }

// All yields every block, in no particular order.
func (bs Blocks) All() iter.Seq2[netip.Prefix, *Block] {
	return func(yield func(netip.Prefix, *Block) bool) {
		if bs.shards == nil {
			return
		}
		for _, m := range bs.shards {
			for cidr, b := range m {
				if !yield(cidr, b) {
					return
				}
			}
		}
	}
}

// Map returns the blocks as a new map.
func (bs Blocks) Map() map[netip.Prefix]*Block {
	m := make(map[netip.Prefix]*Block, bs.n)
	for cidr, b := range bs.All() {
		m[cidr] = b
	}
	return m
}

// shardOf spreads CIDRs over the shards (blocks are contiguous ranges, so every address byte counts).
func shardOf(p netip.Prefix) int {
	a := p.Addr().As16()
	h := uint32(p.Bits())
	for _, b := range a {
		h = h*31 + uint32(b)
	}
	return int(h % numShards)
}

// blockSet is the Watcher's mutable set of blocks, copy-on-write per shard: freeze hands the current
// shards out, and the next write to a shard copies it first.
type blockSet struct {
	shards [numShards]map[netip.Prefix]*Block
	shared [numShards]bool
	n      int
}

func (s *blockSet) get(cidr netip.Prefix) (*Block, bool) {
	b, ok := s.shards[shardOf(cidr)][cidr]
	return b, ok
}

// writable returns the shard of cidr, copied first if a snapshot shares it.
func (s *blockSet) writable(cidr netip.Prefix) map[netip.Prefix]*Block {
	i := shardOf(cidr)
	switch {
	case s.shards[i] == nil:
		s.shards[i] = map[netip.Prefix]*Block{}
	case s.shared[i]:
		m := make(map[netip.Prefix]*Block, len(s.shards[i])+1)
		for k, v := range s.shards[i] {
			m[k] = v
		}
		s.shards[i] = m
	}
	s.shared[i] = false
	return s.shards[i]
}

// grow makes room for about n blocks in the shards not created yet: their average share (a hint
// with room to spare above it would double each shard's table: 5 MB more at 100,000 blocks).
func (s *blockSet) grow(n int) {
	for i := range s.shards {
		if s.shards[i] == nil {
			s.shards[i] = make(map[netip.Prefix]*Block, n/numShards)
		}
	}
}

func (s *blockSet) set(cidr netip.Prefix, b *Block) {
	m := s.writable(cidr)
	if _, ok := m[cidr]; !ok {
		s.n++
	}
	m[cidr] = b
}

func (s *blockSet) delete(cidr netip.Prefix) {
	if _, ok := s.get(cidr); !ok {
		return
	}
	delete(s.writable(cidr), cidr)
	s.n--
}

// freeze returns the current blocks; from now on every shard is shared.
func (s *blockSet) freeze() Blocks {
	shards := s.shards
	for i := range s.shared {
		s.shared[i] = true
	}
	return Blocks{shards: &shards, n: s.n}
}
