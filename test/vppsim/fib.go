package vppsim

import (
	"cmp"
	"math/rand/v2"
	"net/netip"
	"slices"

	"go.fd.io/govpp/binapi/fib_types"
)

// This file holds the simulated VPP state: FIB tables with per-source
// contributions and interfaces with their addresses. It does no I/O; all of it
// is guarded by Sim.mu.

// Source tells which part of VPP owns the path set a FIB entry forwards
// with. The values are VPP 26.06's fib_source_t, as ip_route_v2_details
// carries them and ip_route_v2_dump filters on them (measured).
type Source uint8

const (
	// SourceSpecial marks the routes VPP creates with every table
	// (224.0.0.0/4 and 240.0.0.0/4 drops, IPv6 fe80::/10).
	SourceSpecial Source = 1
	// SourceInterface marks the routes VPP derives from interface addresses
	// (connected subnet, local address, network and broadcast drops).
	SourceInterface Source = 4
	// SourceAPI marks routes added with ip_route_add_del (by any client) or
	// with Sim.AddRoute.
	SourceAPI Source = 8
	// SourceAdjacency marks the /32 (/128) of a resolved neighbour
	// (Sim.ResolveNeighbor).
	SourceAdjacency Source = 15
	// SourceRR marks the recursive-resolution /32 (/128) VPP makes for the
	// next hop of a recursive path; it forwards with its cover's paths.
	SourceRR Source = 18
	// SourceDefault marks the default routes 0.0.0.0/0 and ::/0 and the
	// 0.0.0.0/32 and 255.255.255.255/32 drops.
	SourceDefault Source = 20
)

// String returns the source's name, as VPP's "show ip fib" spells it.
func (s Source) String() string {
	switch s {
	case SourceSpecial:
		return "special"
	case SourceInterface:
		return "interface"
	case SourceAPI:
		return "api"
	case SourceAdjacency:
		return "adjacency"
	case SourceRR:
		return "recursive-resolution"
	case SourceDefault:
		return "default-route"
	}
	return "unknown"
}

// MarshalText encodes the source as its String form (used by the JSON of
// the standalone command's /fib endpoint).
func (s Source) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// Path is one forwarding path of a route as VPP dumps it.
type Path struct {
	// NextHop is the next-hop address; the zero Addr when the path has none.
	NextHop netip.Addr `json:"next_hop,omitzero"`
	// SwIfIndex is the outgoing interface; ^uint32(0) when none (recursive
	// and drop paths).
	SwIfIndex uint32 `json:"sw_if_index"`
	// Type is "" for a normal path, "attached" for the connected route of an
	// interface address, or one of "local", "drop", "icmp-unreachable",
	// "icmp-prohibit", "udp-encap", "bier-imp", "source-lookup", "dvr",
	// "interface-rx", "classify".
	Type string `json:"type,omitempty"`
}

// Route is one FIB entry with the paths of its best source.
type Route struct {
	TableID uint32       `json:"table_id"`
	Prefix  netip.Prefix `json:"prefix"`
	Source  Source       `json:"source"`
	Paths   []Path       `json:"paths"`
	// Unresolved says that the route drops its traffic because an interface of its paths was deleted
	// (see DeleteInterface); the dump does not show it, "show ip fib" does.
	Unresolved bool `json:"unresolved,omitempty"`
}

// Interface is a snapshot of one simulated interface.
type Interface struct {
	SwIfIndex uint32 `json:"sw_if_index"`
	Name      string `json:"name"`
	AdminUp   bool   `json:"admin_up"`
	// LinkUp is the link state VPP reports: true only while the interface
	// is admin up and its carrier (SetLinkState, initially up) is up.
	LinkUp bool `json:"link_up"`
	// Addresses are the interface addresses with their prefix length (host
	// bits kept), in the order they were added.
	Addresses []netip.Prefix `json:"addresses"`
}

