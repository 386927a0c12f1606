package blockwatch

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
)

// Ownership says where a Watcher learns which node owns each block (Config.Ownership).
//
// From the blocks (OwnershipBlocks, the default), felix's rule applies to every block value: the
// owner is the block's affinity field, and every allocation of another node is a borrowed address.
// Every write of a block (each pod ADD and DEL) reaches every Watcher.
//
// From the affinities (OwnershipAffinities), the Watcher reads the host affinity keys
// (calico.HostAffinityPrefix<node>/<family>/block/<cidr>) instead, which Calico writes only when a
// node claims or releases a block: a pod ADD reaches no Watcher. A block is owned by the node of its
// affinity in state confirmed, pendingDeletion (the block still names the node until it is deleted
// or its affinity cleared, which precede the affinity's deletion) or "" (Calico treats it as
// confirmed for older data); a pending affinity is a claim in progress or a lost race and owns
// nothing. When several nodes hold such an affinity to one block (Calico issue #6486) the earliest
// created wins, so that every Watcher decides alike. What the affinities cannot tell:
//   - borrowed addresses: none exist while the IPAM config has strict_affinity on, which this mode
//     requires; with it off, Snapshot.Problem and Status.Problem say so, and the Watcher goes on
//     reading affinities (it never falls back to reading every block on its own: a fleet doing that
//     at once is what this mode protects etcd from);
//   - blocks without an affinity (released from a node that still had addresses in them, e.g. when
//     a pool stops selecting the node): from the blocks, their addresses are routed one by one to
//     their nodes; from the affinities, they are unknown and not routed;
//   - affinities without a block (Calico issue #4471): routed to their node like a block, which is
//     harmless, as no address of the block is in use.
//
// OwnershipAuto reads the IPAM config (calico.IPAMConfigKey) and follows it: affinities while
// strict_affinity is on, blocks otherwise; when it changes, the Watcher relists from the other
// source after a random wait of up to Config.CompactedRelistSpread per hundred nodes (watching the
// old source meanwhile). An unreadable IPAM config keeps the source in force.
type Ownership string

// The ownership sources.
const (
	OwnershipBlocks     Ownership = "blocks"
	OwnershipAffinities Ownership = "affinities"
	OwnershipAuto       Ownership = "auto"
)

// ParseOwnership parses an ownership source; "" is OwnershipBlocks.
func ParseOwnership(s string) (Ownership, error) {
	switch o := Ownership(s); o {
	case "":
		return OwnershipBlocks, nil
	case OwnershipBlocks, OwnershipAffinities, OwnershipAuto:
		return o, nil
	}
	return "", fmt.Errorf("ownership %q is not blocks, affinities or auto", s)
}

// errOwnershipChanged ends a list whose IPAM config asks (in OwnershipAuto) for the other source
// than the one listed: it changed between the read that chose the source and the list.
var errOwnershipChanged = errors.New("the IPAM config changed the ownership source during the list")

// routesAffinity reports whether an affinity in state makes its node the block's owner.
func routesAffinity(state string) bool {
	return state == calico.AffinityConfirmed || state == calico.AffinityPendingDeletion || state == ""
}

// affinityKey parses a key under calico.HostAffinityPrefix.
func affinityKey(key string) (node string, cidr netip.Prefix, err error) {
	k, err := calico.ParseKey(key)
	if err != nil {
		return "", netip.Prefix{}, fmt.Errorf("affinity key: %w", err)
	}
	if k.Kind != calico.KindHostAffinity {
		return "", netip.Prefix{}, fmt.Errorf("affinity key %q names a %s", key, k.Kind)
	}
	return k.Name, k.CIDR, nil
}

// affinityState decodes an affinity value into its state; "deleted" for a soft-deleted one (which
// owns nothing, like a missing key).
func affinityState(value []byte) (string, error) {
	v, err := calico.DecodeAffinity(value)
	if err != nil {
		return "", err
	}
	if v.Deleted {
		return "deleted", nil
	}
	switch v.State {
	case calico.AffinityConfirmed, calico.AffinityPending, calico.AffinityPendingDeletion, "":
		return v.State, nil
	}
	return "", fmt.Errorf("affinity state %q is not confirmed, pending or pendingDeletion", v.State)
}

// affinityEntry is what the Watcher knows of one affinity key: the state of its last good value
// (if good), the mod revision of the last value applied and the key's create revision, and, while
// its current value cannot be read, why.
type affinityEntry struct {
	rev, created int64
	state        string
	good         bool
	unreadable   string
}

// ipamState is the IPAM config as the Watcher knows it. known is false only while the key holds a
// value that cannot be read and no good value of its current incarnation was seen; an absent key is
// known: Calico's defaults, strict affinity off.
type ipamState struct {
	rev, created int64
	strict       bool
	known        bool
}

// want returns the source the IPAM config asks for in OwnershipAuto; current when it is unknown.
func (s ipamState) want(current Ownership) Ownership {
	switch {
	case !s.known:
		return current
	case s.strict:
		return OwnershipAffinities
	}
	return OwnershipBlocks
}

// problem says why a view read from the affinities may lack routes; "" when it does not.
func (c *cache) problem() string {
	if c.ownership != OwnershipAffinities {
		return ""
	}
	if !c.ipam.known {
		return "ownership is read from the affinities, but the IPAM config (" + calico.IPAMConfigKey +
			") cannot be read: borrowed addresses, if any, are not routed"
	}
	if !c.ipam.strict {
		return "ownership is read from the affinities, but strict affinity is off in the IPAM config (" +
			calico.IPAMConfigKey + "): addresses borrowed from other nodes' blocks are not routed"
	}
	return ""
}

