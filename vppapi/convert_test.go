package vppapi

import (
	"net/netip"
	"reflect"
	"testing"

	"go.fd.io/govpp/binapi/fib_types"
	"go.fd.io/govpp/binapi/ip"
	"go.fd.io/govpp/binapi/ip_types"

	"github.com/vpp-route-agent/vpp-route-agent/internal/netaddr"
)

func v4union(s string) ip_types.AddressUnion {
	return ip_types.AddressUnionIP4(ip_types.IP4Address(netip.MustParseAddr(s).As4()))
}

func v6union(s string) ip_types.AddressUnion {
	return ip_types.AddressUnionIP6(ip_types.IP6Address(netip.MustParseAddr(s).As16()))
}

func apiPrefix4(s string, l uint8) ip_types.Prefix {
	return ip_types.Prefix{Address: ip_types.Address{Af: ip_types.ADDRESS_IP4, Un: v4union(s)}, Len: l}
}

func apiPrefix6(s string, l uint8) ip_types.Prefix {
	return ip_types.Prefix{Address: ip_types.Address{Af: ip_types.ADDRESS_IP6, Un: v6union(s)}, Len: l}
}

func TestToAPIPrefix(t *testing.T) {
	tests := []struct {
		name    string
		in      netip.Prefix
		want    ip_types.Prefix
		wantErr bool
	}{
		{"ipv4", netip.MustParsePrefix("10.244.3.0/26"), apiPrefix4("10.244.3.0", 26), false},
		{"ipv4 host bits masked", netip.MustParsePrefix("10.244.3.5/26"), apiPrefix4("10.244.3.0", 26), false},
		{"ipv4 host route", netip.MustParsePrefix("192.0.2.7/32"), apiPrefix4("192.0.2.7", 32), false},
		{"ipv4 default", netip.MustParsePrefix("0.0.0.0/0"), apiPrefix4("0.0.0.0", 0), false},
		{"ipv4-mapped unmapped", netip.MustParsePrefix("::ffff:10.244.3.0/122"), apiPrefix4("10.244.3.0", 26), false},
		{"ipv4-mapped masked", netip.MustParsePrefix("::ffff:10.244.3.9/122"), apiPrefix4("10.244.3.0", 26), false},
		{"ipv6", netip.MustParsePrefix("fd00:10:244::/64"), apiPrefix6("fd00:10:244::", 64), false},
		{"ipv6 host bits masked", netip.MustParsePrefix("fd00:10:244::1:2/112"), apiPrefix6("fd00:10:244::1:0", 112), false},
		{"ipv6 /128", netip.MustParsePrefix("2001:db8::1/128"), apiPrefix6("2001:db8::1", 128), false},
		{"short mapped prefix stays ipv6", netip.MustParsePrefix("::ffff:0.0.0.0/80"), apiPrefix6("::", 80), false},
		{"invalid", netip.Prefix{}, ip_types.Prefix{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := toAPIPrefix(tt.in)
			if (err != nil) != tt.wantErr {
				t.Fatalf("toAPIPrefix(%v) error = %v, want error %v", tt.in, err, tt.wantErr)
			}
			if got != tt.want {
				t.Errorf("toAPIPrefix(%v) = %v/%d af %v, want %v/%d af %v", tt.in, got.Address, got.Len, got.Address.Af,
					tt.want.Address, tt.want.Len, tt.want.Address.Af)
			}
		})
	}
}

