package calico

import (
	"crypto/sha1"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/vpp-route-agent/vpp-route-agent/internal/netaddr"
)

// NodeFamily is what routing reads of a Calico Node resource in one address family (libcalico-go
// lib/apis/v3/node.go NodeSpec, read as felix's calc/l3_route_resolver.go and calc/vxlan_resolver.go
// read it).
type NodeFamily struct {
	// Addr is the node's address and Subnet its subnet, masked: from spec.bgp.ipv4Address
	// (ipv6Address) when spec.bgp has an address of either family, else from spec.addresses, the first
	// InternalIP of the family, else the first ExternalIP (felix's OnResourceUpdate and
	// resources.FindNodeAddress). "192.0.2.11/24" gives 192.0.2.11 in 192.0.2.0/24; a bare address gives a
	// /32 (/128), so that no other node is in its subnet. Both are zero when the node has none.
	Addr   netip.Addr
	Subnet netip.Prefix
	// FromBGP reports that Addr came from spec.bgp: felix builds a VXLAN tunnel endpoint only from that
	// address (vxlan_resolver.go OnResourceUpdate), never from spec.addresses.
	FromBGP bool
	// IPIPTunnelAddr is spec.bgp.ipv4IPIPTunnelAddr (IPv4 only). felix routes IPIP via the node's
	// address, not this one; it is informational.
	IPIPTunnelAddr netip.Addr
	// VXLANTunnelAddr is spec.ipv4VXLANTunnelAddr (spec.ipv6VXLANTunnelAddr): the next hop of VXLAN
	// routes to the node.
	VXLANTunnelAddr netip.Addr
	// VXLANTunnelMAC is spec.vxlanTunnelMACAddr (spec.vxlanTunnelMACAddrV6); zero when unset, in which
	// case the node's VTEP uses GeneratedVTEPMAC (see Node.VTEP).
	VXLANTunnelMAC MAC
	// Problems lists the fields of this family (and the shared ones it depends on) that did not parse.
	// The field's value above is then zero; a router keeps the routes it had towards the node rather
	// than reading the zero value as "absent".
	Problems []FieldProblem
}

// JSON paths of the Node fields routing reads, as they appear in FieldProblem.Field.
const (
	fieldSpec       = "spec"
	fieldBGP        = "spec.bgp"
	fieldIPv4Addr   = "spec.bgp.ipv4Address"
	fieldIPv6Addr   = "spec.bgp.ipv6Address"
	fieldIPIPAddr   = "spec.bgp.ipv4IPIPTunnelAddr"
	fieldVXLANAddr  = "spec.ipv4VXLANTunnelAddr"
	fieldVXLANAddr6 = "spec.ipv6VXLANTunnelAddr"
	fieldVXLANMAC   = "spec.vxlanTunnelMACAddr"
	fieldVXLANMAC6  = "spec.vxlanTunnelMACAddrV6"
	fieldAddresses  = "spec.addresses"
)

// Node address types felix's fallback reads, in its order of preference.
const (
	NodeInternalIP = "InternalIP"
	NodeExternalIP = "ExternalIP"
)

// Family returns the node's routing data of one family.
func (n Node) Family(v6 bool) NodeFamily {
	if v6 {
		return n.V6
	}
	return n.V4
}

// AddrProblem returns the first problem with the field the family's address comes from (or the
// structure around it), nil when the address is as recorded, or absent. Where it is not nil the
// node's address is unknown for a reason other than absence: a cross-subnet decision towards or from
// the node keeps what it was.
func (f NodeFamily) AddrProblem() error {
	return f.problem(func(field string) bool {
		return field == fieldSpec || field == fieldBGP || field == fieldIPv4Addr || field == fieldIPv6Addr ||
			strings.HasPrefix(field, fieldAddresses)
	})
}

// ErrNoVTEP reports a node without a VXLAN tunnel endpoint in a family: it lacks a VXLAN tunnel
// address or a spec.bgp address. felix programs no VXLAN route to such a node ("missing local
// information").
var ErrNoVTEP = errors.New("node has no VXLAN tunnel endpoint")

// VTEP is a node's VXLAN tunnel endpoint in one family (felix's proto.VXLANTunnelEndpointUpdate).
type VTEP struct {
	// Addr is the node's VXLAN tunnel address: the next hop of VXLAN routes to its blocks.
	Addr netip.Addr
	// MAC is the node's VTEP MAC: the inner destination MAC of frames to it.
	MAC MAC
	// NodeIP is the node's address: the outer destination of VXLAN packets to it (felix's
	// ParentDeviceIp).
	NodeIP netip.Addr
}

