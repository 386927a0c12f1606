package vppsim

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"go.fd.io/govpp/api"
	"go.fd.io/govpp/binapi/fib_types"
	interfaces "go.fd.io/govpp/binapi/interface"
	"go.fd.io/govpp/binapi/interface_types"
	"go.fd.io/govpp/binapi/ip"
	"go.fd.io/govpp/binapi/ip_types"
)

// routeReq builds ip_route_add_del; prefix keeps its host bits on purpose.
func routeReq(isAdd, multipath bool, table uint32, prefix string, paths ...fib_types.FibPath) *ip.IPRouteAddDel {
	p := netip.MustParsePrefix(prefix)
	return &ip.IPRouteAddDel{
		IsAdd:       isAdd,
		IsMultipath: multipath,
		Route: ip.IPRoute{
			TableID: table,
			Prefix:  ip_types.Prefix{Address: addressToAPI(p.Addr()), Len: uint8(p.Bits())},
			NPaths:  uint8(len(paths)),
			Paths:   paths,
		},
	}
}

// rawPrefixReq builds a route request with an arbitrary (possibly invalid) length.
func rawPrefixReq(addr string, length uint8, paths ...fib_types.FibPath) *ip.IPRouteAddDel {
	return &ip.IPRouteAddDel{IsAdd: true, Route: ip.IPRoute{
		Prefix: ip_types.Prefix{Address: addressToAPI(netip.MustParseAddr(addr)), Len: length},
		NPaths: uint8(len(paths)),
		Paths:  paths,
	}}
}

func nhPath(nh string, swIfIndex uint32) fib_types.FibPath {
	a := netip.MustParseAddr(nh)
	p := fib_types.FibPath{SwIfIndex: swIfIndex, Weight: 1, Proto: fib_types.FIB_API_PATH_NH_PROTO_IP4}
	if a.Is6() {
		p.Proto = fib_types.FIB_API_PATH_NH_PROTO_IP6
		p.Nh.Address.SetIP6(a.As16())
	} else {
		p.Nh.Address.SetIP4(a.As4())
	}
	return p
}

// do sends a request and returns the reply's retval; a transport error fails
// the test. GoVPP also returns a non-zero retval as an api.VPPApiError.
func do(t *testing.T, ch api.Channel, req api.Message, reply api.Message) int32 {
	t.Helper()
	err := ch.SendRequest(req).ReceiveReply(reply)
	var verr api.VPPApiError
	if err != nil && !errors.As(err, &verr) {
		t.Fatalf("%s: %v", req.GetMessageName(), err)
	}
	return int32(verr)
}

func dumpRoutes(t *testing.T, ch api.Channel, table uint32, ip6 bool) []ip.IPRoute {
	t.Helper()
	req := ch.SendMultiRequest(&ip.IPRouteDump{Table: ip.IPTable{TableID: table, IsIP6: ip6}})
	var out []ip.IPRoute
	for {
		d := new(ip.IPRouteDetails)
		last, err := req.ReceiveReply(d)
		if err != nil {
			t.Fatalf("ip_route_dump: %v", err)
		}
		if last {
			// VPP promises no order: compare sorted.
			slices.SortFunc(out, func(a, b ip.IPRoute) int { return strings.Compare(routeString(a), routeString(b)) })
			return out
		}
		out = append(out, d.Route)
	}
}

// routeString renders a dumped route as "prefix via nh@sw,nh@sw" for comparisons.
func routeString(r ip.IPRoute) string {
	p, _, _ := prefixFromAPI(r.Prefix)
	var ps []string
	for _, path := range r.Paths {
		ip6 := path.Proto == fib_types.FIB_API_PATH_NH_PROTO_IP6
		nh := addrFromUnion(path.Nh.Address, ip6)
		s := fmt.Sprintf("%s@%d", nh, int32(path.SwIfIndex))
		if path.Type != fib_types.FIB_API_PATH_TYPE_NORMAL {
			s += ":" + pathTypeNames[path.Type]
		}
		if path.Weight != 1 {
			s += fmt.Sprintf("/w%d", path.Weight)
		}
		ps = append(ps, s)
	}
	return p.String() + " via " + strings.Join(ps, ",")
}

