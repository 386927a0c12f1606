package vppapi

// All conversion between netip values and GoVPP's binapi types lives in this file. Values going to VPP
// and values coming back are canonical: addresses Unmap'ed (an IPv4-mapped IPv6 address is IPv4), route
// prefixes Masked. Interface addresses keep their host bits (192.0.2.7/24 is an address, not a route).

import (
	"fmt"
	"net/netip"
	"slices"

	"go.fd.io/govpp/binapi/fib_types"
	"go.fd.io/govpp/binapi/ip"
	"go.fd.io/govpp/binapi/ip_types"

	"github.com/vpp-route-agent/vpp-route-agent/internal/netaddr"
)

// noInterface is the sw_if_index VPP uses for "no interface" (~0).
const noInterface = ^uint32(0)

// checkPrefix refuses an invalid prefix, which netaddr would pass through unchanged.
func checkPrefix(p netip.Prefix) error {
	if !p.IsValid() {
		return fmt.Errorf("invalid prefix %q", p)
	}
	return nil
}

// putAPIAddress writes a into VPP's address union; a must be valid and unmapped when IPv4.
func putAPIAddress(u *ip_types.AddressUnion, a netip.Addr) ip_types.AddressFamily {
	// The union's wire form is the address bytes, zero-padded to 16: what AddressUnion.SetIP4/SetIP6 write,
	// without their per-call allocation.
	u.XXX_UnionData = [16]byte{}
	if a.Is4() {
		b := a.As4()
		copy(u.XXX_UnionData[:], b[:])
		return ip_types.ADDRESS_IP4
	}
	u.XXX_UnionData = a.As16()
	return ip_types.ADDRESS_IP6
}

// toAPIAddress converts an address for VPP.
func toAPIAddress(a netip.Addr) (ip_types.Address, error) {
	if !a.IsValid() {
		return ip_types.Address{}, fmt.Errorf("invalid address %q", a)
	}
	var out ip_types.Address
	out.Af = putAPIAddress(&out.Un, netaddr.CanonicalAddr(a))
	return out, nil
}

// addrFromUnion reads an address of family af from VPP's address union.
func addrFromUnion(af ip_types.AddressFamily, u ip_types.AddressUnion) (netip.Addr, error) {
	switch af {
	case ip_types.ADDRESS_IP4:
		return netip.AddrFrom4([4]byte(u.XXX_UnionData[:4])), nil
	case ip_types.ADDRESS_IP6:
		return netip.AddrFrom16(u.XXX_UnionData).Unmap(), nil
	default:
		return netip.Addr{}, fmt.Errorf("unknown address family %d", af)
	}
}

// fromAPIAddress converts an address from VPP.
func fromAPIAddress(a ip_types.Address) (netip.Addr, error) {
	return addrFromUnion(a.Af, a.Un)
}

// prefixFromAPI reads a prefix of VPP's shape, checking its length against the family; not masked.
func prefixFromAPI(a ip_types.Address, length uint8) (netip.Prefix, error) {
	addr, err := fromAPIAddress(a)
	if err != nil {
		return netip.Prefix{}, err
	}
	// An IPv6 address that was IPv4-mapped has been unmapped: its length is relative to 128 bits.
	if a.Af == ip_types.ADDRESS_IP6 && addr.Is4() {
		if length < 96 {
			return netip.PrefixFrom(netip.AddrFrom16(a.Un.XXX_UnionData), int(length)), nil
		}
		length -= 96
	}
	if int(length) > addr.BitLen() {
		return netip.Prefix{}, fmt.Errorf("prefix length %d too long for %v", length, addr)
	}
	return netip.PrefixFrom(addr, int(length)), nil
}

// toAPIPrefix converts a route prefix for VPP: unmapped and masked.
func toAPIPrefix(p netip.Prefix) (ip_types.Prefix, error) {
	if err := checkPrefix(p); err != nil {
		return ip_types.Prefix{}, err
	}
	p = netaddr.Canonical(p)
	var out ip_types.Prefix
	out.Address.Af = putAPIAddress(&out.Address.Un, p.Addr())
	out.Len = uint8(p.Bits())
	return out, nil
}

// fromAPIPrefix converts a route prefix from VPP: unmapped and masked.
func fromAPIPrefix(p ip_types.Prefix) (netip.Prefix, error) {
	out, err := prefixFromAPI(p.Address, p.Len)
	if err != nil {
		return netip.Prefix{}, err
	}
	return out.Masked(), nil
}

