package netaddr

import (
	"cmp"
	"net/netip"
	"slices"
	"testing"
)

func TestCanonical(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"10.244.3.9/26", "10.244.3.0/26"},
		{"::ffff:10.244.3.9/122", "10.244.3.0/26"},
		{"::ffff:10.0.0.0/96", "0.0.0.0/0"},
		// Shorter than /96 it also holds addresses that are not IPv4-mapped: an IPv6 prefix.
		{"::ffff:0.0.0.0/80", "::/80"},
		{"2001:db8::1/64", "2001:db8::/64"},
	} {
		if got := Canonical(netip.MustParsePrefix(c.in)); got != netip.MustParsePrefix(c.want) {
			t.Errorf("Canonical(%s) = %s, want %s", c.in, got, c.want)
		}
	}
	if got := Canonical(netip.Prefix{}); got.IsValid() {
		t.Errorf("Canonical(invalid) = %s", got)
	}
	if got := Unmap(netip.MustParsePrefix("::ffff:192.0.2.7/120")); got != netip.MustParsePrefix("192.0.2.7/24") {
		t.Errorf("Unmap keeps host bits: %s", got)
	}
	if got := CanonicalAddr(netip.MustParseAddr("::ffff:192.0.2.7")); got != netip.MustParseAddr("192.0.2.7") {
		t.Errorf("CanonicalAddr = %s", got)
	}
	if got := CanonicalAddr(netip.MustParseAddr("fe80::1%eth0")); got != netip.MustParseAddr("fe80::1") {
		t.Errorf("CanonicalAddr drops the zone: %s", got)
	}
}

// TestOrder holds the package comment: netip.Prefix.Compare lists canonical prefixes by address,
// then length, IPv4 first (the order the packages wrote out by hand before).
func TestOrder(t *testing.T) {
	in := []netip.Prefix{
		netip.MustParsePrefix("2001:db8::/64"),
		netip.MustParsePrefix("10.1.0.0/16"),
		netip.MustParsePrefix("10.0.0.64/26"),
		netip.MustParsePrefix("10.0.0.0/26"),
		netip.MustParsePrefix("10.0.0.0/16"),
	}
	want := []netip.Prefix{in[4], in[3], in[2], in[1], in[0]}
	if got := slices.SortedFunc(slices.Values(in), netip.Prefix.Compare); !slices.Equal(got, want) {
		t.Errorf("sorted %v, want %v", got, want)
	}
	byHand := func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return cmp.Compare(a.Bits(), b.Bits())
	}
	for _, a := range in {
		for _, b := range in {
			if got, old := a.Compare(b), byHand(a, b); got != old {
				t.Errorf("%s vs %s: Compare %d, address-then-length %d", a, b, got, old)
			}
		}
	}
}

func TestCovers(t *testing.T) {
	p := netip.MustParsePrefix
	for _, c := range []struct {
		p, q string
		want bool
	}{
		{"10.0.0.0/16", "10.0.3.0/26", true},
		{"10.0.0.0/16", "10.0.0.0/16", true},
		{"10.0.3.0/26", "10.0.0.0/16", false},
		{"10.0.0.0/16", "10.1.0.0/26", false},
		{"0.0.0.0/0", "::/64", false},
		{"::/0", "10.0.0.0/8", false},
	} {
		if got := Covers(p(c.p), p(c.q)); got != c.want {
			t.Errorf("Covers(%s, %s) = %v", c.p, c.q, got)
		}
	}
}

func TestFamily(t *testing.T) {
	for _, c := range []struct {
		addr string
		want Family
	}{{"10.0.0.1", V4}, {"::ffff:10.0.0.1", V4}, {"2001:db8::1", V6}} {
		if got := FamilyOf(netip.MustParseAddr(c.addr)); got != c.want {
			t.Errorf("FamilyOf(%s) = %s", c.addr, got)
		}
	}
	if PrefixFamily(netip.MustParsePrefix("::ffff:10.0.0.0/104")) != V4 || PrefixFamily(netip.MustParsePrefix("::ffff:0.0.0.0/80")) != V6 {
		t.Error("PrefixFamily is not the family of the canonical prefix")
	}
	for _, f := range Families {
		if g, ok := ParseFamily(f.String()); !ok || g != f {
			t.Errorf("ParseFamily(%q) = %v, %v", f, g, ok)
		}
	}
	if _, ok := ParseFamily("IPv4"); ok {
		t.Error(`ParseFamily("IPv4") accepted: Calico's word is lower-case`)
	}
	if V4.String() != "ipv4" || V6.String() != "ipv6" || FamilyFor(true) != V6 || FamilyFor(false) != V4 {
		t.Error("family words")
	}
}