// VTEP returns the node's VXLAN tunnel endpoint in a family, as felix's VXLANResolver builds it
// (sendVTEPUpdateOrRemove): the VXLAN tunnel address, the spec.bgp address and the MAC, recorded or
// generated (vtepMACForHost). It returns ErrNoVTEP (wrapped) when the tunnel address or the spec.bgp
// address is absent, and the *FieldProblem when one of the fields it needs is malformed, so that the
// caller can tell "felix would route nothing" from "keep what you had".
func (n Node) VTEP(v6 bool) (VTEP, error) {
	f := n.Family(v6)
	addrField, macField := fieldVXLANAddr, fieldVXLANMAC
	if v6 {
		addrField, macField = fieldVXLANAddr6, fieldVXLANMAC6
	}
	if err := f.problem(func(field string) bool {
		return field == addrField || field == macField || field == fieldSpec || field == fieldBGP ||
			field == fieldIPv4Addr || field == fieldIPv6Addr
	}); err != nil {
		return VTEP{}, err
	}
	if !f.VXLANTunnelAddr.IsValid() || !f.Addr.IsValid() || !f.FromBGP {
		return VTEP{}, fmt.Errorf("node %q (%s): %w", n.Name, netaddr.FamilyFor(v6).String(), ErrNoVTEP)
	}
	mac := f.VXLANTunnelMAC
	if mac == (MAC{}) {
		mac = GeneratedVTEPMAC(n.Name, v6)
	}
	return VTEP{Addr: f.VXLANTunnelAddr, MAC: mac, NodeIP: f.Addr}, nil
}

func (f NodeFamily) problem(match func(field string) bool) error {
	for i := range f.Problems {
		if match(f.Problems[i].Field) {
			return &f.Problems[i]
		}
	}
	return nil
}

// MAC is an Ethernet (EUI-48) address.
type MAC [6]byte

// String formats the MAC as net.HardwareAddr does: lower-case hex bytes separated by colons.
func (m MAC) String() string { return net.HardwareAddr(m[:]).String() }

// ParseVTEPMAC parses a VTEP MAC in any form net.ParseMAC reads ("00:11:22:33:44:55",
// "00-11-22-33-44-55", "0011.2233.4455") and insists on a unicast EUI-48 address other than zero, the
// only kind that can be a tunnel endpoint's address.
func ParseVTEPMAC(s string) (MAC, error) {
	hw, err := net.ParseMAC(strings.TrimSpace(s))
	if err != nil {
		return MAC{}, err
	}
	if len(hw) != 6 {
		return MAC{}, fmt.Errorf("%q is not a 6-byte MAC", s)
	}
	m := MAC(hw)
	if m == (MAC{}) || m[0]&1 != 0 {
		return MAC{}, fmt.Errorf("%q is not a unicast MAC", s)
	}
	return m, nil
}

// GeneratedVTEPMAC returns the VTEP MAC felix uses for a node that records none: the byte 0x66 ("f")
// followed by the first five bytes of SHA-1 of the node name, with "-v6" appended to the name for IPv6
// (projectcalico/calico felix/calc/vxlan_resolver.go vtepMACForHost; the node's own vxlan.calico device
// gets the same address). 0x66 has the locally-administered bit set and the multicast bit clear.
func GeneratedVTEPMAC(node string, v6 bool) MAC {
	if v6 {
		node += "-v6"
	}
	sum := sha1.Sum([]byte(node))
	return MAC{'f', sum[0], sum[1], sum[2], sum[3], sum[4]}
}

// decodeSpec reads the routing fields of a Node's spec into n.V4 and n.V6. Every field that does not
// parse is recorded as a problem in the family it concerns (both for shared structure) and left zero.
func (n *Node) decodeSpec(raw json.RawMessage) {
	both := func(field, value, reason string) {
		p := FieldProblem{Kind: "Node", Name: n.Name, Field: field, Value: value, Reason: reason}
		n.V4.Problems = append(n.V4.Problems, p)
		n.V6.Problems = append(n.V6.Problems, p)
	}
	spec, ok := object(raw)
	if !ok {
		both(fieldSpec, string(raw), "not a JSON object")
		return
	}
	bgp, ok := object(spec["bgp"])
	if !ok {
		both(fieldBGP, string(spec["bgp"]), "not a JSON object")
	}

	// The node's address: spec.bgp when it has an address of either family, else spec.addresses.
	v4, set4 := n.str(&n.V4, bgp, "ipv4Address", fieldIPv4Addr)
	v6, set6 := n.str(&n.V6, bgp, "ipv6Address", fieldIPv6Addr)
	if set4 || set6 {
		n.V4.setBGPAddr(n.Name, fieldIPv4Addr, v4, false)
		n.V6.setBGPAddr(n.Name, fieldIPv6Addr, v6, true)
	} else {
		n.fallbackAddrs(spec["addresses"], both)
	}

	if s, _ := n.str(&n.V4, bgp, "ipv4IPIPTunnelAddr", fieldIPIPAddr); s != "" {
		n.V4.IPIPTunnelAddr = n.V4.addr(n.Name, fieldIPIPAddr, s, false)
	}
	if s, _ := n.str(&n.V4, spec, "ipv4VXLANTunnelAddr", fieldVXLANAddr); s != "" {
		n.V4.VXLANTunnelAddr = n.V4.addr(n.Name, fieldVXLANAddr, s, false)
	}
	if s, _ := n.str(&n.V6, spec, "ipv6VXLANTunnelAddr", fieldVXLANAddr6); s != "" {
		n.V6.VXLANTunnelAddr = n.V6.addr(n.Name, fieldVXLANAddr6, s, true)
	}
	if s, _ := n.str(&n.V4, spec, "vxlanTunnelMACAddr", fieldVXLANMAC); s != "" {
		n.V4.VXLANTunnelMAC = n.V4.mac(n.Name, fieldVXLANMAC, s)
	}
	if s, _ := n.str(&n.V6, spec, "vxlanTunnelMACAddrV6", fieldVXLANMAC6); s != "" {
		n.V6.VXLANTunnelMAC = n.V6.mac(n.Name, fieldVXLANMAC6, s)
	}
}

