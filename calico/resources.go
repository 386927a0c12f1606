package calico

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"net/netip"
	"slices"
	"strings"

	"github.com/vpp-route-agent/vpp-route-agent/internal/netaddr"
)

// Key prefixes of the Calico v3 resources an allocator reads besides IP pools.
const (
	// NodePrefix holds Calico Node resources (metadata.labels is what IP pool node selectors match).
	NodePrefix = "/calico/resources/v3/projectcalico.org/nodes/"
	// IPReservationPrefix holds IPReservation resources (spec.reservedCIDRs).
	IPReservationPrefix = "/calico/resources/v3/projectcalico.org/ipreservations/"
)

// NodeKey returns the etcd key of the Calico Node resource of node.
func NodeKey(node string) string { return NodePrefix + node }

// Node is what an allocator and a router need of a Calico v3 Node resource: its labels (what IP pool
// node selectors match) and, per address family, its address and tunnel endpoints (node.go).
type Node struct {
	Name   string
	Labels map[string]string
	// V4 and V6 are what routing reads of the node in each family; fields that did not parse are
	// listed in their Problems.
	V4, V6 NodeFamily
}

// DecodeNode decodes a v3 Node resource. Only a value that is not JSON, or whose metadata does not
// decode, is an error: a malformed spec field is recorded in the family it concerns (NodeFamily.Problems)
// and the rest of the resource still decodes, so that an allocator keeps the node's labels.
func DecodeNode(data []byte) (Node, error) {
	var j struct {
		Metadata struct {
			Name   string            `json:"name"`
			Labels map[string]string `json:"labels"`
		} `json:"metadata"`
		Spec json.RawMessage `json:"spec"`
	}
	if err := json.Unmarshal(data, &j); err != nil {
		return Node{}, fmt.Errorf("decode node: %w", err)
	}
	n := Node{Name: j.Metadata.Name, Labels: j.Metadata.Labels}
	n.decodeSpec(j.Spec)
	return n, nil
}

// IPReservationKey returns the etcd key of the named IPReservation.
func IPReservationKey(name string) string { return IPReservationPrefix + name }

// DecodeIPReservation decodes a v3 IPReservation resource and returns its reserved ranges (a single
// address is a /32 or /128, as Calico's ParseCIDROrIP reads it). Entries that do not parse are left out
// and named in the error, which is returned together with the good ones.
func DecodeIPReservation(data []byte) (Reservations, error) {
	var j struct {
		Spec struct {
			ReservedCIDRs []string `json:"reservedCIDRs"`
		} `json:"spec"`
	}
	if err := json.Unmarshal(data, &j); err != nil {
		return nil, fmt.Errorf("decode ipreservation: %w", err)
	}
	var out Reservations
	var errs []error
	for _, s := range j.Spec.ReservedCIDRs {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		p, err := ParsePrefixOrAddr(s)
		if err != nil {
			errs = append(errs, fmt.Errorf("reservedCIDRs entry %q: %w", s, err))
			continue
		}
		out = append(out, p)
	}
	return out, errors.Join(errs...)
}

// ParsePrefixOrAddr parses a CIDR (masked, unmapped) or a single address (a /32 or /128).
func ParsePrefixOrAddr(s string) (netip.Prefix, error) {
	_, p, err := ParseCIDROrIP(s)
	return p, err
}

// ParseCIDROrIP is libcalico-go's net.ParseCIDROrIP: it parses "address/length" or a bare address and
// returns the address as written and its subnet, masked (a bare address is a /32 or /128). Addresses
// are unmapped (an IPv4-mapped IPv6 address is IPv4, as Calico's To4 makes it); zones are refused;
// surrounding white space is ignored.
func ParseCIDROrIP(s string) (netip.Addr, netip.Prefix, error) {
	s = strings.TrimSpace(s)
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Addr{}, netip.Prefix{}, err
		}
		if p.Addr().Zone() != "" {
			return netip.Addr{}, netip.Prefix{}, fmt.Errorf("%q: zones are not allowed", s)
		}
		return p.Addr().Unmap(), netaddr.Canonical(p), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, netip.Prefix{}, err
	}
	if a.Zone() != "" {
		return netip.Addr{}, netip.Prefix{}, fmt.Errorf("%q: zones are not allowed", s)
	}
	return a.Unmap(), HostPrefix(a), nil
}

// Reservations are address ranges automatic assignment never hands out and block claims pass over
// when they cover a whole block (Calico's IPReservations; libcalico-go lib/ipam/addr_filter.go).
type Reservations []netip.Prefix

// Contains reports whether the address is reserved.
func (r Reservations) Contains(a netip.Addr) bool {
	a = a.Unmap()
	for _, p := range r {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// CoversWhole reports whether every address of p is reserved, by one range or by several together
// (Calico's cidrSliceFilter.MatchesWholeCIDR).
func (r Reservations) CoversWhole(p netip.Prefix) bool {
	p = netaddr.Canonical(p)
	var inside []netip.Prefix
	for _, q := range r {
		if q.Addr().Is4() != p.Addr().Is4() || !q.Overlaps(p) {
			continue
		}
		if netaddr.Covers(q, p) {
			return true
		}
		inside = append(inside, q)
	}
	if len(inside) == 0 {
		return false
	}
	// Count the addresses of the ranges inside p, each once (a range inside another adds nothing).
	slices.SortFunc(inside, func(a, b netip.Prefix) int { return a.Bits() - b.Bits() })
	total := new(big.Int)
	for i, q := range inside {
		if slices.ContainsFunc(inside[:i], func(o netip.Prefix) bool { return o.Contains(q.Addr()) }) {
			continue
		}
		total.Add(total, new(big.Int).Lsh(big.NewInt(1), uint(q.Addr().BitLen()-q.Bits())))
	}
	return total.Cmp(new(big.Int).Lsh(big.NewInt(1), uint(p.Addr().BitLen()-p.Bits()))) == 0
}