var pathTypeNames = map[fib_types.FibPathType]string{
	fib_types.FIB_API_PATH_TYPE_NORMAL:        "",
	fib_types.FIB_API_PATH_TYPE_LOCAL:         "local",
	fib_types.FIB_API_PATH_TYPE_DROP:          "drop",
	fib_types.FIB_API_PATH_TYPE_UDP_ENCAP:     "udp-encap",
	fib_types.FIB_API_PATH_TYPE_BIER_IMP:      "bier-imp",
	fib_types.FIB_API_PATH_TYPE_ICMP_UNREACH:  "icmp-unreachable",
	fib_types.FIB_API_PATH_TYPE_ICMP_PROHIBIT: "icmp-prohibit",
	fib_types.FIB_API_PATH_TYPE_SOURCE_LOOKUP: "source-lookup",
	fib_types.FIB_API_PATH_TYPE_DVR:           "dvr",
	fib_types.FIB_API_PATH_TYPE_INTERFACE_RX:  "interface-rx",
	fib_types.FIB_API_PATH_TYPE_CLASSIFY:      "classify",
}

// fibPath is a path as the simulator stores it: comparable, so that equal
// paths are equal structs (VPP compares weight and preference too).
type fibPath struct {
	typ        fib_types.FibPathType
	proto      fib_types.FibPathNhProto
	flags      fib_types.FibPathFlags
	swIfIndex  uint32
	tableID    uint32 // next-hop table of a recursive path
	nh         netip.Addr
	weight     uint8
	preference uint8
	attached   bool // the connected route of an interface address
}

func (p fibPath) export() Path {
	t := pathTypeNames[p.typ]
	if p.attached {
		t = "attached"
	}
	return Path{NextHop: p.nh, SwIfIndex: p.swIfIndex, Type: t}
}

func comparePaths(a, b fibPath) int {
	if c := a.nh.Compare(b.nh); c != 0 {
		return c
	}
	if c := cmp.Compare(a.swIfIndex, b.swIfIndex); c != 0 {
		return c
	}
	if c := cmp.Compare(a.typ, b.typ); c != 0 {
		return c
	}
	if c := cmp.Compare(a.proto, b.proto); c != 0 {
		return c
	}
	if c := cmp.Compare(a.tableID, b.tableID); c != 0 {
		return c
	}
	if c := cmp.Compare(a.weight, b.weight); c != 0 {
		return c
	}
	if c := cmp.Compare(a.preference, b.preference); c != 0 {
		return c
	}
	return cmp.Compare(a.flags, b.flags)
}

// normalizePaths sorts paths and drops duplicates, in place.
func normalizePaths(ps []fibPath) []fibPath {
	if len(ps) > 1 {
		slices.SortFunc(ps, comparePaths)
		ps = slices.Compact(ps)
	}
	return ps
}

func dropPath(ip6 bool) fibPath {
	return fibPath{typ: fib_types.FIB_API_PATH_TYPE_DROP, proto: protoOf(ip6), swIfIndex: ^uint32(0), weight: 1}
}

func protoOf(ip6 bool) fib_types.FibPathNhProto {
	if ip6 {
		return fib_types.FIB_API_PATH_NH_PROTO_IP6
	}
	return fib_types.FIB_API_PATH_NH_PROTO_IP4
}

// entry is one prefix of a table with the contribution of each source (nil:
// none). The best source wins: special, interface, API, adjacency,
// recursive-resolution, then the default route.
type entry struct {
	prefix netip.Prefix // masked: the key
	// shown is the prefix as first created, host bits kept: what VPP dumps
	// (measured: 10.1.2.5/26, a connected 172.16.0.1/24).
	shown   netip.Prefix
	stats   uint32
	special []fibPath // cannot be overridden
	iface   []fibPath
	api     []fibPath
	// apiDead marks API paths bound to an interface that was deleted: VPP keeps the route, dumped as
	// before, but drops its traffic, even once an interface takes the index again, until the path set
	// changes (an identical re-add is a no-op) or the route is deleted and added again, and then only
	// if no other dead route with the same paths is left (measured on 26.06: "oper-flags:drop ...
	// unresolved" in show ip fib).
	apiDead bool
	adj     []fibPath
	rr      []fibPath
	deflt   []fibPath // the lowest priority
}

func (e *entry) best() (Source, []fibPath) {
	switch {
	case e.special != nil:
		return SourceSpecial, e.special
	case e.iface != nil:
		return SourceInterface, e.iface
	case e.api != nil:
		return SourceAPI, e.api
	case e.adj != nil:
		return SourceAdjacency, e.adj
	case e.rr != nil:
		return SourceRR, e.rr
	default:
		return SourceDefault, e.deflt
	}
}

func (e *entry) empty() bool {
	return e.special == nil && e.iface == nil && e.api == nil && e.adj == nil && e.rr == nil && e.deflt == nil
}

type tableKey struct {
	id  uint32
	ip6 bool
}