// object decodes a JSON object into its fields; absent and null are an empty object.
func object(raw json.RawMessage) (map[string]json.RawMessage, bool) {
	var m map[string]json.RawMessage
	if len(raw) == 0 || string(raw) == "null" {
		return m, true
	}
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, false
	}
	return m, true
}

// str returns the string field key of obj. set reports a field that is present and not empty (or
// null); a field that is not a string is a problem of f, and set.
func (n *Node) str(f *NodeFamily, obj map[string]json.RawMessage, key, field string) (s string, set bool) {
	raw, ok := obj[key]
	if !ok || string(raw) == "null" {
		return "", false
	}
	if err := json.Unmarshal(raw, &s); err != nil {
		f.bad(n.Name, field, string(raw), "not a JSON string")
		return "", true
	}
	return s, s != ""
}

func (f *NodeFamily) bad(node, field, value, reason string) {
	f.Problems = append(f.Problems, FieldProblem{Kind: "Node", Name: node, Field: field, Value: value, Reason: reason})
}

// setBGPAddr parses a spec.bgp address (a CIDR; Calico's validator says cidrv4/cidrv6, felix's
// ParseCIDROrIP also takes a bare address).
func (f *NodeFamily) setBGPAddr(node, field, s string, v6 bool) {
	if s == "" {
		return
	}
	a, p, err := ParseCIDROrIP(s)
	switch {
	case err != nil:
		f.bad(node, field, s, err.Error())
	case a.Is6() != v6:
		f.bad(node, field, s, "not an "+netaddr.FamilyFor(v6).String()+" address")
	default:
		f.Addr, f.Subnet, f.FromBGP = a, p, true
	}
}

// addr parses a bare address of the family (a tunnel address).
func (f *NodeFamily) addr(node, field, s string, v6 bool) netip.Addr {
	a, err := netip.ParseAddr(strings.TrimSpace(s))
	switch {
	case err != nil:
		f.bad(node, field, s, err.Error())
	case a.Zone() != "":
		f.bad(node, field, s, "zones are not allowed")
	case a.Unmap().Is6() != v6:
		f.bad(node, field, s, "not an "+netaddr.FamilyFor(v6).String()+" address")
	default:
		return a.Unmap()
	}
	return netip.Addr{}
}

func (f *NodeFamily) mac(node, field, s string) MAC {
	m, err := ParseVTEPMAC(s)
	if err != nil {
		f.bad(node, field, s, err.Error())
	}
	return m
}

// fallbackAddrs fills the families' addresses from spec.addresses as felix does when spec.bgp has no
// address: per family the first InternalIP of that family, else the first ExternalIP
// (libcalico-go lib/resources FindNodeAddress). felix skips an entry that does not parse; here it is
// also a problem of both families (its family is unknown), so that a router holds rather than
// guesses.
func (n *Node) fallbackAddrs(raw json.RawMessage, both func(field, value, reason string)) {
	if len(raw) == 0 || string(raw) == "null" {
		return
	}
	var entries []json.RawMessage
	if err := json.Unmarshal(raw, &entries); err != nil {
		both(fieldAddresses, string(raw), "not a JSON array")
		return
	}
	type parsed struct {
		typ    string
		addr   netip.Addr
		subnet netip.Prefix
	}
	var good []parsed
	for i, e := range entries {
		var j struct {
			Address string `json:"address"`
			Type    string `json:"type"`
		}
		if err := json.Unmarshal(e, &j); err != nil {
			both(fmt.Sprintf("%s[%d]", fieldAddresses, i), string(e), "not an address entry")
			continue
		}
		if j.Type != NodeInternalIP && j.Type != NodeExternalIP {
			continue // CalicoNodeIP and others play no part in felix's fallback
		}
		a, p, err := ParseCIDROrIP(j.Address)
		if err != nil {
			both(fmt.Sprintf("%s[%d].address", fieldAddresses, i), j.Address, err.Error())
			continue
		}
		good = append(good, parsed{j.Type, a, p})
	}
	for _, f := range []*NodeFamily{&n.V4, &n.V6} {
		v6 := f == &n.V6
		for _, typ := range []string{NodeInternalIP, NodeExternalIP} {
			i := slices.IndexFunc(good, func(p parsed) bool { return p.typ == typ && p.addr.Is6() == v6 })
			if i >= 0 {
				f.Addr, f.Subnet = good[i].addr, good[i].subnet
				break
			}
		}
	}
}
