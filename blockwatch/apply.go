package blockwatch

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
)

// decoded is one key's new state, decoded without touching the view (so that a list can decode a
// page on several cores): which key it is, and its routing data or why it is malformed.
type decoded struct {
	src source
	key string
	rev int64
	// created is the key's create revision (0 for a delete): a key created after the revision of the
	// cached value is a new incarnation, and the cached value no longer stands for it.
	created int64
	// leased: the key is attached to a lease (a live registration; hand-written keys have none).
	leased bool
	del    bool
	// keyErr: the key itself is malformed (nothing else is set); valErr: the value is.
	keyErr, valErr error

	cidr  netip.Prefix // srcBlocks, srcAffinities
	block *Block       // nil: deleted or deleted:true
	peer  peerID       // srcHosts
	addr  netip.Addr   // invalid: deleted
	name  string       // srcPools
	pool  calico.IPPool
	// srcAffinities: the affinity's node and state (affinityState).
	node, affinity string
	ipam           calico.IPAMConfig // srcIPAMConfig
	calicoNode     calico.Node       // srcNodes (name: the node's)
	// srcFelixConfigs (name: the resource's): which one this node reads, and its value (nil:
	// deleted); ignored is set for every other FelixConfiguration, which is not read at all.
	felixSlot int
	felix     *calico.FelixConfiguration
	ignored   bool
}

// decode decodes one key and its value (or its delete, with del). It is pure.
func (w *Watcher) decode(src source, kv *mvccpb.KeyValue, del bool) decoded {
	key, value := string(kv.Key), kv.Value
	d := decoded{src: src, key: key, rev: kv.ModRevision, created: kv.CreateRevision, leased: kv.Lease != 0, del: del}
	switch src {
	case srcBlocks:
		if d.cidr, d.keyErr = w.dec.blockCIDR(key); d.keyErr == nil && !del {
			d.block, d.valErr = w.dec.block(d.cidr, value)
		}
	case srcHosts:
		if d.peer, d.keyErr = w.dec.peerKey(key); d.keyErr == nil && !del {
			d.addr, d.valErr = peerAddr(d.peer, value)
		}
	case srcPools:
		if d.name, d.keyErr = w.dec.poolName(key); d.keyErr == nil && !del {
			d.pool, d.valErr = pool(d.name, value)
		}
	case srcAffinities:
		if d.node, d.cidr, d.keyErr = affinityKey(key); d.keyErr == nil && !del {
			d.affinity, d.valErr = affinityState(value)
		}
	case srcIPAMConfig:
		if key != calico.IPAMConfigKey {
			d.keyErr = fmt.Errorf("key %q is not the IPAM config %q", key, calico.IPAMConfigKey)
		} else if !del {
			d.ipam, d.valErr = calico.DecodeIPAMConfig(value)
		}
	case srcNodes:
		if d.name, d.keyErr = resourceName(key, w.dec.nodePrefix, calico.KindNode); d.keyErr == nil && !del {
			d.calicoNode, d.valErr = node(d.name, value)
		}
	case srcFelixConfigs:
		d.name = strings.TrimPrefix(key, w.dec.felixPrefix)
		var ours bool
		if d.felixSlot, ours = w.dec.felixSlot(d.name); !ours {
			d.ignored = true // another node's override, or a name felix does not read
		} else if !del {
			d.felix, d.valErr = felixConfig(d.name, value)
		}
	}
	return d
}