type fibTable struct {
	key     tableKey
	name    string
	entries map[netip.Prefix]*entry
	// rrRefs counts, per next hop, the recursive API paths that need its
	// recursive-resolution /32 (/128); rrEntries are the entries with a
	// recursive-resolution contribution.
	rrRefs    map[netip.Addr]int
	rrEntries map[netip.Prefix]*entry
	// dead are the entries whose API paths are dead (entry.apiDead).
	dead map[*entry]struct{}
}

var (
	defaultV4 = []netip.Prefix{
		netip.MustParsePrefix("0.0.0.0/0"),
		netip.MustParsePrefix("0.0.0.0/32"),
		netip.MustParsePrefix("255.255.255.255/32"),
	}
	specialV4 = []netip.Prefix{
		netip.MustParsePrefix("224.0.0.0/4"),
		netip.MustParsePrefix("240.0.0.0/4"),
	}
	defaultV6 = []netip.Prefix{netip.MustParsePrefix("::/0")}
	// linkLocalV6 is in every IPv6 table, dumped with no path (measured).
	linkLocalV6 = netip.MustParsePrefix("fe80::/10")
)

// newTable creates a table with the routes VPP puts in every table.
func (s *Sim) newTable(key tableKey, name string) *fibTable {
	t := &fibTable{key: key, name: name, entries: make(map[netip.Prefix]*entry), rrRefs: make(map[netip.Addr]int),
		rrEntries: make(map[netip.Prefix]*entry), dead: make(map[*entry]struct{})}
	if key.ip6 {
		for _, p := range defaultV6 {
			s.getEntry(t, p).deflt = []fibPath{dropPath(true)}
		}
		s.getEntry(t, linkLocalV6).special = []fibPath{}
		return t
	}
	for _, p := range defaultV4 {
		s.getEntry(t, p).deflt = []fibPath{dropPath(false)}
	}
	for _, p := range specialV4 {
		s.getEntry(t, p).special = []fibPath{dropPath(false)}
	}
	return t
}

// getEntry returns the entry of p, creating it (as p, host bits kept) if
// there is none.
func (s *Sim) getEntry(t *fibTable, p netip.Prefix) *entry {
	key := p.Masked()
	e := t.entries[key]
	if e == nil {
		s.statsIndex++
		e = &entry{prefix: key, shown: p, stats: s.statsIndex}
		t.entries[key] = e
	}
	return e
}

func (t *fibTable) gc(e *entry) {
	if e.empty() {
		delete(t.entries, e.prefix)
	}
}

// entries returns the table's entries in no particular order, different
// from one call to the next: VPP dumps in hash order (measured), and clients
// must not depend on any.
func (t *fibTable) entryList() []*entry {
	es := make([]*entry, 0, len(t.entries))
	for _, e := range t.entries {
		es = append(es, e)
	}
	rand.Shuffle(len(es), func(i, j int) { es[i], es[j] = es[j], es[i] })
	return es
}

// setAPI replaces the API contribution of e (nil: none), keeping the
// recursive-resolution entries of recursive paths in step.
func (s *Sim) setAPI(t *fibTable, e *entry, paths []fibPath) {
	for _, p := range e.api {
		if p.recursive() {
			if t.rrRefs[p.nh]--; t.rrRefs[p.nh] <= 0 {
				delete(t.rrRefs, p.nh)
			}
		}
	}
	if !slices.Equal(e.api, paths) {
		// New paths resolve afresh, unless a dead route with the same paths is still there: VPP shares
		// one path list between them (measured).
		e.apiDead = false
		for d := range t.dead {
			if d != e && slices.Equal(d.api, paths) {
				e.apiDead = true
				break
			}
		}
	}
	if e.apiDead && paths != nil {
		t.dead[e] = struct{}{}
	} else {
		e.apiDead = false
		delete(t.dead, e)
	}
	e.api = paths
	for _, p := range e.api {
		if p.recursive() {
			t.rrRefs[p.nh]++
		}
	}
	t.gc(e)
	s.syncRRAfter(t, e.prefix)
	s.trackTunnels(paths)
}

// recursive reports whether p resolves through the FIB (a next hop, no
// interface).
func (p fibPath) recursive() bool {
	return p.typ == fib_types.FIB_API_PATH_TYPE_NORMAL && p.swIfIndex == ^uint32(0) && p.nh.IsValid()
}