// findRoute returns the route whose prefix, masked, is prefix (VPP dumps
// prefixes as first created, host bits and all).
func findRoute(routes []ip.IPRoute, prefix string) (string, bool) {
	want := netip.MustParsePrefix(prefix)
	for _, r := range routes {
		if p, _, _ := prefixFromAPI(r.Prefix); p.Masked() == want {
			return routeString(r), true
		}
	}
	return "", false
}

// TestRouteAddDelSemantics has one row per row of the semantics table in
// shared/vpp-binary-api.md.
func TestRouteAddDelSemantics(t *testing.T) {
	s := startSim(t, Config{Interfaces: []string{"eth0", "eth1"}})
	ch := channel(t, connect(t, s))

	badIf := nhPath("172.16.0.2", 99)
	badProto := nhPath("172.16.0.2", 1)
	badProto.Proto = 9
	recursiveBadTable := nhPath("192.0.2.1", ^uint32(0))
	recursiveBadTable.TableID = 5

	rows := []struct {
		name string
		req  *ip.IPRouteAddDel
		want int32
	}{
		{"unknown table on add", routeReq(true, false, 7, "10.1.0.0/24", nhPath("172.16.0.2", 1)), -3},
		{"unknown table on delete", routeReq(false, false, 7, "10.1.0.0/24"), -3},
		{"unknown table of a recursive path", routeReq(true, false, 0, "10.1.0.0/24", recursiveBadTable), -3},
		{"path interface does not exist", routeReq(true, false, 0, "10.1.0.0/24", badIf), -54},
		{"path interface does not exist, delete", routeReq(false, false, 0, "10.1.0.0/24", badIf), -54},
		{"path proto invalid", routeReq(true, false, 0, "10.1.0.0/24", badProto), -1},
		{"prefix length > 32", rawPrefixReq("10.1.0.0", 33, nhPath("172.16.0.2", 1)), -171},
		{"prefix length > 128", rawPrefixReq("2001:db8::", 129, nhPath("2001:db8::1", 1)), -171},
		{"add without paths", routeReq(true, false, 0, "10.1.0.0/24"), -52},
		{"multipath add without paths", routeReq(true, true, 0, "10.1.0.0/24"), -52},
		{"multipath delete without paths", routeReq(false, true, 0, "10.1.0.0/24"), -52},
		{"delete of an absent route", routeReq(false, false, 0, "10.99.0.0/24"), 0},
		{"multipath delete of an absent route", routeReq(false, true, 0, "10.99.0.0/24", nhPath("172.16.0.2", 1)), 0},
		{"next hop outside every connected subnet", routeReq(true, false, 0, "10.2.0.0/24", nhPath("198.51.100.1", 2)), 0},
		{"recursive path in an existing table", routeReq(true, false, 0, "10.3.0.0/24", nhPath("192.0.2.1", ^uint32(0))), 0},
		// Order of the checks: table, then paths, then prefix length, then action.
		{"table checked before paths", routeReq(true, false, 7, "10.1.0.0/24", badIf), -3},
		{"paths checked before prefix length", rawPrefixReq("10.1.0.0", 40, badIf), -54},
		{"prefix length checked before the action", rawPrefixReq("10.1.0.0", 40), -171},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			reply := new(ip.IPRouteAddDelReply)
			if got := do(t, ch, row.req, reply); got != row.want || reply.Retval != row.want {
				t.Errorf("retval = %d (reply %d), want %d", got, reply.Retval, row.want)
			}
		})
	}
	if got := len(s.APIRoutes(0)); got != 2 {
		t.Errorf("API routes after the rows: %d (%v), want 2", got, s.APIRoutes(0))
	}

	t.Run("host bits are kept in dumps, masked for lookups", func(t *testing.T) {
		if rv := do(t, ch, routeReq(true, false, 0, "10.1.2.5/26", nhPath("172.16.0.2", 1)), new(ip.IPRouteAddDelReply)); rv != 0 {
			t.Fatalf("retval %d", rv)
		}
		// Replacing and deleting by the masked prefix reach the same entry.
		do(t, ch, routeReq(true, false, 0, "10.1.2.0/26", nhPath("172.16.0.3", 1)), new(ip.IPRouteAddDelReply))
		got, ok := findRoute(dumpRoutes(t, ch, 0, false), "10.1.2.0/26")
		if !ok || got != "10.1.2.5/26 via 172.16.0.3@1" {
			t.Errorf("dumped %q, want the prefix as first created", got)
		}
		do(t, ch, routeReq(false, false, 0, "10.1.2.0/26"), new(ip.IPRouteAddDelReply))
		if got, ok := findRoute(dumpRoutes(t, ch, 0, false), "10.1.2.0/26"); ok {
			t.Errorf("left after delete: %q", got)
		}
		do(t, ch, routeReq(true, false, 0, "10.1.2.5/26", nhPath("172.16.0.2", 1)), new(ip.IPRouteAddDelReply))
	})

	t.Run("add replaces the path set; identical re-add is a no-op", func(t *testing.T) {
		req := routeReq(true, false, 0, "10.4.0.0/24", nhPath("172.16.0.2", 1))
		r1 := new(ip.IPRouteAddDelReply)
		do(t, ch, req, r1)
		do(t, ch, routeReq(true, false, 0, "10.4.0.0/24", nhPath("172.16.0.3", 2)), new(ip.IPRouteAddDelReply))
		got, _ := findRoute(dumpRoutes(t, ch, 0, false), "10.4.0.0/24")
		if got != "10.4.0.0/24 via 172.16.0.3@2" {
			t.Errorf("after replace: %q", got)
		}
		before := dumpRoutes(t, ch, 0, false)
		r2 := new(ip.IPRouteAddDelReply)
		do(t, ch, routeReq(true, false, 0, "10.4.0.0/24", nhPath("172.16.0.3", 2)), r2)
		after := dumpRoutes(t, ch, 0, false)
		if !slices.EqualFunc(before, after, func(a, b ip.IPRoute) bool { return routeString(a) == routeString(b) }) {
			t.Error("identical re-add changed the FIB")
		}
		if r1.StatsIndex == 0 || r1.StatsIndex != r2.StatsIndex {
			t.Errorf("stats index %d then %d: the entry should be the same", r1.StatsIndex, r2.StatsIndex)
		}
	})

	t.Run("multipath add adds to the set, duplicates ignored; multipath delete removes", func(t *testing.T) {
		do(t, ch, routeReq(true, false, 0, "10.5.0.0/24", nhPath("172.16.0.2", 1)), new(ip.IPRouteAddDelReply))
		do(t, ch, routeReq(true, true, 0, "10.5.0.0/24", nhPath("172.16.0.1", 1)), new(ip.IPRouteAddDelReply))
		do(t, ch, routeReq(true, true, 0, "10.5.0.0/24", nhPath("172.16.0.1", 1)), new(ip.IPRouteAddDelReply))
		got, _ := findRoute(dumpRoutes(t, ch, 0, false), "10.5.0.0/24")
		if got != "10.5.0.0/24 via 172.16.0.1@1,172.16.0.2@1" {
			t.Errorf("after multipath add: %q", got)
		}
		do(t, ch, routeReq(false, true, 0, "10.5.0.0/24", nhPath("172.16.0.1", 1)), new(ip.IPRouteAddDelReply))
		got, _ = findRoute(dumpRoutes(t, ch, 0, false), "10.5.0.0/24")
		if got != "10.5.0.0/24 via 172.16.0.2@1" {
			t.Errorf("after multipath delete: %q", got)
		}
		do(t, ch, routeReq(false, true, 0, "10.5.0.0/24", nhPath("172.16.0.2", 1)), new(ip.IPRouteAddDelReply))
		if got, ok := findRoute(dumpRoutes(t, ch, 0, false), "10.5.0.0/24"); ok {
			t.Errorf("route left after deleting its last path: %q", got)
		}
	})

	t.Run("delete removes the route whatever its paths", func(t *testing.T) {
		do(t, ch, routeReq(true, false, 0, "10.6.0.0/24", nhPath("172.16.0.2", 1), nhPath("172.16.0.3", 1)), new(ip.IPRouteAddDelReply))
		do(t, ch, routeReq(false, false, 0, "10.6.0.0/24"), new(ip.IPRouteAddDelReply))
		if got, ok := findRoute(dumpRoutes(t, ch, 0, false), "10.6.0.0/24"); ok {
			t.Errorf("route left: %q", got)
		}
	})

	t.Run("dumped paths are normalised", func(t *testing.T) {
		a, b := nhPath("172.16.0.9", 2), nhPath("172.16.0.4", 1)
		a.Weight, b.Weight = 0, 0
		do(t, ch, routeReq(true, false, 0, "10.7.0.0/24", a, b), new(ip.IPRouteAddDelReply))
		got, _ := findRoute(dumpRoutes(t, ch, 0, false), "10.7.0.0/24")
		if got != "10.7.0.0/24 via 172.16.0.4@1,172.16.0.9@2" {
			t.Errorf("dumped %q", got)
		}
	})

	t.Run("IPv6", func(t *testing.T) {
		if rv := do(t, ch, routeReq(true, false, 0, "2001:db8:1::5/64", nhPath("fd00::2", 1)), new(ip.IPRouteAddDelReply)); rv != 0 {
			t.Fatalf("retval %d", rv)
		}
		got, _ := findRoute(dumpRoutes(t, ch, 0, true), "2001:db8:1::/64")
		if got != "2001:db8:1::5/64 via fd00::2@1" {
			t.Errorf("dumped %q", got)
		}
	})
}

