package calico

import (
	"encoding/binary"
	"hash/fnv"
	"math/big"
	"math/bits"
	"math/rand"
	"net/netip"
	"slices"

	"github.com/vpp-route-agent/vpp-route-agent/internal/netaddr"
)

// u128 is an address as a 128-bit unsigned integer (IPv4 in the low 32 bits).
type u128 struct{ hi, lo uint64 }

func toU128(a netip.Addr) u128 {
	b := a.Unmap().As16()
	if a.Unmap().Is4() {
		return u128{lo: uint64(b[12])<<24 | uint64(b[13])<<16 | uint64(b[14])<<8 | uint64(b[15])}
	}
	var u u128
	for i := range 8 {
		u.hi = u.hi<<8 | uint64(b[i])
		u.lo = u.lo<<8 | uint64(b[8+i])
	}
	return u
}

func (u u128) addr(is4 bool) netip.Addr {
	if is4 {
		v := uint32(u.lo)
		return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
	}
	var b [16]byte
	for i := range 8 {
		b[7-i] = byte(u.hi >> (8 * i))
		b[15-i] = byte(u.lo >> (8 * i))
	}
	return netip.AddrFrom16(b)
}

func (u u128) add(v u128) (u128, bool) {
	lo, c := bits.Add64(u.lo, v.lo, 0)
	hi, c := bits.Add64(u.hi, v.hi, c)
	return u128{hi, lo}, c != 0
}

// sub returns u - v modulo 2^128.
func (u u128) sub(v u128) u128 {
	lo, b := bits.Sub64(u.lo, v.lo, 0)
	hi, _ := bits.Sub64(u.hi, v.hi, b)
	return u128{hi, lo}
}

func (u u128) cmp(v u128) int {
	switch {
	case u.hi < v.hi || (u.hi == v.hi && u.lo < v.lo):
		return -1
	case u == v:
		return 0
	}
	return 1
}

// pow2 returns 2^n for 0 <= n <= 127.
func pow2(n int) u128 {
	if n >= 64 {
		return u128{hi: 1 << (n - 64)}
	}
	return u128{lo: 1 << n}
}

func (u u128) shl(n int) u128 {
	switch {
	case n == 0:
		return u
	case n >= 128:
		return u128{}
	case n >= 64:
		return u128{hi: u.lo << (n - 64)}
	}
	return u128{hi: u.hi<<n | u.lo>>(64-n), lo: u.lo << n}
}

// span is the inclusive address range of a prefix.
type span struct{ first, last u128 }

func spanOf(p netip.Prefix) span {
	p = netaddr.Canonical(p)
	first := toU128(p.Addr())
	host := p.Addr().BitLen() - p.Bits()
	size := pow2(host)
	last := first
	if host > 0 {
		// last = first + size - 1; the prefix is aligned so this never overflows.
		last, _ = first.add(u128{hi: size.hi - boolU64(size.lo == 0), lo: size.lo - 1})
	}
	return span{first, last}
}

