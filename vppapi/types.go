package vppapi

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/vpp-route-agent/vpp-route-agent/internal/netaddr"
)

// Route is one route the agent programs: Prefix via NextHop on SwIfIndex in TableID, and, for an ECMP
// route, via the further paths in More. Canonical netip values (Masked, Unmap); Apply canonicalises again
// before encoding, so VPP always sees the masked prefix. NextHop may be the zero Addr: the route goes out
// of SwIfIndex alone, as through a p2p IPIP tunnel, and dumps as a Path with no NextHop on that
// interface; not through a VXLAN tunnel (ErrNoNextHop).
//
// An add replaces the prefix's whole path set with the route's paths in one ip_route_add_del
// (is_multipath=0, n_paths = 1 + More.Len()): VPP rewrites the entry's load-balance in place, so a change
// of the path set never passes through "no route" or a partial set. Route stays comparable (==): two
// routes with the same paths are equal when built by NewRoute, which puts them in canonical order.
type Route struct {
	Prefix    netip.Prefix
	NextHop   netip.Addr
	SwIfIndex uint32
	TableID   uint32
	// More are the paths after the first; the zero value for a single-path route.
	More Hops
}

// Hop is one path of a Route: via NextHop (zero: none) out of SwIfIndex.
type Hop struct {
	NextHop   netip.Addr
	SwIfIndex uint32
}

// String formats h like "via 192.0.2.7 sw_if_index 1".
func (h Hop) String() string {
	return Path{NextHop: h.NextHop, SwIfIndex: h.SwIfIndex}.String()
}

// compare orders hops as FIBEntry.Paths orders normal paths: next hop, then interface.
func (h Hop) compare(o Hop) int {
	if c := h.NextHop.Compare(o.NextHop); c != 0 {
		return c
	}
	return cmp.Compare(h.SwIfIndex, o.SwIfIndex)
}

// Hops is an immutable, comparable list of hops (a Route's further paths). Its zero value is empty.
type Hops struct{ enc string }

// hopLen is the encoded size of one hop: 16 address bytes, a family byte (0 none, 4, 6), 4 index bytes.
const hopLen = 21

// MakeHops returns hs as Hops, in the order given.
func MakeHops(hs []Hop) Hops {
	if len(hs) == 0 {
		return Hops{}
	}
	b := make([]byte, 0, len(hs)*hopLen)
	for _, h := range hs {
		var a [16]byte
		if h.NextHop.IsValid() {
			a = h.NextHop.As16()
		}
		b = append(b, a[:]...)
		switch {
		case h.NextHop.Is4():
			b = append(b, 4)
		case h.NextHop.Is6():
			b = append(b, 6)
		default:
			b = append(b, 0)
		}
		b = binary.BigEndian.AppendUint32(b, h.SwIfIndex)
	}
	return Hops{enc: string(b)}
}

// Len returns the number of hops.
func (h Hops) Len() int { return len(h.enc) / hopLen }

// All returns the hops in order.
func (h Hops) All() []Hop {
	out := make([]Hop, 0, h.Len())
	for i := 0; i+hopLen <= len(h.enc); i += hopLen {
		e := h.enc[i : i+hopLen]
		var a16 [16]byte
		copy(a16[:], e[:16])
		var a netip.Addr
		switch e[16] {
		case 4:
			a = netip.AddrFrom16(a16).Unmap()
		case 6:
			a = netip.AddrFrom16(a16)
		}
		out = append(out, Hop{NextHop: a, SwIfIndex: binary.BigEndian.Uint32([]byte(e[17:21]))})
	}
	return out
}

// NewRoute returns the route of prefix in table via every hop (at least one; duplicates dropped), in
// canonical order: the first hop in NextHop and SwIfIndex, the others in More. At most MaxPaths hops.
func NewRoute(prefix netip.Prefix, table uint32, hops []Hop) Route {
	hs := slices.Clone(hops)
	slices.SortFunc(hs, Hop.compare)
	hs = slices.Compact(hs)
	r := Route{Prefix: prefix, TableID: table}
	if len(hs) == 0 {
		return r
	}
	r.NextHop, r.SwIfIndex = hs[0].NextHop, hs[0].SwIfIndex
	r.More = MakeHops(hs[1:])
	return r
}