func TestDefaultTablesAndSpecialRoutes(t *testing.T) {
	s := startSim(t, Config{})
	ch := channel(t, connect(t, s))
	v4 := dumpRoutes(t, ch, 0, false)
	want := []string{
		"0.0.0.0/0 via invalid IP@-1:drop",
		"0.0.0.0/32 via invalid IP@-1:drop",
		"224.0.0.0/4 via invalid IP@-1:drop",
		"240.0.0.0/4 via invalid IP@-1:drop",
		"255.255.255.255/32 via invalid IP@-1:drop",
	}
	var got []string
	for _, r := range v4 {
		got = append(got, strings.ReplaceAll(routeString(r), "0.0.0.0@", "invalid IP@"))
	}
	if !slices.Equal(got, want) {
		t.Errorf("IPv4 table 0:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	v6 := dumpRoutes(t, ch, 0, true)
	// Every IPv6 table has ::/0 (drop) and fe80::/10, dumped with no path (measured).
	if len(v6) != 2 || !strings.HasPrefix(routeString(v6[0]), "::/0 via") || routeString(v6[1]) != "fe80::/10 via " {
		t.Errorf("IPv6 table 0: %v", v6)
	}

	// An API default route wins over the default drop; deleting it restores the drop.
	do(t, ch, routeReq(true, false, 0, "0.0.0.0/0", nhPath("172.16.0.1", 1)), new(ip.IPRouteAddDelReply))
	if r := dumpRoutes(t, ch, 0, false)[0]; routeString(r) != "0.0.0.0/0 via 172.16.0.1@1" {
		t.Errorf("default route %q", routeString(r))
	}
	do(t, ch, routeReq(false, false, 0, "0.0.0.0/0"), new(ip.IPRouteAddDelReply))
	if r := dumpRoutes(t, ch, 0, false)[0]; r.Paths[0].Type != fib_types.FIB_API_PATH_TYPE_DROP {
		t.Errorf("default route after delete %q", routeString(r))
	}
	// Measured on 26.06: an API route overrides the default-route source's 255.255.255.255/32 drop, not
	// the special source's 224.0.0.0/4.
	do(t, ch, routeReq(true, false, 0, "255.255.255.255/32", nhPath("172.16.0.1", 1)), new(ip.IPRouteAddDelReply))
	do(t, ch, routeReq(true, false, 0, "224.0.0.0/4", nhPath("172.16.0.1", 1)), new(ip.IPRouteAddDelReply))
	for _, r := range s.Routes(0, false) {
		if r.Prefix.String() == "224.0.0.0/4" && (r.Source != SourceSpecial || r.Paths[0].Type != "drop") {
			t.Errorf("special route overridden: %+v", r)
		}
		if r.Prefix.String() == "255.255.255.255/32" && r.Source != SourceAPI {
			t.Errorf("default-route /32 not overridden: %+v", r)
		}
	}
	do(t, ch, routeReq(false, false, 0, "255.255.255.255/32"), new(ip.IPRouteAddDelReply))
	do(t, ch, routeReq(false, false, 0, "224.0.0.0/4"), new(ip.IPRouteAddDelReply))

	// Tables: create (idempotent), dump, route in it, delete.
	if rv := do(t, ch, &ip.IPTableAddDel{IsAdd: true, Table: ip.IPTable{TableID: 10}}, new(ip.IPTableAddDelReply)); rv != 0 {
		t.Fatalf("table add: %d", rv)
	}
	if rv := do(t, ch, &ip.IPTableAddDel{IsAdd: true, Table: ip.IPTable{TableID: 10}}, new(ip.IPTableAddDelReply)); rv != 0 {
		t.Fatalf("table re-add: %d", rv)
	}
	do(t, ch, &ip.IPTableAddDel{IsAdd: true, Table: ip.IPTable{TableID: 11, IsIP6: true, Name: "blue"}}, new(ip.IPTableAddDelReply))
	var tables []string
	req := ch.SendMultiRequest(&ip.IPTableDump{})
	for {
		d := new(ip.IPTableDetails)
		last, err := req.ReceiveReply(d)
		if err != nil {
			t.Fatal(err)
		}
		if last {
			break
		}
		tables = append(tables, fmt.Sprintf("%d/%v/%s", d.Table.TableID, d.Table.IsIP6, d.Table.Name))
	}
	if want := []string{"0/false/ipv4-VRF:0", "10/false/ipv4-VRF:10", "0/true/ipv6-VRF:0", "11/true/blue"}; !slices.Equal(tables, want) {
		t.Errorf("tables %v, want %v", tables, want)
	}
	if got := len(dumpRoutes(t, ch, 10, false)); got != 5 {
		t.Errorf("a new IPv4 table has %d routes, want the 5 specials", got)
	}
	if rv := do(t, ch, routeReq(true, false, 10, "10.8.0.0/24", nhPath("172.16.0.2", 1)), new(ip.IPRouteAddDelReply)); rv != 0 {
		t.Errorf("route in table 10: %d", rv)
	}
	if got := s.APIRoutes(10); len(got) != 1 || got[0].TableID != 10 {
		t.Errorf("APIRoutes(10) = %v", got)
	}
	do(t, ch, &ip.IPTableAddDel{IsAdd: false, Table: ip.IPTable{TableID: 10}}, new(ip.IPTableAddDelReply))
	if rv := do(t, ch, routeReq(true, false, 10, "10.8.0.0/24", nhPath("172.16.0.2", 1)), new(ip.IPRouteAddDelReply)); rv != -3 {
		t.Errorf("route in a deleted table: %d, want -3", rv)
	}
	if s.Routes(10, false) != nil {
		t.Error("Routes of a deleted table not nil")
	}
	do(t, ch, &ip.IPTableAddDel{IsAdd: false, Table: ip.IPTable{TableID: 0}}, new(ip.IPTableAddDelReply))
	if s.Routes(0, false) == nil {
		t.Error("table 0 was deleted")
	}
}

func TestForeignRoutes(t *testing.T) {
	s := startSim(t, Config{})
	err := s.AddRoute(Route{Prefix: netip.MustParsePrefix("10.20.0.7/16"), Paths: []Path{{NextHop: netip.MustParseAddr("172.16.0.9"), SwIfIndex: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.AddRoute(Route{TableID: 3, Prefix: netip.MustParsePrefix("10.0.0.0/8"), Paths: []Path{{SwIfIndex: 1}}}); err == nil {
		t.Error("route in a missing table accepted")
	}
	if err := s.AddRoute(Route{Prefix: netip.MustParsePrefix("10.0.0.0/8"), Paths: []Path{{SwIfIndex: 42}}}); err == nil {
		t.Error("path via a missing interface accepted")
	}
	if err := s.AddRoute(Route{Prefix: netip.MustParsePrefix("10.0.0.0/8"), Paths: []Path{{Type: "teleport"}}}); err == nil {
		t.Error("unknown path type accepted")
	}
	if err := s.AddRoute(Route{Prefix: netip.MustParsePrefix("192.0.2.0/24"), Paths: []Path{{Type: "drop"}}}); err != nil {
		t.Error(err)
	}
	ch := channel(t, connect(t, s))
	routes := dumpRoutes(t, ch, 0, false)
	if got, _ := findRoute(routes, "10.20.0.0/16"); got != "10.20.0.0/16 via 172.16.0.9@1" {
		t.Errorf("foreign route dumped as %q", got)
	}
	if got, _ := findRoute(routes, "192.0.2.0/24"); got != "192.0.2.0/24 via 0.0.0.0@-1:drop" {
		t.Errorf("foreign drop route dumped as %q", got)
	}
	if err := s.AddRoute(Route{Prefix: netip.MustParsePrefix("::ffff:10.30.0.0/112"), Paths: []Path{{Type: "drop"}}}); err != nil {
		t.Error(err)
	}
	if got, _ := findRoute(dumpRoutes(t, ch, 0, false), "10.30.0.0/16"); got == "" {
		t.Error("IPv4-mapped prefix not added as IPv4")
	}
	do(t, ch, routeReq(false, false, 0, "10.30.0.0/16"), new(ip.IPRouteAddDelReply))
	api := s.APIRoutes(0)
	if len(api) != 2 || api[0].Source != SourceAPI {
		t.Errorf("APIRoutes = %+v", api)
	}
	// The agent can delete foreign routes like its own.
	do(t, ch, routeReq(false, false, 0, "10.20.0.0/16"), new(ip.IPRouteAddDelReply))
	if len(s.APIRoutes(0)) != 1 {
		t.Errorf("APIRoutes after delete = %+v", s.APIRoutes(0))
	}
}

func addrReq(sw uint32, isAdd bool, prefix string) *interfaces.SwInterfaceAddDelAddress {
	p := netip.MustParsePrefix(prefix)
	return &interfaces.SwInterfaceAddDelAddress{
		SwIfIndex: interface_types.InterfaceIndex(sw),
		IsAdd:     isAdd,
		Prefix:    ip_types.AddressWithPrefix{Address: addressToAPI(p.Addr()), Len: uint8(p.Bits())},
	}
}

func TestInterfaces(t *testing.T) {
	s := startSim(t, Config{Interfaces: []string{"GigabitEthernet0/8/0", "tap0"}})
	ch := channel(t, connect(t, s))

	dump := func(req *interfaces.SwInterfaceDump) []*interfaces.SwInterfaceDetails {
		t.Helper()
		var out []*interfaces.SwInterfaceDetails
		mr := ch.SendMultiRequest(req)
		for {
			d := new(interfaces.SwInterfaceDetails)
			last, err := mr.ReceiveReply(d)
			if err != nil {
				t.Fatal(err)
			}
			if last {
				return out
			}
			out = append(out, d)
		}
	}
	all := dump(&interfaces.SwInterfaceDump{SwIfIndex: ^interface_types.InterfaceIndex(0)})
	if len(all) != 3 || all[0].InterfaceName != "local0" || all[0].SwIfIndex != 0 || all[1].InterfaceName != "GigabitEthernet0/8/0" || all[2].SwIfIndex != 2 {
		t.Fatalf("dump all: %+v", all)
	}
	if all[0].Flags&interface_types.IF_STATUS_API_FLAG_ADMIN_UP != 0 || all[1].Flags&interface_types.IF_STATUS_API_FLAG_ADMIN_UP != 0 {
		t.Error("interfaces must start admin-down")
	}
	if got := dump(&interfaces.SwInterfaceDump{}); len(got) != 3 {
		t.Errorf("sw_if_index 0 dumps %d interfaces, want all 3", len(got))
	}
	if got := dump(&interfaces.SwInterfaceDump{SwIfIndex: 2}); len(got) != 1 || got[0].InterfaceName != "tap0" {
		t.Errorf("dump of index 2: %+v", got)
	}
	if got := dump(&interfaces.SwInterfaceDump{SwIfIndex: 9}); len(got) != 0 {
		t.Errorf("dump of an invalid index: %d details", len(got))
	}
	if got := dump(&interfaces.SwInterfaceDump{SwIfIndex: ^interface_types.InterfaceIndex(0), NameFilterValid: true, NameFilter: "gigabit"}); len(got) != 1 || got[0].SwIfIndex != 1 {
		t.Errorf("name filter: %+v", got)
	}

	if rv := do(t, ch, &interfaces.SwInterfaceSetFlags{SwIfIndex: 7, Flags: 1}, new(interfaces.SwInterfaceSetFlagsReply)); rv != -2 {
		t.Errorf("set_flags on an invalid index: %d, want -2", rv)
	}
	if rv := do(t, ch, addrReq(7, true, "172.16.0.1/24"), new(interfaces.SwInterfaceAddDelAddressReply)); rv != -2 {
		t.Errorf("address on an invalid index: %d, want -2", rv)
	}
	if rv := do(t, ch, addrReq(0, true, "172.16.0.1/24"), new(interfaces.SwInterfaceAddDelAddressReply)); rv != -126 {
		t.Errorf("address on local0: %d, want -126", rv)
	}
	if rv := do(t, ch, addrReq(1, true, "172.16.0.1/24"), new(interfaces.SwInterfaceAddDelAddressReply)); rv != 0 {
		t.Fatalf("address add: %d", rv)
	}
	if len(dumpRoutes(t, ch, 0, false)) != 5 {
		t.Error("interface routes of an admin-down interface are in the FIB")
	}
	if rv := do(t, ch, &interfaces.SwInterfaceSetFlags{SwIfIndex: 1, Flags: interface_types.IF_STATUS_API_FLAG_ADMIN_UP}, new(interfaces.SwInterfaceSetFlagsReply)); rv != 0 {
		t.Fatalf("admin up: %d", rv)
	}
	if d := dump(&interfaces.SwInterfaceDump{SwIfIndex: 1}); len(d) != 1 || d[0].Flags != interface_types.IF_STATUS_API_FLAG_ADMIN_UP|interface_types.IF_STATUS_API_FLAG_LINK_UP {
		t.Errorf("flags after admin up: %+v", d)
	}
	routes := dumpRoutes(t, ch, 0, false)
	for prefix, want := range map[string]string{
		"172.16.0.0/24":   "172.16.0.1/24 via 0.0.0.0@1", // dumped as the address was given (measured)
		"172.16.0.1/32":   "172.16.0.1/32 via 172.16.0.1@1:local",
		"172.16.0.0/32":   "172.16.0.0/32 via 0.0.0.0@-1:drop",
		"172.16.0.255/32": "172.16.0.255/32 via 0.0.0.0@-1:drop",
	} {
		if got, _ := findRoute(routes, prefix); got != want {
			t.Errorf("%s dumped as %q, want %q", prefix, got, want)
		}
	}
	for _, r := range s.Routes(0, false) {
		if r.Prefix.String() == "172.16.0.0/24" && (r.Source != SourceInterface || r.Paths[0].Type != "attached") {
			t.Errorf("connected route %+v", r)
		}
	}
	if rv := do(t, ch, addrReq(1, true, "172.16.0.1/24"), new(interfaces.SwInterfaceAddDelAddressReply)); rv != -105 {
		t.Errorf("duplicate IPv4 address: %d, want -105", rv)
	}
	long := addrReq(1, true, "10.77.0.1/32")
	long.Prefix.Len = 33
	if rv := do(t, ch, long, new(interfaces.SwInterfaceAddDelAddressReply)); rv != -59 {
		t.Errorf("IPv4 /33: %d, want -59", rv)
	}
	if rv := do(t, ch, addrReq(2, true, "172.16.0.7/25"), new(interfaces.SwInterfaceAddDelAddressReply)); rv != -105 {
		t.Errorf("overlapping subnet on another interface: %d, want -105", rv)
	}
	if rv := do(t, ch, addrReq(1, true, "172.16.0.2/24"), new(interfaces.SwInterfaceAddDelAddressReply)); rv != 0 {
		t.Errorf("second address of the same prefix on the same interface: %d, want 0", rv)
	}
	if rv := do(t, ch, addrReq(1, false, "172.16.9.1/24"), new(interfaces.SwInterfaceAddDelAddressReply)); rv != -60 {
		t.Errorf("deleting a missing address: %d, want -60", rv)
	}
	if rv := do(t, ch, addrReq(2, true, "fd00::1/64"), new(interfaces.SwInterfaceAddDelAddressReply)); rv != 0 {
		t.Errorf("IPv6 address: %d", rv)
	}
	do(t, ch, &interfaces.SwInterfaceSetFlags{SwIfIndex: 2, Flags: interface_types.IF_STATUS_API_FLAG_ADMIN_UP}, new(interfaces.SwInterfaceSetFlagsReply))
	v6 := dumpRoutes(t, ch, 0, true)
	if got, _ := findRoute(v6, "fd00::/64"); got != "fd00::1/64 via ::@2" {
		t.Errorf("IPv6 connected route %q", got)
	}
	if got, _ := findRoute(v6, "fd00::1/128"); got != "fd00::1/128 via fd00::1@2:local" {
		t.Errorf("IPv6 local route %q", got)
	}
	if rv := do(t, ch, addrReq(2, true, "fd00::1/64"), new(interfaces.SwInterfaceAddDelAddressReply)); rv != -127 {
		t.Errorf("duplicate IPv6 address: %d, want -127", rv)
	}
	if rv := do(t, ch, addrReq(1, true, "fd00::9/96"), new(interfaces.SwInterfaceAddDelAddressReply)); rv != -127 {
		t.Errorf("overlapping IPv6 address on another interface: %d, want -127", rv)
	}

	var addrs []string
	mr := ch.SendMultiRequest(&ip.IPAddressDump{SwIfIndex: 1})
	for {
		d := new(ip.IPAddressDetails)
		last, err := mr.ReceiveReply(d)
		if err != nil {
			t.Fatal(err)
		}
		if last {
			break
		}
		p, _, _ := prefixFromAPI(ip_types.Prefix(d.Prefix))
		addrs = append(addrs, p.String())
	}
	if !slices.Equal(addrs, []string{"172.16.0.1/24", "172.16.0.2/24"}) {
		t.Errorf("ip_address_dump: %v", addrs)
	}

	// Deleting one address of the prefix keeps the connected route; admin
	// down removes every interface route.
	do(t, ch, addrReq(1, false, "172.16.0.1/24"), new(interfaces.SwInterfaceAddDelAddressReply))
	routes = dumpRoutes(t, ch, 0, false)
	if _, ok := findRoute(routes, "172.16.0.1/32"); ok {
		t.Error("local route of a deleted address left")
	}
	if _, ok := findRoute(routes, "172.16.0.0/24"); !ok {
		t.Error("connected route gone with one of two addresses")
	}
	do(t, ch, &interfaces.SwInterfaceSetFlags{SwIfIndex: 1}, new(interfaces.SwInterfaceSetFlagsReply))
	if _, ok := findRoute(dumpRoutes(t, ch, 0, false), "172.16.0.0/24"); ok {
		t.Error("connected route of an admin-down interface")
	}
	ifs := s.Interfaces()
	if ifs[1].AdminUp || !ifs[2].AdminUp || len(ifs[1].Addresses) != 1 {
		t.Errorf("Interfaces() = %+v", ifs)
	}
}

func TestLastAddr(t *testing.T) {
	for in, want := range map[string]string{
		"172.16.0.1/24": "172.16.0.255",
		"10.0.0.0/8":    "10.255.255.255",
		"0.0.0.0/0":     "255.255.255.255",
		"192.0.2.9/32":  "192.0.2.9",
	} {
		if got := lastAddr(netip.MustParsePrefix(in)).String(); got != want {
			t.Errorf("lastAddr(%s) = %s, want %s", in, got, want)
		}
	}
}