// syncRR makes the recursive-resolution entries of t match its recursive
// next hops: each /32 (/128) forwards with the paths of its cover, the
// longest other prefix containing it, as VPP dumps it (measured: a route via
// 10.1.7.1 makes "10.1.7.1/32 via 192.0.2.9 if 1" under the covering
// "10.1.7.0/26 via 192.0.2.9 if 1").
func (s *Sim) syncRR(t *fibTable) {
	all := netip.PrefixFrom(netip.IPv4Unspecified(), 0)
	if t.key.ip6 {
		all = netip.PrefixFrom(netip.IPv6Unspecified(), 0)
	}
	s.syncRRAfter(t, all)
}

// syncRRAfter is syncRR after a change to the entry of prefix changed (the zero Prefix: none): only the
// recursive-resolution entries that changed may cover, and new ones, are computed again. It keeps a
// table of many tunnels or recursive next hops from costing a full recomputation per route.
func (s *Sim) syncRRAfter(t *fibTable, changed netip.Prefix) {
	for p, e := range t.rrEntries {
		if _, ok := t.rrRefs[p.Addr()]; !ok {
			e.rr = nil
			delete(t.rrEntries, p)
			t.gc(e)
		}
	}
	for nh := range t.rrRefs {
		host := netip.PrefixFrom(nh, nh.BitLen())
		if _, ok := t.rrEntries[host]; ok && !(changed.IsValid() && changed.Contains(nh)) {
			continue
		}
		var cover []fibPath
		for bits := nh.BitLen() - 1; bits >= 0; bits-- {
			if c := t.entries[netip.PrefixFrom(nh, bits).Masked()]; c != nil {
				if _, paths := c.best(); paths != nil {
					cover = paths
					break
				}
			}
		}
		if cover == nil {
			cover = []fibPath{dropPath(nh.Is6())}
		}
		e := s.getEntry(t, host)
		e.rr = rrPaths(cover, nh)
		t.rrEntries[host] = e
	}
}

// rrPaths are the paths a recursive-resolution /32 (/128) of nh forwards with under cover's paths: the
// cover's, except that an attached (connected) path becomes "via nh" on its interface, as VPP resolves
// a host through its connected cover (measured: "192.0.2.2/32 via 192.0.2.2 if 1" under 192.0.2.1/24).
func rrPaths(cover []fibPath, nh netip.Addr) []fibPath {
	out := slices.Clone(cover)
	for i, p := range out {
		if p.attached && !p.nh.IsValid() {
			out[i] = fibPath{typ: fib_types.FIB_API_PATH_TYPE_NORMAL, proto: p.proto, swIfIndex: p.swIfIndex, nh: nh, weight: 1}
		}
	}
	return out
}

// apiReplace sets the API paths of prefix p (ip_route_add_del, not multipath).
func (s *Sim) apiReplace(t *fibTable, p netip.Prefix, paths []fibPath) *entry {
	e := s.getEntry(t, p)
	s.setAPI(t, e, normalizePaths(paths))
	return e
}

// apiAddPaths adds paths to the API path set of p (multipath add).
func (s *Sim) apiAddPaths(t *fibTable, p netip.Prefix, paths []fibPath) *entry {
	e := s.getEntry(t, p)
	s.setAPI(t, e, normalizePaths(append(slices.Clone(e.api), paths...)))
	return e
}

// apiRemovePaths removes paths from the API path set of p (multipath delete);
// the API source goes away with its last path.
func (s *Sim) apiRemovePaths(t *fibTable, p netip.Prefix, paths []fibPath) {
	e := t.entries[p]
	if e == nil || e.api == nil {
		return
	}
	kept := e.api[:0:0]
	for _, ep := range e.api {
		if !slices.Contains(paths, ep) {
			kept = append(kept, ep)
		}
	}
	if len(kept) == 0 {
		kept = nil
	}
	s.setAPI(t, e, kept)
}

// apiDelete removes the API source of p (delete, not multipath). Other
// sources stay: deleting VPP's own recursive-resolution or adjacency entry
// over the API is accepted and changes nothing.
func (s *Sim) apiDelete(t *fibTable, p netip.Prefix) {
	if e := t.entries[p]; e != nil && e.api != nil {
		s.setAPI(t, e, nil)
	}
}

func (t *fibTable) export(e *entry, src Source, paths []fibPath) Route {
	r := Route{TableID: t.key.id, Prefix: e.prefix, Source: src, Paths: make([]Path, len(paths)), Unresolved: src == SourceAPI && e.apiDead}
	for i, p := range paths {
		r.Paths[i] = p.export()
	}
	return r
}

