package agent

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/vpp-route-agent/vpp-route-agent/blockwatch"
)

func TestValidPeers(t *testing.T) {
	a := netip.MustParseAddr
	pc := peerCheck{node: "self", own: []netip.Addr{a("192.0.2.1")},
		subnets: []netip.Prefix{netip.MustParsePrefix("192.0.2.1/24"), netip.MustParsePrefix("2001:db8::1/64"), netip.MustParsePrefix("198.51.100.0/31")}}
	raw := map[string]blockwatch.Peer{
		"self":    {IPv4: a("192.0.2.1"), IPv6: a("2001:db8::1")},
		"ok":      {IPv4: a("192.0.2.2"), IPv6: a("2001:db8::2"), IPv4Created: 5},
		"later":   {IPv4: a("192.0.2.2"), IPv4Created: 9},
		"tie":     {IPv4: a("192.0.2.3"), IPv4Created: 7},
		"tie2":    {IPv4: a("192.0.2.3"), IPv4Created: 7},
		"p2p":     {IPv4: a("198.51.100.0")}, // a /31 has no network address
		"bcast":   {IPv4: a("255.255.255.255")},
		"lo":      {IPv4: a("127.0.0.1"), IPv6: a("::1")},
		"ll":      {IPv4: a("169.254.1.1"), IPv6: a("fe80::1")},
		"mc":      {IPv4: a("224.0.0.5"), IPv6: a("ff02::1")},
		"zero":    {IPv4: a("0.0.0.0"), IPv6: a("::")},
		"this":    {IPv4: a("0.1.2.3")},
		"classe":  {IPv4: a("240.0.0.1")},
		"net":     {IPv4: a("192.0.2.0"), IPv6: a("2001:db8::")},
		"sbcast":  {IPv4: a("192.0.2.255")},
		"mine":    {IPv4: a("192.0.2.1"), IPv6: a("2001:db8::1")}, // self's own, registered by another name
		"mapped6": {IPv6: a("::ffff:192.0.2.9")},
		// A leftover key without a lease, older than the live registration of the same address.
		"leftover": {IPv4: a("192.0.2.4"), IPv4Created: 2},
		"back":     {IPv4: a("192.0.2.4"), IPv4Created: 11, IPv4Leased: true},
	}
	valid, invalid := pc.validPeers(raw)
	wantValid := map[string]string{"self": "192.0.2.1", "ok": "192.0.2.2", "tie": "192.0.2.3", "p2p": "198.51.100.0", "back": "192.0.2.4"}
	for n, v := range valid {
		if want, ok := wantValid[n]; !ok || v.IPv4.String() != want && v.IPv6.String() != want {
			t.Errorf("valid %s = %+v, want refused", n, v)
		}
	}
	for n := range wantValid {
		if _, ok := valid[n]; !ok {
			t.Errorf("%s refused: %+v", n, invalid)
		}
	}
	wantReason := map[string]string{
		"later/ipv4": `also registered by node "ok"`, "tie2/ipv4": `also registered by node "tie"`,
		"bcast/ipv4": "limited broadcast", "lo/ipv4": "loopback", "lo/ipv6": "loopback",
		"ll/ipv4": "link-local", "ll/ipv6": "link-local", "mc/ipv4": "multicast", "mc/ipv6": "multicast",
		"zero/ipv4": "unspecified", "zero/ipv6": "unspecified", "this/ipv4": "0.0.0.0/8", "classe/ipv4": "240.0.0.0/4",
		"net/ipv4": "network address of the uplink subnet 192.0.2.0/24", "net/ipv6": "network address of the uplink subnet 2001:db8::/64",
		"sbcast/ipv4": "broadcast address of the uplink subnet", "mine/ipv4": "own peer IP", "mine/ipv6": "own peer IP",
		"mapped6/ipv6": "IPv4-mapped", "leftover/ipv4": `also registered by node "back"`,
	}
	for pf, inv := range invalid {
		want, ok := wantReason[pf.String()]
		if !ok || !strings.Contains(inv.Reason, want) || inv.Node != pf.node {
			t.Errorf("%s refused: %+v, want a reason with %q", pf, inv, want)
		}
	}
	if len(invalid) != len(wantReason) {
		t.Errorf("%d refused, want %d: %v", len(invalid), len(wantReason), invalid)
	}
	if _, ok := valid["ok"]; !ok || valid["ok"].IPv6 != a("2001:db8::2") {
		t.Errorf("ok: %+v", valid["ok"])
	}
}

// TestValidPeersFurtherIPs: a node's further peer IPs (/2, ...) are judged like its first: one another
// node holds (registered earlier), this node's own, a loopback are refused each on its own, and the
// others stay usable in their order; a node whose /1 is refused keeps its /2 as its first usable one.
func TestValidPeersFurtherIPs(t *testing.T) {
	a := netip.MustParseAddr
	more := func(as ...string) blockwatch.Addrs {
		var out []netip.Addr
		for _, s := range as {
			out = append(out, a(s))
		}
		return blockwatch.MakeAddrs(out)
	}
	pc := peerCheck{node: "self", own: []netip.Addr{a("192.0.2.1"), a("198.51.100.1")}}
	raw := map[string]blockwatch.Peer{
		"first":  {IPv4: a("192.0.2.2"), MoreIPv4: more("198.51.100.2"), IPv4Created: 3},
		"second": {IPv4: a("192.0.2.3"), MoreIPv4: more("198.51.100.2", "198.51.100.1", "127.0.0.1", "198.51.100.3"), IPv4Created: 8},
		"badone": {IPv4: a("127.0.0.2"), MoreIPv4: more("198.51.100.4"), IPv4Created: 9},
	}
	valid, invalid := pc.validPeers(raw)
	if p := valid["first"]; p.IPv4 != a("192.0.2.2") || p.MoreIPv4 != more("198.51.100.2") {
		t.Errorf("first: %+v", p)
	}
	if p := valid["second"]; p.IPv4 != a("192.0.2.3") || p.MoreIPv4 != more("198.51.100.3") {
		t.Errorf("second: %+v, want 192.0.2.3 then 198.51.100.3 only", p)
	}
	if p := valid["badone"]; p.IPv4 != a("198.51.100.4") || p.MoreIPv4.Len() != 0 {
		t.Errorf("badone: %+v, want its /2 first", p)
	}
	wantReason := map[peerSlot]string{
		{peerFamily{node: "second"}, 1}: `also registered by node "first"`,
		{peerFamily{node: "second"}, 2}: "own peer IP",
		{peerFamily{node: "second"}, 3}: "loopback",
		{peerFamily{node: "badone"}, 0}: "loopback",
	}
	for slot, want := range wantReason {
		if inv, ok := invalid[slot]; !ok || !strings.Contains(inv.Reason, want) {
			t.Errorf("%+v: refused %+v, want a reason with %q", slot, inv, want)
		}
	}
	if len(invalid) != len(wantReason) {
		t.Errorf("%d refused, want %d: %v", len(invalid), len(wantReason), invalid)
	}
}