// installAffinity applies a decoded affinity key to the view c (prev as in install) and derives the
// owner of its block. It returns the nodes whose affinities claim the block when more than one does.
func (c *cache) installAffinity(prev *cache, d *decoded, ch *changes) []string {
	m := c.affinities[d.cidr]
	if e, ok := m[d.node]; ok && d.rev <= e.rev {
		return nil
	}
	switch {
	case d.del:
		delete(m, d.node)
	case d.valErr != nil:
		e := affinityEntry{rev: d.rev, created: d.created, unreadable: d.valErr.Error()}
		if old, ok := prev.affinities[d.cidr][d.node]; ok && old.good && d.created <= old.rev {
			e.created, e.state, e.good = old.created, old.state, true
		}
		m = c.setAffinity(d, e)
	default:
		m = c.setAffinity(d, affinityEntry{rev: d.rev, created: d.created, state: d.affinity, good: true})
	}
	if len(m) == 0 {
		delete(c.affinities, d.cidr)
	}
	return c.resolveAffinities(d.cidr, d.rev, ch)
}

func (c *cache) setAffinity(d *decoded, e affinityEntry) map[string]affinityEntry {
	m := c.affinities[d.cidr]
	if m == nil {
		m = map[string]affinityEntry{}
		c.affinities[d.cidr] = m
	}
	m[c.name(d.node)] = e
	return m
}

// resolveAffinities sets the block cidr from its affinities: owned by the earliest created one
// that routes (ties broken by node name), held while one of them cannot be read.
func (c *cache) resolveAffinities(cidr netip.Prefix, rev int64, ch *changes) []string {
	var owner string
	var ownerCreated int64
	var claims []string
	var held Held
	for node, e := range c.affinities[cidr] {
		if e.unreadable != "" && e.rev > held.Revision {
			held = Held{Reason: "affinity of node " + node + ": " + e.unreadable, Revision: e.rev, LastGood: e.good}
		}
		if !e.good || !routesAffinity(e.state) {
			continue
		}
		claims = append(claims, node)
		if owner == "" || cmp.Or(cmp.Compare(e.created, ownerCreated), strings.Compare(node, owner)) < 0 {
			owner, ownerCreated = node, e.created
		}
	}
	c.hold(cidr, held, ch)
	if owner == "" {
		c.deleteBlock(cidr, ch)
	} else {
		c.setBlock(cidr, &Block{CIDR: cidr, Owner: calico.Owner{Kind: calico.OwnerHost, Node: owner}}, rev, ch)
	}
	if len(claims) > 1 {
		slices.Sort(claims)
		return claims
	}
	return nil
}

// installIPAMConfig applies a decoded IPAM config key to the view c (prev as in install).
func (c *cache) installIPAMConfig(prev *cache, d *decoded) {
	if d.rev <= c.ipam.rev {
		return
	}
	switch {
	case d.del:
		c.ipam = ipamState{rev: d.rev, known: true}
	case d.valErr != nil:
		s := ipamState{rev: d.rev, created: d.created}
		if old := prev.ipam; old.known && old.created != 0 && d.created <= old.rev {
			s.strict, s.known, s.created = old.strict, true, old.created
		}
		c.ipam = s
	default:
		c.ipam = ipamState{rev: d.rev, created: d.created, strict: d.ipam.StrictAffinity, known: true}
	}
}

// initialOwnership reads the IPAM config to choose the source of the first list in OwnershipAuto:
// strict affinity on means the affinities. An unreadable value means the blocks (the list reports
// it).
func (w *Watcher) initialOwnership(ctx context.Context) (Ownership, error) {
	rctx, cancel := context.WithTimeout(ctx, w.cfg.RequestTimeout)
	defer cancel()
	resp, err := w.cfg.Client.Get(rctx, calico.IPAMConfigKey)
	if err != nil {
		return "", fmt.Errorf("read %s: %w", calico.IPAMConfigKey, err)
	}
	if len(resp.Kvs) == 0 {
		return OwnershipBlocks, nil
	}
	if cfg, err := calico.DecodeIPAMConfig(resp.Kvs[0].Value); err == nil && cfg.StrictAffinity {
		return OwnershipAffinities, nil
	}
	return OwnershipBlocks, nil
}

// prefixesFor returns the prefixes a Watcher lists and watches when ownership comes from source:
// the blocks or the affinities, the hosts, pools, Nodes and FelixConfigurations, and the IPAM config
// unless the configured ownership is the blocks.
func (w *Watcher) prefixesFor(source Ownership) [numSources]string {
	p := [numSources]string{srcHosts: w.cfg.HostsPrefix, srcPools: w.cfg.PoolPrefix, srcNodes: w.cfg.NodePrefix,
		srcFelixConfigs: w.cfg.FelixConfigurationPrefix}
	if source == OwnershipAffinities {
		p[srcAffinities] = calico.HostAffinityPrefix
	} else {
		p[srcBlocks] = w.cfg.BlockPrefix
	}
	if w.cfg.Ownership != OwnershipBlocks {
		p[srcIPAMConfig] = calico.IPAMConfigKey
	}
	return p
}

// keyRange returns the range a source's prefix covers: the one key for the IPAM config (the only
// source that is not a "/"-terminated prefix), else every key under the prefix.
func keyRange(src source, prefix string) (key, end string) {
	if src == srcIPAMConfig {
		return prefix, prefix + "\x00"
	}
	return prefix, clientv3.GetPrefixRangeEnd(prefix)
}
