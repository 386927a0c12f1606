package blockwatch

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/internal/netaddr"
)

// PeerKey returns the key under which node registers its first uplink's peer IP of family: <hostsPrefix><node>/peerip/<family>/1. The value is the bare address.
func PeerKey(hostsPrefix, node string, family netaddr.Family) string {
	return PeerKeyAt(hostsPrefix, node, family, 1)
}

// PeerKeyAt returns the key of node's peer IP of family for its index-th uplink (1-based, in the order
// of --uplink-interface): <hostsPrefix><node>/peerip/<family>/<index>.
func PeerKeyAt(hostsPrefix, node string, family netaddr.Family, index int) string {
	return hostsPrefix + node + "/peerip/" + family.String() + "/" + strconv.Itoa(index)
}

// MaxPeerIndex is the highest peer key index read (and the most uplinks an agent registers): a key with
// a higher index is malformed.
const MaxPeerIndex = 16

// decoder turns etcd keys and values under the watched prefixes into routing data. It is pure.
type decoder struct {
	blockPrefix, hostsPrefix, poolPrefix string
	nodePrefix, felixPrefix              string
	// felixNode is the name of this node's FelixConfiguration ("" without Config.NodeName).
	felixNode string
	// blockRoot replaces blockPrefix before calico.ParseKey when blockPrefix is a relocated copy of
	// calico.BlockPrefix; "" when keys are parsed as they are.
	blockRoot string
	legacy    bool
}

func newDecoder(c Config) decoder {
	d := decoder{blockPrefix: c.BlockPrefix, hostsPrefix: c.HostsPrefix, poolPrefix: c.PoolPrefix, legacy: c.LegacyHostAffinity,
		nodePrefix: c.NodePrefix, felixPrefix: c.FelixConfigurationPrefix}
	if c.NodeName != "" {
		d.felixNode = calico.FelixConfigurationNodeName(c.NodeName)
	}
	if !strings.HasPrefix(c.BlockPrefix, calico.BlockPrefix) {
		d.blockRoot = calico.BlockPrefix
	}
	return d
}

// blockCIDR returns the CIDR a block key names.
func (d decoder) blockCIDR(key string) (netip.Prefix, error) {
	rest, ok := strings.CutPrefix(key, d.blockPrefix)
	if !ok {
		return netip.Prefix{}, fmt.Errorf("key %q is not under %q", key, d.blockPrefix)
	}
	ck := key
	if d.blockRoot != "" {
		ck = d.blockRoot + rest
	}
	k, err := calico.ParseKey(ck)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("block key: %w", err)
	}
	if k.Kind != calico.KindBlock {
		return netip.Prefix{}, fmt.Errorf("block key %q names a %s", key, k.Kind)
	}
	return k.CIDR, nil
}

// block decodes the value of the block key for cidr into its routing data (only the fields routing
// reads: calico.DecodeRouting); nil (and no error) for a soft-deleted block. Its node names are
// substrings of the decoded value: the cache interns them (cache.intern) before keeping the block.
func (d decoder) block(cidr netip.Prefix, value []byte) (*Block, error) {
	r, err := calico.DecodeRouting(value)
	if err != nil {
		return nil, err
	}
	if r.CIDR != cidr {
		return nil, fmt.Errorf("value cidr %s differs from key cidr %s", r.CIDR, cidr)
	}
	if r.Deleted {
		return nil, nil
	}
	owner := r.Owner(d.legacy)
	return &Block{CIDR: cidr, Owner: owner, Borrowed: slices.Clip(r.Borrowed(owner))}, nil
}

// PeerBFDKeyAt returns the key by which a node advertises that it answers BFD on its index-th peer IP of
// family: <hostsPrefix><node>/peerip/<family>/<index>/bfd, whose value is that address (the agent's
// --bfd). A reader that predates it finds it malformed and skips it; a registration without it is a node
// without BFD.
func PeerBFDKeyAt(hostsPrefix, node string, family netaddr.Family, index int) string {
	return PeerKeyAt(hostsPrefix, node, family, index) + "/bfd"
}

