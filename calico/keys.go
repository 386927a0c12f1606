// Package calico models Calico's IPAM datastore as it is stored in etcd (v3 datastore): the keys of
// blocks, affinities, handles, the IPAM config and IP pools, their JSON values in every form Calico
// v3.23-v3.32 has written, the block invariants, and felix's rule for who owns a block; and what routing
// reads besides (Nodes, FelixConfigurations) with felix's encapsulation rules (encap.go). It is pure: no I/O.
package calico

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/vpp-route-agent/vpp-route-agent/internal/netaddr"
)

// Key prefixes of the Calico etcd v3 datastore. Every prefix ends in "/" so that a listing of one node or
// family never matches another ("node1" must not match "node10").
const (
	IPAMPrefix            = "/calico/ipam/v2/"
	BlockPrefix           = "/calico/ipam/v2/assignment/"
	HostAffinityPrefix    = "/calico/ipam/v2/host/"
	VirtualAffinityPrefix = "/calico/ipam/v2/virtual/"
	HandlePrefix          = "/calico/ipam/v2/handle/"
	IPAMConfigKey         = "/calico/ipam/v2/config"
	IPPoolPrefix          = "/calico/resources/v3/projectcalico.org/ippools/"
)

// KeyKind tells which Calico object a key names.
type KeyKind int

// The kinds of key ParseKey recognises.
const (
	KindUnknown KeyKind = iota
	KindBlock
	KindHostAffinity
	KindVirtualAffinity
	KindHandle
	KindIPAMConfig
	KindIPPool
	KindNode
	KindFelixConfiguration
)

func (k KeyKind) String() string {
	switch k {
	case KindBlock:
		return "block"
	case KindHostAffinity:
		return "host-affinity"
	case KindVirtualAffinity:
		return "virtual-affinity"
	case KindHandle:
		return "handle"
	case KindIPAMConfig:
		return "ipam-config"
	case KindIPPool:
		return "ippool"
	case KindNode:
		return "node"
	case KindFelixConfiguration:
		return "felixconfiguration"
	}
	return "unknown"
}

// Key is a parsed datastore key. Which fields are set depends on Kind: CIDR for blocks and affinities,
// Name for affinities (the node or virtual owner), handles (the handle ID), pools, Nodes and
// FelixConfigurations (the resource's name).
type Key struct {
	Kind KeyKind
	CIDR netip.Prefix
	Name string
}

// KeyError reports a key that is not a canonical Calico key of the expected kind.
type KeyError struct {
	Key    string
	Reason string
}

func (e *KeyError) Error() string { return fmt.Sprintf("calico key %q: %s", e.Key, e.Reason) }

func keyErr(key, format string, args ...any) error {
	return &KeyError{Key: key, Reason: fmt.Sprintf(format, args...)}
}

// EncodeCIDR returns the key form of a prefix: the masked prefix in Go's canonical text with "/" replaced
// by "-". IPv4-mapped IPv6 addresses are unmapped first.
func EncodeCIDR(p netip.Prefix) string {
	return strings.Replace(netaddr.Canonical(p).String(), "/", "-", 1)
}

// DecodeCIDR parses the key form of a prefix and insists that it is canonical, so that a key read from
// etcd formats back to exactly itself.
func DecodeCIDR(s string) (netip.Prefix, error) {
	i := strings.IndexByte(s, '-')
	if i < 0 {
		return netip.Prefix{}, fmt.Errorf("cidr %q: missing '-' between address and length", s)
	}
	p, err := netip.ParsePrefix(s[:i] + "/" + s[i+1:])
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("cidr %q: %w", s, err)
	}
	if p.Addr().Zone() != "" {
		return netip.Prefix{}, fmt.Errorf("cidr %q: zones are not allowed", s)
	}
	if EncodeCIDR(p) != s {
		return netip.Prefix{}, fmt.Errorf("cidr %q is not canonical (want %q)", s, EncodeCIDR(p))
	}
	return p, nil
}

// BlockKey returns the etcd key of the block with the given CIDR.
func BlockKey(cidr netip.Prefix) string {
	return BlockPrefix + netaddr.PrefixFamily(cidr).String() + "/block/" + EncodeCIDR(cidr)
}

// HostAffinityKey returns the etcd key of node's affinity to the block cidr.
func HostAffinityKey(node string, cidr netip.Prefix) string {
	return HostAffinityPrefix + node + "/" + netaddr.PrefixFamily(cidr).String() + "/block/" + EncodeCIDR(cidr)
}

// HostAffinityNodePrefix returns the prefix under which all of node's affinities are stored.
func HostAffinityNodePrefix(node string) string { return HostAffinityPrefix + node + "/" }