// iface is one simulated interface.
type iface struct {
	index   uint32
	name    string
	deleted bool // its index is free: VPP gives it to the next interface created
	adminUp bool
	carrier bool // physical link; VPP reports link up only while admin up too
	mac     [6]byte
	addrs   []netip.Prefix // address with prefix length, host bits kept
	// tunnel is set for an IPIP tunnel's interface (tunnel.go).
	tunnel *ipipTunnel
	// vxlan is set for a VXLAN tunnel's interface (vxlan.go).
	vxlan *vxlanTunnel
	// unnumbered is the index whose addresses this interface borrows; nil if none.
	unnumbered *uint32
	// mtu is the L3/IPv4/IPv6/MPLS MTU as set by sw_interface_set_mtu; nil: the default.
	mtu *[4]uint32
	// tag is the interface's tag (sw_interface_tag_add_del); "" when none.
	tag string
}

// linkUp is the link state VPP reports: a hardware interface's link comes up
// only once it is admin up and has carrier.
func (i *iface) linkUp() bool { return i.adminUp && i.carrier }

func (i *iface) export() Interface {
	return Interface{
		SwIfIndex: i.index,
		Name:      i.name,
		AdminUp:   i.adminUp,
		LinkUp:    i.linkUp(),
		Addresses: slices.Clone(i.addrs),
	}
}

// syncInterfaceRoutes recomputes the interface-sourced entries of table 0
// from the addresses of every admin-up interface, as VPP adds and removes them
// on address changes and admin up/down. It touches only the entries that
// carry or will carry an interface contribution.
func (s *Sim) syncInterfaceRoutes() {
	for p := range s.ifacePrefixes {
		t := s.tables[tableKey{0, p.Addr().Is6()}]
		if e := t.entries[p]; e != nil {
			e.iface = nil
			t.gc(e)
		}
	}
	clear(s.ifacePrefixes)
	add := func(p netip.Prefix, fp fibPath) {
		t := s.tables[tableKey{0, p.Addr().Is6()}]
		e := s.getEntry(t, p)
		if !slices.Contains(e.iface, fp) {
			e.iface = normalizePaths(append(e.iface, fp))
		}
		s.ifacePrefixes[e.prefix] = struct{}{}
	}
	for _, ifc := range s.ifaces {
		if !ifc.adminUp || ifc.deleted {
			continue
		}
		for _, a := range ifc.addrs {
			ip6 := a.Addr().Is6()
			proto := protoOf(ip6)
			host := netip.PrefixFrom(a.Addr(), a.Addr().BitLen())
			attached := fibPath{typ: fib_types.FIB_API_PATH_TYPE_NORMAL, proto: proto, swIfIndex: ifc.index, weight: 1, attached: true}
			switch {
			case !ip6 && a.Bits() <= 30, ip6 && a.Bits() < 128:
				add(a, attached) // dumped as the address was given: 172.16.0.1/24
				if !ip6 {
					network := netip.PrefixFrom(a.Masked().Addr(), 32)
					if network != host {
						add(network, dropPath(false))
					}
					bcast := netip.PrefixFrom(lastAddr(a), 32)
					if bcast != host {
						add(bcast, dropPath(false))
					}
				}
			case !ip6 && a.Bits() == 31:
				// The connected /31 and the peer's /32 (measured: 10.9.0.1/31 gives
				// 10.9.0.1/31, 10.9.0.0/32 and the local 10.9.0.1/32).
				add(a, attached)
				b := a.Addr().As4()
				b[3] ^= 1
				other := netip.AddrFrom4(b)
				p := attached
				p.nh = other
				add(netip.PrefixFrom(other, 32), p)
			}
			add(host, fibPath{typ: fib_types.FIB_API_PATH_TYPE_LOCAL, proto: proto, swIfIndex: ifc.index, nh: a.Addr(), weight: 1})
		}
	}
}

// lastAddr returns the highest address of an IPv4 prefix (its broadcast).
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().As4()
	host := uint32(1)<<(32-p.Bits()) - 1
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	v |= host
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// overlaps reports whether a and b share any address.
func overlaps(a, b netip.Prefix) bool {
	return a.Addr().Is6() == b.Addr().Is6() && a.Masked().Overlaps(b.Masked())
}