// peerID names one registered peer address: a node, a family and an index (1-based); bfd marks the
// BFD advertisement of that address (PeerBFDKeyAt) rather than the address itself.
type peerID struct {
	node  string
	v6    bool
	index int
	bfd   bool
}

// peerKey parses a key under the hosts prefix.
func (d decoder) peerKey(key string) (peerID, error) {
	rest, ok := strings.CutPrefix(key, d.hostsPrefix)
	if !ok {
		return peerID{}, fmt.Errorf("key %q is not under %q", key, d.hostsPrefix)
	}
	node, tail, _ := strings.Cut(rest, "/")
	if node == "" || node == "." || node == ".." || strings.ContainsRune(node, 0) {
		return peerID{}, fmt.Errorf("peer key %q: bad node name %q", key, node)
	}
	fam, idx, _ := strings.Cut(strings.TrimPrefix(tail, "peerip/"), "/")
	family, known := netaddr.ParseFamily(fam)
	idx, sub, hasSub := strings.Cut(idx, "/")
	n, err := strconv.Atoi(idx)
	if strings.HasPrefix(tail, "peerip/") && known && err == nil &&
		n >= 1 && n <= MaxPeerIndex && idx == strconv.Itoa(n) && (!hasSub || sub == "bfd") {
		return peerID{node: node, v6: family == netaddr.V6, index: n, bfd: hasSub}, nil
	}
	return peerID{}, fmt.Errorf("peer key %q: want %s<node>/peerip/{ipv4,ipv6}/<1..%d>[/bfd]", key, d.hostsPrefix, MaxPeerIndex)
}

// peerAddr parses a peer value: a bare address of the key's family (surrounding white space allowed).
// Whether it can be a next hop (not loopback, multicast, ...) is judged by the agent, which also knows
// this node's own addresses: an address that cannot is refused there, like an absent registration,
// rather than kept here as the last good value.
func peerAddr(id peerID, value []byte) (netip.Addr, error) {
	a, err := netip.ParseAddr(strings.TrimSpace(string(value)))
	if err != nil {
		return netip.Addr{}, fmt.Errorf("peer address: %w", err)
	}
	if a.Zone() != "" {
		return netip.Addr{}, fmt.Errorf("peer address %s: zones are not allowed", a)
	}
	a = a.Unmap()
	if a.Is6() != id.v6 {
		return netip.Addr{}, fmt.Errorf("peer address %s does not match the key's family", a)
	}
	return a, nil
}

// poolName parses a key under the pool prefix.
func (d decoder) poolName(key string) (string, error) {
	return resourceName(key, d.poolPrefix, calico.KindIPPool)
}

// pool decodes a pool value; its metadata.name, when set, must match the key.
func pool(name string, value []byte) (calico.IPPool, error) {
	p, err := calico.DecodeIPPool(value)
	if err != nil {
		return calico.IPPool{}, err
	}
	if p.Name == "" {
		p.Name = name
	}
	if p.Name != name {
		return calico.IPPool{}, fmt.Errorf("metadata.name %q differs from the key's name %q", p.Name, name)
	}
	return p, nil
}

// poolEqual compares the fields of two pools (every field: TestPoolEqualComparesEveryField). An
// empty mode is Never, as calico.DecodeIPPool reads it.
func poolEqual(a, b calico.IPPool) bool {
	return a.Name == b.Name && a.CIDR == b.CIDR && a.BlockSize == b.BlockSize && a.Disabled == b.Disabled &&
		a.NodeSelector == b.NodeSelector && a.NamespaceSelector == b.NamespaceSelector &&
		slices.Equal(a.AllowedUses, b.AllowedUses) && a.AssignmentMode == b.AssignmentMode &&
		modeOf(a.IPIPMode) == modeOf(b.IPIPMode) && modeOf(a.VXLANMode) == modeOf(b.VXLANMode)
}