// MaxPaths is the most paths one ip_route_add_del carries (n_paths is a u8).
const MaxPaths = 255

// Hops returns all of r's paths: the first, then More.
func (r Route) Hops() []Hop {
	return append([]Hop{{NextHop: r.NextHop, SwIfIndex: r.SwIfIndex}}, r.More.All()...)
}

// String formats r the way errors name it: "10.244.3.0/26 via 192.0.2.7 sw_if_index 1 table 5", each path
// of an ECMP route in turn ("... via 192.0.2.7 sw_if_index 1 via 198.51.100.7 sw_if_index 2").
func (r Route) String() string {
	var b strings.Builder
	b.WriteString(r.Prefix.String())
	for _, h := range r.Hops() {
		if h.NextHop.IsValid() {
			b.WriteString(" via ")
			b.WriteString(h.NextHop.String())
		}
		b.WriteString(" sw_if_index ")
		b.WriteString(strconv.FormatUint(uint64(h.SwIfIndex), 10))
	}
	if r.TableID != 0 {
		b.WriteString(" table ")
		b.WriteString(strconv.FormatUint(uint64(r.TableID), 10))
	}
	return b.String()
}

// Canonical returns r with its prefix unmapped and masked and its next hops unmapped, or an error if the
// prefix is not valid.
func (r Route) Canonical() (Route, error) {
	if err := checkPrefix(r.Prefix); err != nil {
		return Route{}, err
	}
	r.Prefix = netaddr.Canonical(r.Prefix)
	if r.NextHop.IsValid() {
		r.NextHop = netaddr.CanonicalAddr(r.NextHop)
	}
	return r, nil
}

// FIBEntry is one dumped route, normalised: prefix canonical, paths sorted, weight dropped.
type FIBEntry struct {
	TableID uint32
	Prefix  netip.Prefix
	Paths   []Path
	// Source is the FIB source the entry forwards with (ip_route_v2_dump: SourceAPI for DumpAPIRoutes);
	// 0 when the dump does not say (ip_route_dump).
	Source Source
}

// Source is a FIB source of VPP 26.06 (fib_source_t): which part of VPP owns the paths an entry forwards
// with. Higher-priority sources (lower values) shadow lower ones for the same prefix.
type Source uint8

// FIB sources a route agent meets.
const (
	SourceSpecial   Source = 1
	SourceInterface Source = 4 // an interface address: connected (glean), local, network and broadcast
	SourceAPI       Source = 8 // ip_route_add_del, by any client
	SourceCLI       Source = 9
	SourceAdjacency Source = 15
	SourceRR        Source = 18 // recursive resolution
	SourceDefault   Source = 20
)

// String names the source as "show ip fib" does.
func (s Source) String() string {
	switch s {
	case 0:
		return "unknown"
	case SourceSpecial:
		return "special"
	case SourceInterface:
		return "interface"
	case SourceAPI:
		return "api"
	case SourceCLI:
		return "cli"
	case SourceAdjacency:
		return "adjacency"
	case SourceRR:
		return "recursive-resolution"
	case SourceDefault:
		return "default-route"
	}
	return "source-" + strconv.Itoa(int(s))
}

// Path is one path of a dumped route.
type Path struct {
	// NextHop is the next hop; the zero Addr if the path has none (attached, drop, ...).
	NextHop netip.Addr
	// SwIfIndex is the outgoing interface; ^uint32(0) if none.
	SwIfIndex uint32
	// Type is the kind of path.
	Type PathType
}

// String formats p like "via 192.0.2.7 sw_if_index 1" or "drop".
func (p Path) String() string {
	var b strings.Builder
	if p.Type != PathNormal {
		b.WriteString(p.Type.String())
	}
	if p.NextHop.IsValid() {
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString("via ")
		b.WriteString(p.NextHop.String())
	}
	if p.SwIfIndex != noInterface {
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString("sw_if_index ")
		b.WriteString(strconv.FormatUint(uint64(p.SwIfIndex), 10))
	}
	return b.String()
}