// toAPIAddressWithPrefix converts an interface address (host bits kept) for VPP.
func toAPIAddressWithPrefix(p netip.Prefix) (ip_types.AddressWithPrefix, error) {
	if err := checkPrefix(p); err != nil {
		return ip_types.AddressWithPrefix{}, err
	}
	p = netaddr.Unmap(p)
	var out ip_types.AddressWithPrefix
	out.Address.Af = putAPIAddress(&out.Address.Un, p.Addr())
	out.Len = uint8(p.Bits())
	return out, nil
}

// fromAPIAddressWithPrefix converts an interface address (host bits kept) from VPP.
func fromAPIAddressWithPrefix(p ip_types.AddressWithPrefix) (netip.Prefix, error) {
	return prefixFromAPI(p.Address, p.Len)
}

// toAPIPath returns the single path of a route: via nextHop on swIfIndex, weight 1, next-hop protocol from
// the next hop's family (or the prefix's when there is no next hop: an attached route).
func toAPIPath(nextHop netip.Addr, swIfIndex uint32, prefixIs4 bool) fib_types.FibPath {
	path := fib_types.FibPath{SwIfIndex: swIfIndex, Weight: 1, Proto: fib_types.FIB_API_PATH_NH_PROTO_IP6}
	is4 := prefixIs4
	if nextHop.IsValid() {
		nh := netaddr.CanonicalAddr(nextHop)
		is4 = nh.Is4()
		putAPIAddress(&path.Nh.Address, nh)
	}
	if is4 {
		path.Proto = fib_types.FIB_API_PATH_NH_PROTO_IP4
	}
	return path
}

// fromAPIPath converts one dumped path, dropping weight and preference. A next hop of all zeros, or of a
// protocol that is not IP, is no next hop.
func fromAPIPath(p fib_types.FibPath) Path {
	out := Path{SwIfIndex: p.SwIfIndex, Type: PathType(p.Type)}
	var nh netip.Addr
	switch p.Proto {
	case fib_types.FIB_API_PATH_NH_PROTO_IP4:
		nh, _ = addrFromUnion(ip_types.ADDRESS_IP4, p.Nh.Address)
	case fib_types.FIB_API_PATH_NH_PROTO_IP6:
		nh, _ = addrFromUnion(ip_types.ADDRESS_IP6, p.Nh.Address)
	}
	if nh.IsValid() && !nh.IsUnspecified() {
		out.NextHop = nh
	}
	return out
}

// fillRouteAddDel encodes r into msg as a replace (isAdd, every path of r) or a delete (no path). It reuses
// msg's path slice, so a pipelined Apply encodes every route into one message without allocating.
func fillRouteAddDel(msg *ip.IPRouteAddDel, r Route, isAdd bool) error {
	prefix, err := toAPIPrefix(r.Prefix)
	if err != nil {
		return err
	}
	if r.NextHop.IsValid() && r.NextHop.Zone() != "" {
		return fmt.Errorf("next hop %v has a zone", r.NextHop)
	}
	msg.IsAdd = isAdd
	msg.IsMultipath = false
	msg.Route.TableID = r.TableID
	msg.Route.StatsIndex = 0
	msg.Route.Prefix = prefix
	msg.Route.Paths = msg.Route.Paths[:0]
	if isAdd {
		if r.More.Len() >= MaxPaths {
			return fmt.Errorf("%d paths: at most %d", r.More.Len()+1, MaxPaths)
		}
		is4 := prefix.Address.Af == ip_types.ADDRESS_IP4
		msg.Route.Paths = append(msg.Route.Paths, toAPIPath(r.NextHop, r.SwIfIndex, is4))
		for _, h := range r.More.All() {
			if h.NextHop.IsValid() && h.NextHop.Zone() != "" {
				return fmt.Errorf("next hop %v has a zone", h.NextHop)
			}
			msg.Route.Paths = append(msg.Route.Paths, toAPIPath(h.NextHop, h.SwIfIndex, is4))
		}
	}
	msg.Route.NPaths = uint8(len(msg.Route.Paths))
	return nil
}

// entryFromAPI converts one dumped route (ip_route_details or ip_route_v2_details): prefix masked, paths
// normalised and sorted.
func entryFromAPI(tableID uint32, apiPrefix ip_types.Prefix, paths []fib_types.FibPath) (FIBEntry, error) {
	prefix, err := fromAPIPrefix(apiPrefix)
	if err != nil {
		return FIBEntry{}, fmt.Errorf("route in table %d: %w", tableID, err)
	}
	e := FIBEntry{TableID: tableID, Prefix: prefix}
	if len(paths) > 0 {
		e.Paths = make([]Path, len(paths))
		for i, p := range paths {
			e.Paths[i] = fromAPIPath(p)
		}
		slices.SortFunc(e.Paths, Path.compare)
	}
	return e, nil
}
