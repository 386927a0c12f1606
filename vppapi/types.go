package vppapi

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// Route is one route the agent programs: Prefix via NextHop on SwIfIndex in TableID. Canonical netip
// values (Masked, Unmap); Apply canonicalises again before encoding, so VPP always sees the masked prefix.
// NextHop may be the zero Addr: the route goes out of SwIfIndex alone, as through a p2p IPIP tunnel, and
// dumps as a Path with no NextHop on that interface; not through a VXLAN tunnel (ErrNoNextHop).
type Route struct {
	Prefix    netip.Prefix
	NextHop   netip.Addr
	SwIfIndex uint32
	TableID   uint32
}

// String formats r the way errors name it: "10.244.3.0/26 via 192.0.2.7 sw_if_index 1 table 5".
func (r Route) String() string {
	var b strings.Builder
	b.WriteString(r.Prefix.String())
	if r.NextHop.IsValid() {
		b.WriteString(" via ")
		b.WriteString(r.NextHop.String())
	}
	b.WriteString(" sw_if_index ")
	b.WriteString(strconv.FormatUint(uint64(r.SwIfIndex), 10))
	if r.TableID != 0 {
		b.WriteString(" table ")
		b.WriteString(strconv.FormatUint(uint64(r.TableID), 10))
	}
	return b.String()
}

// Canonical returns r with its prefix unmapped and masked and its next hop unmapped, or an error if the
// prefix is not valid.
func (r Route) Canonical() (Route, error) {
	p, err := canonicalPrefix(r.Prefix)
	if err != nil {
		return Route{}, err
	}
	r.Prefix = p
	if r.NextHop.IsValid() {
		r.NextHop = canonicalAddr(r.NextHop)
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