func boolU64(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// LastAddr returns the last address of the prefix p.
func LastAddr(p netip.Prefix) netip.Addr {
	return spanOf(p).last.addr(netaddr.Canonical(p).Addr().Is4())
}

// BlockStartIndex returns the index of the block-sized subnet of a pool at which a node starts its
// walk for a free block: the index Calico's randomBlockGenerator starts at (libcalico-go lib/ipam
// ipam_block_reader_writer.go: math/rand seeded with the FNV-1 hash of the node name, then a uniform
// index below the number of subnets), so that a node claims the subnet calico-ipam would claim for it.
// For a pool of more than 2^64 subnets it returns the low 64 bits; NextFreeBlock uses the whole index.
// Calico seeds blocks of a single address with the time instead; this stays deterministic.
func BlockStartIndex(node string, pool netip.Prefix, blockSize int) uint64 {
	return startIndex(node, pool, blockSize).lo
}

func startIndex(node string, pool netip.Prefix, blockSize int) u128 {
	n := blockSize - netaddr.Canonical(pool).Bits()
	if n < 0 || n > 127 {
		return u128{}
	}
	h := fnv.New32()
	h.Write([]byte(node))
	idx := new(big.Int).Rand(rand.New(rand.NewSource(int64(h.Sum32()))), new(big.Int).Lsh(big.NewInt(1), uint(n)))
	var b [16]byte
	idx.FillBytes(b[:])
	return u128{hi: binary.BigEndian.Uint64(b[:8]), lo: binary.BigEndian.Uint64(b[8:])}
}

// FreeBlock returns the first block-sized (/blockSize) subnet of pool, walking from the subnet at index
// start (see BlockStartIndex) upwards and wrapping around, that overlaps none of the prefixes in used
// (existing blocks of any size, ranges never to be handed out). ok is false when every subnet is used.
// The walk jumps over used ranges, so its cost grows with len(used), not with the size of the pool.
func FreeBlock(pool netip.Prefix, blockSize int, start uint64, used []netip.Prefix) (netip.Prefix, bool) {
	return freeBlock(pool, blockSize, u128{lo: start}, used)
}

func freeBlock(pool netip.Prefix, blockSize int, start u128, used []netip.Prefix) (netip.Prefix, bool) {
	pool = netaddr.Canonical(pool)
	is4 := pool.Addr().Is4()
	bitLen := pool.Addr().BitLen()
	if blockSize < pool.Bits() || blockSize > bitLen {
		return netip.Prefix{}, false
	}
	ps := spanOf(pool)
	// Merge the used ranges that touch the pool into sorted, disjoint spans.
	var spans []span
	for _, u := range used {
		u = netaddr.Canonical(u)
		if u.Addr().Is4() != is4 || !u.Overlaps(pool) {
			continue
		}
		spans = append(spans, spanOf(u))
	}
	slices.SortFunc(spans, func(a, b span) int { return a.first.cmp(b.first) })
	merged := spans[:0]
	for _, s := range spans {
		if n := len(merged); n > 0 {
			if next, ovf := merged[n-1].last.add(u128{lo: 1}); ovf || s.first.cmp(next) <= 0 {
				if s.last.cmp(merged[n-1].last) > 0 {
					merged[n-1].last = s.last
				}
				continue
			}
		}
		merged = append(merged, s)
	}

	hostBits := bitLen - blockSize
	step := pow2(hostBits)
	nBlocksLog := blockSize - pool.Bits()
	start = start.shl(128 - nBlocksLog).shr(128 - nBlocksLog) // modulo the number of subnets
	cand, _ := ps.first.add(start.shl(hostBits))
	origin := cand
	wrapped := false
	for {
		cs := span{cand, spanOf(netip.PrefixFrom(cand.addr(is4), blockSize)).last}
		// The merged span with the greatest first <= the candidate's last address.
		i, _ := slices.BinarySearchFunc(merged, cs.last, func(s span, t u128) int {
			if s.first.cmp(t) <= 0 {
				return -1
			}
			return 1
		})
		next, ovf := cand.add(step)
		if i > 0 && merged[i-1].last.cmp(cs.first) >= 0 {
			// Overlap: continue at the first block boundary after the used span.
			if end, o := merged[i-1].last.add(u128{lo: 1}); !o && end.cmp(next) > 0 {
				aligned, o2 := end.add(u128{hi: step.hi - boolU64(step.lo == 0), lo: step.lo - 1})
				next, ovf = alignDown(aligned, hostBits), o2
			} else if o {
				ovf = true
			}
		} else {
			return netip.PrefixFrom(cand.addr(is4), blockSize), true
		}
		if ovf || next.cmp(ps.last) > 0 {
			if wrapped {
				return netip.Prefix{}, false
			}
			wrapped, next = true, ps.first
		}
		if wrapped && next.cmp(origin) >= 0 {
			return netip.Prefix{}, false
		}
		cand = next
	}
}

// shr shifts u right by n bits.
func (u u128) shr(n int) u128 {
	switch {
	case n == 0:
		return u
	case n >= 128:
		return u128{}
	case n >= 64:
		return u128{lo: u.hi >> (n - 64)}
	}
	return u128{hi: u.hi >> n, lo: u.lo>>n | u.hi<<(64-n)}
}

// alignDown clears the low hostBits bits of u.
func alignDown(u u128, hostBits int) u128 {
	switch {
	case hostBits >= 128:
		return u128{}
	case hostBits >= 64:
		return u128{hi: u.hi &^ (1<<(hostBits-64) - 1)}
	}
	return u128{hi: u.hi, lo: u.lo &^ (1<<hostBits - 1)}
}
