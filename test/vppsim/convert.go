package vppsim

import (
	"net/netip"

	"go.fd.io/govpp/binapi/fib_types"
	"go.fd.io/govpp/binapi/ip_types"
)

// This file converts between binapi wire types and netip / simulator types.

// VPP API return values the simulator produces.
const (
	rvOK                    int32 = 0
	rvUnspecified           int32 = -1
	rvInvalidSwIfIndex      int32 = -2
	rvNoSuchFIB             int32 = -3
	rvInvalidRegistration   int32 = -31
	rvNoPathsInRoute        int32 = -52
	rvNoMatchingInterface   int32 = -54
	rvAddressLengthMismatch int32 = -59
	rvAddressNotFound       int32 = -60
	rvNoSuchTable           int32 = -65
	rvAddressInUse          int32 = -105
	rvUnsupported           int32 = -126
	rvDuplicateIfAddress    int32 = -127
	rvInvalidPrefixLength   int32 = -171
	sockclntDeleteResponse  int32 = 1
)

// prefixFromAPI decodes a binapi prefix. ok is false when the length exceeds
// the family's address length. The returned prefix keeps host bits.
func prefixFromAPI(p ip_types.Prefix) (pfx netip.Prefix, ip6, ok bool) {
	ip6 = p.Address.Af == ip_types.ADDRESS_IP6
	a := addrFromUnion(p.Address.Un, ip6)
	if int(p.Len) > a.BitLen() {
		return netip.Prefix{}, ip6, false
	}
	return netip.PrefixFrom(a, int(p.Len)), ip6, true
}

func addrFromUnion(u ip_types.AddressUnion, ip6 bool) netip.Addr {
	if ip6 {
		return netip.AddrFrom16(u.GetIP6())
	}
	return netip.AddrFrom4(u.GetIP4())
}

func addressToAPI(a netip.Addr) ip_types.Address {
	if a.Is4() {
		return ip_types.Address{Af: ip_types.ADDRESS_IP4, Un: ip_types.AddressUnionIP4(a.As4())}
	}
	return ip_types.Address{Af: ip_types.ADDRESS_IP6, Un: ip_types.AddressUnionIP6(a.As16())}
}

func prefixToAPI(p netip.Prefix) ip_types.Prefix {
	return ip_types.Prefix{Address: addressToAPI(p.Addr()), Len: uint8(p.Bits())}
}

// pathFromAPI decodes and validates one path of ip_route_add_del the way
// VPP's fib_api_path_decode does: proto first, then the type, then the
// next-hop table of a recursive path or the interface of an attached one.
func (s *Sim) pathFromAPI(in fib_types.FibPath) (fibPath, int32) {
	p := fibPath{
		proto:      in.Proto,
		flags:      in.Flags & (fib_types.FIB_API_PATH_FLAG_RESOLVE_VIA_ATTACHED | fib_types.FIB_API_PATH_FLAG_RESOLVE_VIA_HOST),
		weight:     in.Weight,
		preference: in.Preference,
		swIfIndex:  ^uint32(0),
	}
	if p.weight == 0 {
		p.weight = 1
	}
	if in.Proto > fib_types.FIB_API_PATH_NH_PROTO_BIER {
		return p, rvUnspecified
	}
	ipProto := in.Proto == fib_types.FIB_API_PATH_NH_PROTO_IP4 || in.Proto == fib_types.FIB_API_PATH_NH_PROTO_IP6
	switch in.Type {
	case fib_types.FIB_API_PATH_TYPE_DROP, fib_types.FIB_API_PATH_TYPE_ICMP_UNREACH,
		fib_types.FIB_API_PATH_TYPE_ICMP_PROHIBIT, fib_types.FIB_API_PATH_TYPE_UDP_ENCAP,
		fib_types.FIB_API_PATH_TYPE_BIER_IMP:
		p.typ = in.Type
		return p, rvOK
	case fib_types.FIB_API_PATH_TYPE_LOCAL, fib_types.FIB_API_PATH_TYPE_DVR, fib_types.FIB_API_PATH_TYPE_INTERFACE_RX:
		p.typ = in.Type
		p.swIfIndex = in.SwIfIndex
		return p, rvOK
	case fib_types.FIB_API_PATH_TYPE_CLASSIFY:
		return p, rvNoSuchTable // the simulator has no classify tables
	case fib_types.FIB_API_PATH_TYPE_NORMAL, fib_types.FIB_API_PATH_TYPE_SOURCE_LOOKUP:
		p.typ = in.Type
	default:
		// VPP's decoder has no default case: an unknown type is a normal path
		// without its interface and next hop.
		p.typ = fib_types.FIB_API_PATH_TYPE_NORMAL
		return p, rvOK
	}
	if !ipProto {
		if in.Proto == fib_types.FIB_API_PATH_NH_PROTO_ETHERNET {
			p.swIfIndex = in.SwIfIndex
		}
		return p, rvOK
	}
	ip6 := in.Proto == fib_types.FIB_API_PATH_NH_PROTO_IP6
	if nh := addrFromUnion(in.Nh.Address, ip6); !nh.IsUnspecified() {
		p.nh = nh
	}
	p.swIfIndex = in.SwIfIndex
	if p.swIfIndex == ^uint32(0) {
		if _, ok := s.tables[tableKey{in.TableID, ip6}]; !ok {
			return p, rvNoSuchFIB
		}
		p.tableID = in.TableID
	} else if s.ifaceAt(p.swIfIndex) == nil {
		return p, rvNoMatchingInterface
	}
	return p, rvOK
}

// pathToAPI encodes a stored path as VPP's fib_api_path_encode does.
func pathToAPI(p fibPath) fib_types.FibPath {
	out := fib_types.FibPath{
		SwIfIndex:  p.swIfIndex,
		TableID:    p.tableID,
		Weight:     p.weight,
		Preference: p.preference,
		Type:       p.typ,
		Flags:      p.flags,
		Proto:      p.proto,
	}
	if p.nh.Is4() {
		out.Nh.Address.SetIP4(p.nh.As4())
	} else if p.nh.Is6() {
		out.Nh.Address.SetIP6(p.nh.As16())
	}
	return out
}

// pathFromExported converts a Path given to AddRoute. family is the route's.
func (s *Sim) pathFromExported(in Path, ip6 bool) (fibPath, bool) {
	p := fibPath{proto: protoOf(ip6), swIfIndex: in.SwIfIndex, nh: in.NextHop, weight: 1}
	if in.NextHop.IsValid() {
		p.nh = in.NextHop.Unmap()
		p.proto = protoOf(p.nh.Is6())
	}
	found := false
	for t, name := range pathTypeNames {
		if name == in.Type {
			p.typ, found = t, true
		}
	}
	if in.Type == "attached" {
		p.typ, found = fib_types.FIB_API_PATH_TYPE_NORMAL, true
	}
	if !found {
		return p, false
	}
	switch p.typ {
	case fib_types.FIB_API_PATH_TYPE_NORMAL:
		if p.swIfIndex != ^uint32(0) && s.ifaceAt(p.swIfIndex) == nil {
			return p, false
		}
	case fib_types.FIB_API_PATH_TYPE_DROP, fib_types.FIB_API_PATH_TYPE_ICMP_UNREACH, fib_types.FIB_API_PATH_TYPE_ICMP_PROHIBIT:
		p.swIfIndex = ^uint32(0)
	}
	return p, true
}
