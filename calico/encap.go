package calico

import (
	"fmt"
	"net/netip"
)

// EncapMode is the value of an IP pool's spec.ipipMode or spec.vxlanMode as written. Calico's validator
// accepts exactly Always, CrossSubnet and Never (api/pkg/apis/projectcalico/v3/ippool.go;
// libcalico-go/lib/validator/v3/validator.go ipipModeRegex, vxlanModeRegex); raw etcd data never passed
// it, so any other string can be stored and is kept as written (see IPPool.EncapProblems).
type EncapMode string

// The encapsulation modes Calico defines. DecodeIPPool reads an absent or empty mode as EncapNever.
const (
	EncapNever       EncapMode = "Never"
	EncapAlways      EncapMode = "Always"
	EncapCrossSubnet EncapMode = "CrossSubnet"
)

// Valid reports whether m is one of the three modes Calico defines.
func (m EncapMode) Valid() bool {
	return m == EncapNever || m == EncapAlways || m == EncapCrossSubnet
}

// on reports whether felix reads the mode as enabled. libcalico-go's IPPoolV3ToV1
// (lib/backend/k8s/resources/ippool.go) maps Always and CrossSubnet and turns every other string, an
// unknown one included, into the v1 "undefined" mode: felix treats an unknown mode as Never.
func (m EncapMode) on() bool { return m == EncapAlways || m == EncapCrossSubnet }

// Encap is the encapsulation of the route to a remote block.
type Encap uint8

// The encapsulations felix uses for workload routes (felix's proto.IPPoolType NO_ENCAP, IPIP, VXLAN).
const (
	EncapNone Encap = iota
	EncapIPIP
	EncapVXLAN
)

// String returns "none", "ipip" or "vxlan" (usable as a metric label value).
func (e Encap) String() string {
	switch e {
	case EncapIPIP:
		return "ipip"
	case EncapVXLAN:
		return "vxlan"
	}
	return "none"
}

// MarshalText writes the encapsulation as String does.
func (e Encap) MarshalText() ([]byte, error) { return []byte(e.String()), nil }

// UnmarshalText reads "none", "ipip" or "vxlan".
func (e *Encap) UnmarshalText(b []byte) error {
	switch string(b) {
	case "none":
		*e = EncapNone
	case "ipip":
		*e = EncapIPIP
	case "vxlan":
		*e = EncapVXLAN
	default:
		return fmt.Errorf("unknown encapsulation %q (want none, ipip or vxlan)", b)
	}
	return nil
}

// Overhead returns the bytes the encapsulation adds to each packet whose outer header is IPv6 (v6) or
// IPv4: felix's ipipMTUOverhead 20 and vxlanMTUOverhead 50 / vxlanV6MTUOverhead 70
// (felix/dataplane/linux/int_dataplane.go). felix never builds IPIP over IPv6 (IPIP is IPv4-only,
// see IPPool.Encap); for completeness that would be an IPv6 header, 40.
func (e Encap) Overhead(v6 bool) int {
	switch {
	case e == EncapIPIP && v6:
		return 40
	case e == EncapIPIP:
		return 20
	case e == EncapVXLAN && v6:
		return 70
	case e == EncapVXLAN:
		return 50
	}
	return 0
}

// PoolEncap is a pool's encapsulation as felix reads it: the type of its remote routes and whether
// routes to nodes in this node's subnet go unencapsulated.
type PoolEncap struct {
	Type        Encap
	CrossSubnet bool
}

// Encap returns the pool's encapsulation as felix decides it (felix/calc/l3_route_resolver.go):
// poolTypeForPool makes the pool VXLAN if vxlanMode is not Never, else IPIP if ipipMode is not Never,
// else none; getPoolInfo sets CrossSubnet when either mode is CrossSubnet (so a pool with vxlanMode
// Always and ipipMode CrossSubnet is cross-subnet VXLAN, as in felix). An unknown mode string reads as
// Never, as libcalico-go's v1 conversion reads it. One rule is this agent's: ipipMode on an IPv6 pool is
// ignored entirely, since IPIP is IPv4-only (felix's IPIP manager programs IPv4 only) and Calico's
// validator forbids it. The cases that depart from what Calico would accept are listed by EncapProblems;
// disabled does not change the result (felix does not read it).
func (p IPPool) Encap() PoolEncap {
	ipip := p.IPIPMode
	if p.CIDR.Addr().Is6() {
		ipip = EncapNever
	}
	e := PoolEncap{CrossSubnet: ipip == EncapCrossSubnet || p.VXLANMode == EncapCrossSubnet}
	switch {
	case p.VXLANMode.on():
		e.Type = EncapVXLAN
	case ipip.on():
		e.Type = EncapIPIP
	default:
		e.CrossSubnet = false // no encapsulation either way
	}
	return e
}

