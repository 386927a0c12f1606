package calico

import (
	"fmt"
	"net/netip"
)

// OrdinalAddr returns the address at ordinal ord of the block cidr (ordinal 0 is the block's first address).
func OrdinalAddr(cidr netip.Prefix, ord int) (netip.Addr, error) {
	n := Size(cidr)
	if ord < 0 || ord >= n {
		return netip.Addr{}, fmt.Errorf("ordinal %d out of range for block %s (size %d)", ord, cidr, n)
	}
	b := cidr.Masked().Addr().As16()
	carry := uint(ord)
	for i := 15; i >= 0 && carry > 0; i-- {
		s := uint(b[i]) + carry&0xff
		b[i] = byte(s)
		carry = carry>>8 + s>>8
	}
	a := netip.AddrFrom16(b)
	if cidr.Addr().Is4() {
		a = a.Unmap()
	}
	return a, nil
}

// Ordinal returns the ordinal of addr inside the block cidr, and false if addr lies outside it.
func Ordinal(cidr netip.Prefix, addr netip.Addr) (int, bool) {
	addr = addr.Unmap()
	if !cidr.Contains(addr) || Size(cidr) == 0 {
		return 0, false
	}
	base := cidr.Masked().Addr().As16()
	a := addr.As16()
	// Blocks hold at most 2^24 addresses and addr lies inside, so the difference lives in the last
	// three bytes.
	ord := (int(a[13])<<16 | int(a[14])<<8 | int(a[15])) - (int(base[13])<<16 | int(base[14])<<8 | int(base[15]))
	return ord, true
}

// HostPrefix returns addr as a single-address prefix (/32 or /128).
func HostPrefix(addr netip.Addr) netip.Prefix {
	addr = addr.Unmap()
	return netip.PrefixFrom(addr, addr.BitLen())
}