func TestFromAPIPrefix(t *testing.T) {
	tests := []struct {
		name    string
		in      ip_types.Prefix
		want    netip.Prefix
		wantErr bool
	}{
		{"ipv4", apiPrefix4("10.244.3.0", 26), netip.MustParsePrefix("10.244.3.0/26"), false},
		{"ipv4 host bits masked", apiPrefix4("172.16.0.1", 24), netip.MustParsePrefix("172.16.0.0/24"), false},
		{"ipv6", apiPrefix6("fd00::", 8), netip.MustParsePrefix("fd00::/8"), false},
		{"ipv6 host bits masked", apiPrefix6("fd00::1", 64), netip.MustParsePrefix("fd00::/64"), false},
		{"ipv4-mapped unmapped", apiPrefix6("::ffff:10.1.0.0", 112), netip.MustParsePrefix("10.1.0.0/16"), false},
		{"ipv4-mapped short stays ipv6", apiPrefix6("::ffff:10.1.0.0", 64), netip.MustParsePrefix("::/64"), false},
		{"ipv4 too long", apiPrefix4("10.0.0.0", 33), netip.Prefix{}, true},
		{"ipv6 too long", apiPrefix6("fd00::", 129), netip.Prefix{}, true},
		{"unknown family", ip_types.Prefix{Address: ip_types.Address{Af: 7}}, netip.Prefix{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := fromAPIPrefix(tt.in)
			if (err != nil) != tt.wantErr {
				t.Fatalf("fromAPIPrefix error = %v, want error %v", err, tt.wantErr)
			}
			if got != tt.want {
				t.Errorf("fromAPIPrefix = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestPrefixRoundTrip(t *testing.T) {
	for _, s := range []string{"0.0.0.0/0", "10.0.0.0/8", "10.244.3.64/26", "192.0.2.7/32", "224.0.0.0/4",
		"255.255.255.255/32", "::/0", "fd00:10:244:1::/64", "2001:db8::1/128", "fe80::/10"} {
		p := netip.MustParsePrefix(s)
		a, err := toAPIPrefix(p)
		if err != nil {
			t.Fatalf("toAPIPrefix(%v): %v", p, err)
		}
		back, err := fromAPIPrefix(a)
		if err != nil {
			t.Fatalf("fromAPIPrefix(toAPIPrefix(%v)): %v", p, err)
		}
		if back != p {
			t.Errorf("round trip of %v gave %v", p, back)
		}
	}
}

func TestAddress(t *testing.T) {
	tests := []struct {
		in   string
		want ip_types.Address
	}{
		{"192.0.2.7", ip_types.Address{Af: ip_types.ADDRESS_IP4, Un: v4union("192.0.2.7")}},
		{"::ffff:192.0.2.7", ip_types.Address{Af: ip_types.ADDRESS_IP4, Un: v4union("192.0.2.7")}},
		{"2001:db8::7", ip_types.Address{Af: ip_types.ADDRESS_IP6, Un: v6union("2001:db8::7")}},
		{"fe80::1%eth0", ip_types.Address{Af: ip_types.ADDRESS_IP6, Un: v6union("fe80::1")}},
	}
	for _, tt := range tests {
		a := netip.MustParseAddr(tt.in)
		got, err := toAPIAddress(a)
		if err != nil {
			t.Fatalf("toAPIAddress(%v): %v", a, err)
		}
		if got != tt.want {
			t.Errorf("toAPIAddress(%v) = %v, want %v", a, got, tt.want)
		}
		back, err := fromAPIAddress(got)
		if err != nil {
			t.Fatalf("fromAPIAddress: %v", err)
		}
		if want := netaddr.CanonicalAddr(a); back != want {
			t.Errorf("fromAPIAddress(toAPIAddress(%v)) = %v, want %v", a, back, want)
		}
	}
	if _, err := toAPIAddress(netip.Addr{}); err == nil {
		t.Error("toAPIAddress(invalid) succeeded")
	}
	// An IPv4 address sent as IPv6 (mapped) comes back as IPv4.
	got, err := fromAPIAddress(ip_types.Address{Af: ip_types.ADDRESS_IP6, Un: v6union("::ffff:10.0.0.1")})
	if err != nil || got != netip.MustParseAddr("10.0.0.1") {
		t.Errorf("fromAPIAddress(::ffff:10.0.0.1) = %v, %v; want 10.0.0.1", got, err)
	}
}

func TestAddressWithPrefix(t *testing.T) {
	tests := []struct {
		in   string
		want ip_types.AddressWithPrefix
		back string
	}{
		{"192.0.2.7/24", ip_types.AddressWithPrefix(apiPrefix4("192.0.2.7", 24)), "192.0.2.7/24"},
		{"::ffff:192.0.2.7/120", ip_types.AddressWithPrefix(apiPrefix4("192.0.2.7", 24)), "192.0.2.7/24"},
		{"2001:db8::7/64", ip_types.AddressWithPrefix(apiPrefix6("2001:db8::7", 64)), "2001:db8::7/64"},
	}
	for _, tt := range tests {
		got, err := toAPIAddressWithPrefix(netip.MustParsePrefix(tt.in))
		if err != nil {
			t.Fatalf("toAPIAddressWithPrefix(%s): %v", tt.in, err)
		}
		if got != tt.want {
			t.Errorf("toAPIAddressWithPrefix(%s) = %v, want %v (host bits kept)", tt.in, got, tt.want)
		}
		back, err := fromAPIAddressWithPrefix(got)
		if err != nil {
			t.Fatalf("fromAPIAddressWithPrefix: %v", err)
		}
		if back.String() != tt.back {
			t.Errorf("fromAPIAddressWithPrefix(toAPIAddressWithPrefix(%s)) = %v, want %s", tt.in, back, tt.back)
		}
	}
	if _, err := toAPIAddressWithPrefix(netip.Prefix{}); err == nil {
		t.Error("toAPIAddressWithPrefix(invalid) succeeded")
	}
}

func TestFillRouteAddDel(t *testing.T) {
	tests := []struct {
		name      string
		route     Route
		isAdd     bool
		wantPfx   ip_types.Prefix
		wantProto fib_types.FibPathNhProto
		wantNh    ip_types.AddressUnion
	}{
		{
			name:  "ipv4 add",
			route: Route{Prefix: netip.MustParsePrefix("10.244.3.0/26"), NextHop: netip.MustParseAddr("192.0.2.7"), SwIfIndex: 1, TableID: 5},
			isAdd: true, wantPfx: apiPrefix4("10.244.3.0", 26), wantProto: fib_types.FIB_API_PATH_NH_PROTO_IP4, wantNh: v4union("192.0.2.7"),
		},
		{
			name:  "ipv4 host bits and mapped next hop",
			route: Route{Prefix: netip.MustParsePrefix("10.244.3.9/26"), NextHop: netip.MustParseAddr("::ffff:192.0.2.7"), SwIfIndex: 1},
			isAdd: true, wantPfx: apiPrefix4("10.244.3.0", 26), wantProto: fib_types.FIB_API_PATH_NH_PROTO_IP4, wantNh: v4union("192.0.2.7"),
		},
		{
			name:  "ipv6 add",
			route: Route{Prefix: netip.MustParsePrefix("fd00:244::/80"), NextHop: netip.MustParseAddr("2001:db8::7"), SwIfIndex: 2},
			isAdd: true, wantPfx: apiPrefix6("fd00:244::", 80), wantProto: fib_types.FIB_API_PATH_NH_PROTO_IP6, wantNh: v6union("2001:db8::7"),
		},
		{
			name:  "ipv4 via ipv6 next hop",
			route: Route{Prefix: netip.MustParsePrefix("10.0.0.0/8"), NextHop: netip.MustParseAddr("fe80::1"), SwIfIndex: 2},
			isAdd: true, wantPfx: apiPrefix4("10.0.0.0", 8), wantProto: fib_types.FIB_API_PATH_NH_PROTO_IP6, wantNh: v6union("fe80::1"),
		},
		{
			name:  "attached ipv4, no next hop",
			route: Route{Prefix: netip.MustParsePrefix("10.0.0.0/8"), SwIfIndex: 2},
			isAdd: true, wantPfx: apiPrefix4("10.0.0.0", 8), wantProto: fib_types.FIB_API_PATH_NH_PROTO_IP4,
		},
		{
			name:  "delete",
			route: Route{Prefix: netip.MustParsePrefix("10.244.3.0/26"), NextHop: netip.MustParseAddr("192.0.2.7"), SwIfIndex: 1, TableID: 5},
			isAdd: false, wantPfx: apiPrefix4("10.244.3.0", 26),
		},
	}
	// One message reused across cases, as Apply does: no state may leak from one route to the next.
	msg := &ip.IPRouteAddDel{}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := fillRouteAddDel(msg, tt.route, tt.isAdd); err != nil {
				t.Fatal(err)
			}
			if msg.IsAdd != tt.isAdd || msg.IsMultipath || msg.Route.TableID != tt.route.TableID || msg.Route.Prefix != tt.wantPfx {
				t.Fatalf("got IsAdd %v IsMultipath %v table %d prefix %v/%d", msg.IsAdd, msg.IsMultipath, msg.Route.TableID,
					msg.Route.Prefix.Address, msg.Route.Prefix.Len)
			}
			if !tt.isAdd {
				if len(msg.Route.Paths) != 0 || msg.Route.NPaths != 0 {
					t.Fatalf("delete carries %d paths", len(msg.Route.Paths))
				}
				return
			}
			if len(msg.Route.Paths) != 1 || msg.Route.NPaths != 1 {
				t.Fatalf("add carries %d paths (NPaths %d), want 1", len(msg.Route.Paths), msg.Route.NPaths)
			}
			want := fib_types.FibPath{SwIfIndex: tt.route.SwIfIndex, Weight: 1, Proto: tt.wantProto, Nh: fib_types.FibPathNh{Address: tt.wantNh}}
			if !reflect.DeepEqual(msg.Route.Paths[0], want) {
				t.Errorf("path = %+v, want %+v", msg.Route.Paths[0], want)
			}
		})
	}
	if err := fillRouteAddDel(msg, Route{NextHop: netip.MustParseAddr("192.0.2.7")}, true); err == nil {
		t.Error("route without a prefix was encoded")
	}
}

func TestFromAPIPath(t *testing.T) {
	tests := []struct {
		name string
		in   fib_types.FibPath
		want Path
	}{
		{"ipv4 via", fib_types.FibPath{SwIfIndex: 1, Weight: 1, Proto: fib_types.FIB_API_PATH_NH_PROTO_IP4, Nh: fib_types.FibPathNh{Address: v4union("192.0.2.7")}},
			Path{NextHop: netip.MustParseAddr("192.0.2.7"), SwIfIndex: 1, Type: PathNormal}},
		{"ipv6 via", fib_types.FibPath{SwIfIndex: 2, Weight: 3, Proto: fib_types.FIB_API_PATH_NH_PROTO_IP6, Nh: fib_types.FibPathNh{Address: v6union("fe80::1")}},
			Path{NextHop: netip.MustParseAddr("fe80::1"), SwIfIndex: 2, Type: PathNormal}},
		{"attached: zero next hop is none", fib_types.FibPath{SwIfIndex: 1, Proto: fib_types.FIB_API_PATH_NH_PROTO_IP4},
			Path{SwIfIndex: 1, Type: PathNormal}},
		{"drop", fib_types.FibPath{SwIfIndex: noInterface, Type: fib_types.FIB_API_PATH_TYPE_DROP},
			Path{SwIfIndex: noInterface, Type: PathDrop}},
		{"local", fib_types.FibPath{SwIfIndex: 1, Type: fib_types.FIB_API_PATH_TYPE_LOCAL, Proto: fib_types.FIB_API_PATH_NH_PROTO_IP4, Nh: fib_types.FibPathNh{Address: v4union("172.16.0.1")}},
			Path{SwIfIndex: 1, Type: PathLocal, NextHop: netip.MustParseAddr("172.16.0.1")}},
		{"mpls next hop is not an address", fib_types.FibPath{SwIfIndex: 1, Proto: fib_types.FIB_API_PATH_NH_PROTO_MPLS, Nh: fib_types.FibPathNh{Address: v4union("1.2.3.4")}},
			Path{SwIfIndex: 1}},
	}
	for _, tt := range tests {
		if got := fromAPIPath(tt.in); got != tt.want {
			t.Errorf("%s: fromAPIPath = %+v, want %+v", tt.name, got, tt.want)
		}
	}
}

func TestEntryFromAPI(t *testing.T) {
	nh := func(s string, sw uint32) fib_types.FibPath {
		return fib_types.FibPath{SwIfIndex: sw, Weight: 1, Proto: fib_types.FIB_API_PATH_NH_PROTO_IP4, Nh: fib_types.FibPathNh{Address: v4union(s)}}
	}
	r := &ip.IPRoute{TableID: 3, Prefix: apiPrefix4("10.244.3.1", 26), Paths: []fib_types.FibPath{
		nh("192.0.2.9", 1), nh("192.0.2.7", 2), nh("192.0.2.7", 1),
		{SwIfIndex: noInterface, Type: fib_types.FIB_API_PATH_TYPE_DROP},
	}}
	got, err := entryFromAPI(r.TableID, r.Prefix, r.Paths)
	if err != nil {
		t.Fatal(err)
	}
	want := FIBEntry{TableID: 3, Prefix: netip.MustParsePrefix("10.244.3.0/26"), Paths: []Path{
		{NextHop: netip.MustParseAddr("192.0.2.7"), SwIfIndex: 1},
		{NextHop: netip.MustParseAddr("192.0.2.7"), SwIfIndex: 2},
		{NextHop: netip.MustParseAddr("192.0.2.9"), SwIfIndex: 1},
		{SwIfIndex: noInterface, Type: PathDrop},
	}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("entryFromAPI =\n%+v\nwant\n%+v", got, want)
	}
	if _, err := entryFromAPI(0, apiPrefix4("10.0.0.0", 40), nil); err == nil {
		t.Error("entryFromAPI accepted a /40 IPv4 prefix")
	}
}

// TestFillRouteAddDelAllocs guards the pipelined Apply's zero-allocation encoding.
func TestFillRouteAddDelAllocs(t *testing.T) {
	msg := &ip.IPRouteAddDel{}
	r := Route{Prefix: netip.MustParsePrefix("10.244.3.0/26"), NextHop: netip.MustParseAddr("192.0.2.7"), SwIfIndex: 1}
	_ = fillRouteAddDel(msg, r, true)
	if n := testing.AllocsPerRun(100, func() { _ = fillRouteAddDel(msg, r, true) }); n != 0 {
		t.Errorf("fillRouteAddDel allocates %v times per route", n)
	}
}