// EncapProblems lists what in the pool's modes Calico's validator would refuse: an unknown mode string
// (read as Never), both modes enabled (VXLAN wins), ipipMode enabled on an IPv6 pool (ignored). Encap
// still gives felix's reading; the problems tell the caller that the writer of the pool did not mean
// what it wrote, so a router keeps the routes the pool's blocks had rather than withdrawing or
// re-encapsulating them on such a value (and uses Encap only for blocks it has no route for yet).
func (p IPPool) EncapProblems() []FieldProblem {
	var out []FieldProblem
	bad := func(field string, m EncapMode, reason string) {
		out = append(out, FieldProblem{Kind: "IPPool", Name: p.Name, Field: field, Value: string(m), Reason: reason})
	}
	if !p.IPIPMode.Valid() {
		bad("spec.ipipMode", p.IPIPMode, "unknown mode (want Always, CrossSubnet or Never); read as Never")
	}
	if !p.VXLANMode.Valid() {
		bad("spec.vxlanMode", p.VXLANMode, "unknown mode (want Always, CrossSubnet or Never); read as Never")
	}
	switch {
	case p.IPIPMode.on() && p.CIDR.Addr().Is6():
		bad("spec.ipipMode", p.IPIPMode, "IPIP on an IPv6 pool; ignored")
	case p.IPIPMode.on() && p.VXLANMode.on():
		bad("spec.ipipMode", p.IPIPMode, fmt.Sprintf("both ipipMode and vxlanMode (%s) are set; VXLAN wins", p.VXLANMode))
	}
	return out
}

// SameSubnet is felix's nodeInOurSubnet (felix/calc/l3_route_resolver.go): whether the remote node's
// address lies in the local node's subnet. An unknown subnet or address (the zero value) is never the
// same subnet, so a cross-subnet pool encapsulates towards it. The local subnet is the prefix of the
// local node's address as recorded (a bare address is a /32 or /128: only itself is in it).
func SameSubnet(localSubnet netip.Prefix, remote netip.Addr) bool {
	if !localSubnet.IsValid() || !remote.IsValid() {
		return false
	}
	return localSubnet.Contains(remote.Unmap())
}

// Toward returns the encapsulation of a route from a node whose subnet is localSubnet to a block of
// the pool on the node with address remote: none for a cross-subnet pool when SameSubnet holds, else
// the pool's type.
func (e PoolEncap) Toward(localSubnet netip.Prefix, remote netip.Addr) Encap {
	if e.CrossSubnet && SameSubnet(localSubnet, remote) {
		return EncapNone
	}
	return e.Type
}

// A FieldProblem is one field of a Calico resource that cannot be used as written. The rest of the
// resource decoded; what to do about the field is the caller's decision.
type FieldProblem struct {
	// Kind is the resource kind: "IPPool", "Node" or "FelixConfiguration".
	Kind string
	// Name is the resource's name.
	Name string
	// Field is the JSON path of the field, e.g. "spec.ipipMode" or "spec.addresses[1].address".
	Field string
	// Value is the field's value as written (JSON text when it is not a string).
	Value  string
	Reason string
}

// Error names the resource, the field and its value (clipped: a whole malformed spec can be long).
func (p FieldProblem) Error() string {
	v := p.Value
	if len(v) > maxProblemValue {
		v = v[:maxProblemValue] + "..."
	}
	return fmt.Sprintf("%s %q: %s %q: %s", p.Kind, p.Name, p.Field, v, p.Reason)
}

const maxProblemValue = 80