// VirtualAffinityKey returns the etcd key of a virtual owner's affinity to the block cidr (Calico v3.30+).
func VirtualAffinityKey(name string, cidr netip.Prefix) string {
	return VirtualAffinityPrefix + name + "/" + netaddr.PrefixFamily(cidr).String() + "/block/" + EncodeCIDR(cidr)
}

// HandleKey returns the etcd key of an IPAM handle.
func HandleKey(handleID string) string { return HandlePrefix + handleID }

// IPPoolKey returns the etcd key of the named IP pool.
func IPPoolKey(name string) string { return IPPoolPrefix + name }

// String formats the key; for a key returned by ParseKey it is the string that was parsed.
func (k Key) String() string {
	switch k.Kind {
	case KindBlock:
		return BlockKey(k.CIDR)
	case KindHostAffinity:
		return HostAffinityKey(k.Name, k.CIDR)
	case KindVirtualAffinity:
		return VirtualAffinityKey(k.Name, k.CIDR)
	case KindHandle:
		return HandleKey(k.Name)
	case KindIPAMConfig:
		return IPAMConfigKey
	case KindIPPool:
		return IPPoolKey(k.Name)
	case KindNode:
		return NodeKey(k.Name)
	case KindFelixConfiguration:
		return FelixConfigurationKey(k.Name)
	}
	return ""
}

// ParseKey parses any Calico IPAM, IP pool, Node or FelixConfiguration key. Foreign and non-canonical
// keys give a *KeyError naming the key; for every key it accepts, ParseKey(k).String() == k.
func ParseKey(s string) (Key, error) {
	switch {
	case s == IPAMConfigKey:
		return Key{Kind: KindIPAMConfig}, nil
	case strings.HasPrefix(s, BlockPrefix):
		return parseFamilyBlock(s, s[len(BlockPrefix):], KindBlock, "")
	case strings.HasPrefix(s, HostAffinityPrefix), strings.HasPrefix(s, VirtualAffinityPrefix):
		kind, rest := KindHostAffinity, strings.TrimPrefix(s, HostAffinityPrefix)
		if strings.HasPrefix(s, VirtualAffinityPrefix) {
			kind, rest = KindVirtualAffinity, s[len(VirtualAffinityPrefix):]
		}
		name, tail, ok := strings.Cut(rest, "/")
		if !ok || !validName(name) {
			return Key{}, keyErr(s, "bad owner name %q", name)
		}
		return parseFamilyBlock(s, tail, kind, name)
	case strings.HasPrefix(s, HandlePrefix):
		id := s[len(HandlePrefix):]
		if id == "" || strings.Contains(id, "/") {
			return Key{}, keyErr(s, "bad handle ID %q", id)
		}
		return Key{Kind: KindHandle, Name: id}, nil
	case strings.HasPrefix(s, IPPoolPrefix):
		name := s[len(IPPoolPrefix):]
		if !validName(name) {
			return Key{}, keyErr(s, "bad pool name %q", name)
		}
		return Key{Kind: KindIPPool, Name: name}, nil
	case strings.HasPrefix(s, NodePrefix), strings.HasPrefix(s, FelixConfigurationPrefix):
		kind, name := KindNode, strings.TrimPrefix(s, NodePrefix)
		if strings.HasPrefix(s, FelixConfigurationPrefix) {
			kind, name = KindFelixConfiguration, s[len(FelixConfigurationPrefix):]
		}
		if !validName(name) {
			return Key{}, keyErr(s, "bad %s name %q", kind, name)
		}
		return Key{Kind: kind, Name: name}, nil
	}
	return Key{}, keyErr(s, "not a Calico IPAM key")
}

// parseFamilyBlock parses "<ipv4|ipv6>/block/<cidr>" (the tail of block and affinity keys).
func parseFamilyBlock(full, rest string, kind KeyKind, name string) (Key, error) {
	fam, rest, ok := strings.Cut(rest, "/")
	if _, known := netaddr.ParseFamily(fam); !ok || !known {
		return Key{}, keyErr(full, "family must be ipv4 or ipv6")
	}
	enc, ok := strings.CutPrefix(rest, "block/")
	if !ok {
		return Key{}, keyErr(full, "expected .../%s/block/<cidr>", fam)
	}
	p, err := DecodeCIDR(enc)
	if err != nil {
		return Key{}, keyErr(full, "%v", err)
	}
	if got := netaddr.PrefixFamily(p).String(); got != fam {
		return Key{}, keyErr(full, "%s prefix under %s", got, fam)
	}
	return Key{Kind: kind, CIDR: p, Name: name}, nil
}

// validName accepts a node, virtual owner or pool name as one non-empty path segment.
func validName(s string) bool {
	return s != "" && !strings.ContainsAny(s, "/\x00") && s != "." && s != ".."
}