func modeOf(m calico.EncapMode) calico.EncapMode {
	if m == "" {
		return calico.EncapNever
	}
	return m
}

// resourceName parses a key under prefix whose last segment is a Calico resource's name (a pool, a
// Node, a FelixConfiguration), as calico.ParseKey accepts it under kind's prefix.
func resourceName(key, prefix string, kind calico.KeyKind) (string, error) {
	name, ok := strings.CutPrefix(key, prefix)
	if !ok {
		return "", fmt.Errorf("key %q is not under %q", key, prefix)
	}
	if k, err := calico.ParseKey(calico.Key{Kind: kind, Name: name}.String()); err != nil || k.Kind != kind {
		return "", fmt.Errorf("%s key %q: bad name %q", kind, key, name)
	}
	return name, nil
}

// node decodes a Node value into its routing data: the labels are dropped and the values quoted in
// problems clipped (a malformed spec can be long), so that the view keeps only what routing reads.
// Its metadata.name, when set, must match the key.
func node(name string, value []byte) (calico.Node, error) {
	n, err := calico.DecodeNode(value)
	if err != nil {
		return calico.Node{}, err
	}
	if n.Name != "" && n.Name != name {
		return calico.Node{}, fmt.Errorf("metadata.name %q differs from the key's name %q", n.Name, name)
	}
	n.Name, n.Labels = name, nil
	n.V4.Problems, n.V6.Problems = clipProblems(n.V4.Problems), clipProblems(n.V6.Problems)
	return n, nil
}

// nodeEqual compares the routing data of two nodes.
func nodeEqual(a, b calico.Node) bool {
	return a.Name == b.Name && familyEqual(a.V4, b.V4) && familyEqual(a.V6, b.V6)
}

func familyEqual(a, b calico.NodeFamily) bool {
	return a.Addr == b.Addr && a.Subnet == b.Subnet && a.FromBGP == b.FromBGP && a.IPIPTunnelAddr == b.IPIPTunnelAddr &&
		a.VXLANTunnelAddr == b.VXLANTunnelAddr && a.VXLANTunnelMAC == b.VXLANTunnelMAC && slices.Equal(a.Problems, b.Problems)
}

// felixSlot says which of the FelixConfigurations this node reads a name is (felixDefault,
// felixNode); false for every other one (other nodes' overrides, and names felix does not read).
func (d decoder) felixSlot(name string) (int, bool) {
	switch {
	case name == calico.FelixConfigurationDefault:
		return felixDefault, true
	case d.felixNode != "" && name == d.felixNode:
		return felixNode, true
	}
	return 0, false
}

// felixConfig decodes a FelixConfiguration value (problem values clipped); its metadata.name, when
// set, must match the key.
func felixConfig(name string, value []byte) (*calico.FelixConfiguration, error) {
	c, err := calico.DecodeFelixConfiguration(value)
	if err != nil {
		return nil, err
	}
	if c.Name != "" && c.Name != name {
		return nil, fmt.Errorf("metadata.name %q differs from the key's name %q", c.Name, name)
	}
	c.Name = name
	c.Problems = clipProblems(c.Problems)
	return &c, nil
}

// maxProblemValue bounds the value a kept FieldProblem quotes.
const maxProblemValue = 80

// clipProblems returns problems with each quoted value clipped to maxProblemValue bytes (a copy;
// nil for none).
func clipProblems(problems []calico.FieldProblem) []calico.FieldProblem {
	if len(problems) == 0 {
		return nil
	}
	out := slices.Clone(problems)
	for i := range out {
		if v := out[i].Value; len(v) > maxProblemValue {
			out[i].Value = strings.ToValidUTF8(v[:maxProblemValue], "") + "..."
		}
	}
	return out
}