// compare orders paths by type, next hop, then interface: the normalised order of FIBEntry.Paths.
func (p Path) compare(q Path) int {
	if c := cmp.Compare(p.Type, q.Type); c != 0 {
		return c
	}
	if c := p.NextHop.Compare(q.NextHop); c != 0 {
		return c
	}
	return cmp.Compare(p.SwIfIndex, q.SwIfIndex)
}

// PathType is the kind of a FIB path. Its values are VPP's fib_path_type (fib_types.api), so a type this
// package has no name for is still reported faithfully.
type PathType uint8

// Path types, as VPP numbers them.
const (
	PathNormal       PathType = 0  // forward via next hop and/or interface
	PathLocal        PathType = 1  // receive: an address of this VPP
	PathDrop         PathType = 2  // drop
	PathUDPEncap     PathType = 3  // UDP encapsulation
	PathBierImp      PathType = 4  // BIER imposition
	PathICMPUnreach  PathType = 5  // drop with ICMP unreachable
	PathICMPProhibit PathType = 6  // drop with ICMP prohibited
	PathSourceLookup PathType = 7  // lookup on the source address
	PathDVR          PathType = 8  // distributed virtual router
	PathInterfaceRx  PathType = 9  // receive on an interface
	PathClassify     PathType = 10 // classifier
)

var pathTypeNames = [...]string{"normal", "local", "drop", "udp-encap", "bier-imp", "icmp-unreachable",
	"icmp-prohibit", "source-lookup", "dvr", "interface-rx", "classify"}

// String returns the path type's name, like "drop".
func (t PathType) String() string {
	if int(t) < len(pathTypeNames) {
		return pathTypeNames[t]
	}
	return fmt.Sprintf("PathType(%d)", uint8(t))
}

// Op says what Apply attempted for a route.
type Op int

// Operations of Apply.
const (
	OpAdd    Op = iota // add or replace the route's path set
	OpDelete           // delete the route
)

// String returns "add" or "delete".
func (o Op) String() string {
	switch o {
	case OpAdd:
		return "add"
	case OpDelete:
		return "delete"
	default:
		return fmt.Sprintf("Op(%d)", int(o))
	}
}

// RouteError is one route Apply failed to program, and why.
type RouteError struct {
	Route Route
	Op    Op
	// Err is why: an api.VPPApiError from VPP, or an error wrapping ErrTimeout, ErrNotConnected or the
	// ctx's error; "not sent: ..." for routes after the one that stopped the batch.
	Err error
}

// Error says what was attempted and why it failed: "add 10.244.3.0/26 via 192.0.2.7 sw_if_index 1: ...".
func (e RouteError) Error() string {
	if e.Op == OpDelete {
		return "delete " + deleteString(e.Route) + ": " + e.Err.Error()
	}
	return e.Op.String() + " " + e.Route.String() + ": " + e.Err.Error()
}

// Unwrap returns the cause, typically an api.VPPApiError, ErrTimeout or ErrNotConnected.
func (e RouteError) Unwrap() error { return e.Err }

// deleteString names a deleted route by what the delete request carries: prefix and table.
func deleteString(r Route) string {
	if r.TableID != 0 {
		return r.Prefix.String() + " table " + strconv.FormatUint(uint64(r.TableID), 10)
	}
	return r.Prefix.String()
}

// Result is the outcome of Apply or ApplySync: how many adds and deletes VPP accepted, and every route
// that failed.
type Result struct {
	// Added and Deleted count the routes VPP accepted.
	Added, Deleted int
	// Failed are the routes that failed, in input order (adds, then deletes).
	Failed []RouteError
}

// maxJoinedErrors bounds how many route errors Result.Err spells out.
const maxJoinedErrors = 10

// Err returns nil if nothing failed, else the first few route errors joined, with a count of the rest.
func (r Result) Err() error {
	if len(r.Failed) == 0 {
		return nil
	}
	n := min(len(r.Failed), maxJoinedErrors)
	errs := make([]error, 0, n+1)
	for _, e := range r.Failed[:n] {
		errs = append(errs, e)
	}
	if rest := len(r.Failed) - n; rest > 0 {
		errs = append(errs, fmt.Errorf("and %d more of %d failed routes", rest, len(r.Failed)))
	}
	return fmt.Errorf("%d routes failed: %w", len(r.Failed), errors.Join(errs...))
}
