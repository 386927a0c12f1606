// Package netaddr is the project's one vocabulary for IP addresses and prefixes: the address family,
// the canonical form of a prefix and of an address, the order prefixes are listed in, and "prefix p
// covers prefix q". Every package that needs one of these uses this one; it imports only the standard
// library, so that the lowest packages (calico, vppapi, the simulator) can.
//
//   - Family is V4 or V6; its String is "ipv4" or "ipv6", the word Calico uses in its keys
//     (/calico/ipam/v2/assignment/ipv4/...), the agent in its registration keys (peerip/ipv4/1) and
//     block-ipam in its settings. It indexes per-family arrays ([2]T).
//   - Canonical(p) is p unmapped (an IPv4-mapped IPv6 prefix of length 96 or more becomes IPv4) and
//     masked: the form prefixes are compared, keyed and written in. CanonicalAddr(a) is a unmapped
//     and without zone.
//   - The order of prefixes is netip.Prefix.Compare: IPv4 before IPv6, then by address, then by
//     length, so that a block comes right after the pool that holds it. On canonical prefixes it is
//     the "address, then length" order the packages each wrote out before; it differs only on
//     prefixes with host bits set, which it orders by their masked address first.
//   - Covers(p, q) reports whether every address of q lies in p.
package netaddr

import "net/netip"

// Family is an address family.
type Family int

// The two address families, in the order the project lists them.
const (
	V4 Family = iota
	V6
)

// Families are the two address families, IPv4 first.
var Families = [2]Family{V4, V6}

// FamilyOf returns the family of a; an IPv4-mapped IPv6 address is IPv4.
func FamilyOf(a netip.Addr) Family {
	if a.Unmap().Is4() {
		return V4
	}
	return V6
}

// PrefixFamily returns the family of p's canonical form (Canonical).
func PrefixFamily(p netip.Prefix) Family {
	if Unmap(p).Addr().Is4() {
		return V4
	}
	return V6
}

// FamilyFor returns V6 if v6, else V4.
func FamilyFor(v6 bool) Family {
	if v6 {
		return V6
	}
	return V4
}

// ParseFamily returns the family named "ipv4" or "ipv6"; false for any other word.
func ParseFamily(s string) (Family, bool) {
	switch s {
	case "ipv4":
		return V4, true
	case "ipv6":
		return V6, true
	}
	return 0, false
}

// String returns "ipv4" or "ipv6".
func (f Family) String() string {
	if f == V6 {
		return "ipv6"
	}
	return "ipv4"
}

// Canonical returns p unmapped and masked. An IPv4-mapped IPv6 prefix of length 96 or more becomes
// IPv4 (::ffff:10.0.0.0/104 is 10.0.0.0/8); a shorter one also holds addresses that are not mapped and
// stays IPv6. An invalid prefix stays invalid.
func Canonical(p netip.Prefix) netip.Prefix { return Unmap(p).Masked() }

// Unmap returns p with an IPv4-mapped IPv6 address of length 96 or more turned into IPv4, its length
// reduced by 96, host bits kept: an interface address, where the host bits are the address.
func Unmap(p netip.Prefix) netip.Prefix {
	if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
		return netip.PrefixFrom(a.Unmap(), p.Bits()-96)
	}
	return p
}

// CanonicalAddr returns a unmapped and without zone.
func CanonicalAddr(a netip.Addr) netip.Addr { return a.Unmap().WithZone("") }

// Covers reports whether every address of q lies in p (a prefix covers itself; prefixes of different
// families cover nothing of each other).
func Covers(p, q netip.Prefix) bool { return p.Bits() <= q.Bits() && p.Contains(q.Addr()) }