// install applies a decoded key to the view c, unless c already holds a newer value of the key.
// prev is the view whose last good values survive malformed ones: c itself while watching, the
// previous view while relisting. A last good value survives only if the key has existed without
// interruption since (its create revision is not newer than the good value's), so that a malformed
// value never resurrects a key deleted while the watch was down. Changes are recorded in ch (nil
// while relisting: the relist diffs whole views instead).
func (w *Watcher) install(c, prev *cache, d *decoded, ch *changes) {
	if d.ignored {
		return
	}
	if d.keyErr != nil {
		w.malformed(d.src, d.key, d.rev, d.keyErr)
		return
	}
	if d.valErr != nil {
		w.malformed(d.src, d.key, d.rev, d.valErr)
	}
	switch d.src {
	case srcBlocks:
		if r, ok := c.blockRevs[d.cidr]; ok && d.rev <= r {
			return
		}
		if h, ok := c.held[d.cidr]; ok && d.rev <= h.Revision {
			return
		}
		b := d.block
		if d.valErr != nil {
			// Hold the block: keep the last good value, if there is one, and tell the consumer to
			// keep what it has for the CIDR either way.
			good, ok := prev.blocks.get(d.cidr)
			lastGood := ok && d.created <= prev.blockRevs[d.cidr]
			c.hold(d.cidr, Held{Reason: d.valErr.Error(), Revision: d.rev, LastGood: lastGood}, ch)
			if !lastGood {
				return
			}
			b = good
		} else {
			c.hold(d.cidr, Held{}, ch)
			if b != nil {
				c.intern(b)
			}
		}
		if b == nil {
			c.deleteBlock(d.cidr, ch)
			return
		}
		if b.Owner.Kind == calico.OwnerLegacyHost {
			if old, _ := prev.blocks.get(d.cidr); old == nil || old.Owner != b.Owner {
				w.log.Info("block owned through its legacy hostAffinity field (LegacyHostAffinity is on)",
					"block", d.cidr, "node", b.Owner.Node)
			}
		}
		c.setBlock(d.cidr, b, d.rev, ch)
	case srcHosts:
		if e, ok := c.peerKeys[d.peer]; ok && d.rev <= e.rev {
			return
		}
		e := peerEntry{rev: d.rev, created: d.created, leased: d.leased, addr: d.addr}
		if d.valErr != nil {
			good, ok := prev.peerKeys[d.peer]
			if !ok || d.created > good.rev {
				return
			}
			e.created, e.leased, e.addr = good.created, good.leased, good.addr
		}
		c.setPeer(d.peer, e, ch)
	case srcPools:
		if r, ok := c.poolRevs[d.name]; ok && d.rev <= r {
			return
		}
		p := d.pool
		if d.valErr != nil {
			var ok bool
			if p, ok = prev.pools[d.name]; !ok || d.created > prev.poolRevs[d.name] {
				return
			}
		} else if p.Name != "" {
			// A pool whose modes Calico would refuse is kept with them as written: the consumer
			// reads them as felix does (IPPool.Encap) and sees the problems (IPPool.EncapProblems).
			old := prev.pools[d.name]
			w.fieldProblems(old.EncapProblems(), p.EncapProblems())
		}
		c.setPool(d.name, p, d.rev, ch)
	case srcAffinities:
		if claims := c.installAffinity(prev, d, ch); claims != nil {
			owner, _ := c.blocks.get(d.cidr)
			w.log.Warn("several nodes hold an affinity to one block; routing it to the earliest created",
				"block", d.cidr, "nodes", claims, "owner", owner.Owner.Node)
		}
	case srcIPAMConfig:
		c.installIPAMConfig(prev, d)
	case srcNodes:
		if r, ok := c.nodeRevs[d.name]; ok && d.rev <= r {
			return
		}
		n := d.calicoNode
		if d.valErr != nil {
			var ok bool
			if n, ok = prev.nodes[d.name]; !ok || d.created > prev.nodeRevs[d.name] {
				return
			}
		} else if n.Name != "" {
			old := prev.nodes[d.name]
			w.fieldProblems(nodeProblems(old), nodeProblems(n))
		}
		name := c.name(d.name)
		if n.Name != "" {
			n.Name = name
		}
		c.setNode(name, n, d.rev, ch)
	case srcFelixConfigs:
		if e := c.felix[d.felixSlot]; e.cfg != nil && d.rev <= e.rev {
			return
		}
		cfg := d.felix
		if d.valErr != nil {
			old := prev.felix[d.felixSlot]
			if old.cfg == nil || d.created > old.rev {
				return
			}
			cfg = old.cfg
		} else if cfg != nil {
			var old []calico.FieldProblem
			if p := prev.felix[d.felixSlot].cfg; p != nil {
				old = p.Problems
			}
			w.fieldProblems(old, cfg.Problems)
		}
		c.setFelix(d.felixSlot, cfg, d.rev, ch)
	}
}

// nodeProblems returns the problems of both families of n, each once (a problem of the structure they
// share is listed in both).
func nodeProblems(n calico.Node) []calico.FieldProblem {
	out := slices.Clone(n.V4.Problems)
	for _, p := range n.V6.Problems {
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}

// fieldProblems logs and counts the problems in now that were not in before: each problem of a key
// is reported once, when it appears (again after it was fixed), not on every write or relist.
func (w *Watcher) fieldProblems(before, now []calico.FieldProblem) {
	for _, p := range now {
		if slices.Contains(before, p) {
			continue
		}
		w.metrics.fieldProblem(p.Kind, p.Field)
		w.log.Warn("Calico resource field cannot be used as written", "kind", p.Kind, "field", p.Field, "problem", p.Error())
	}
}
