package ipamd

import (
	"context"
	"fmt"
	"net/netip"
	"slices"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
)

// del releases the addresses of (container, ifname) by handle, never by prevResult (libcni sends none
// when its cache is gone) and without the netns. Released ordinals go to the tail of their block's
// FIFO; the handle is decremented, corrected to what the blocks really hold, or deleted; all in one
// transaction. Nothing to release is success, and an emptied block keeps its affinity.
func (c *call) del(ctx context.Context, containerID, ifname string) error {
	handle := handleID(c.conf.Network, containerID)
	return c.retry(ctx, "DEL "+handle, func(ctx context.Context) error {
		return c.delAttempt(ctx, handle, ifname)
	})
}

func (c *call) delAttempt(ctx context.Context, handle, ifname string) error {
	match := func(a *calico.AllocationAttribute) bool { return ifnameOf(a) == ifname }
	var h *calico.Handle
	changed := false
	v, err := c.decide(ctx, handle, func(v *view) error {
		var err error
		h, changed, err = v.del(handle, match)
		return err
	})
	if err != nil || !changed {
		return err
	}
	emptied := v.emptied()
	if _, err := c.write(ctx, v, h); err != nil {
		return err
	}
	c.releaseUnselectedEmptied(ctx, v, emptied)
	return nil
}

// del decides a DEL on the view: the handle as it is left (nil: deleted) and whether anything changes.
// Until the handle is read, its value is derived from the node's blocks and the write is conditional
// on exactly that value (steady state: one round trip, no read); if the handle holds anything else,
// the write's failure branch reads it.
func (v *view) del(handle string, match func(*calico.AllocationAttribute) bool) (*calico.Handle, bool, error) {
	if !v.read.handle {
		guess := calico.NewHandle()
		for cidr, e := range v.blocks {
			if e == nil {
				continue
			}
			if n := len(e.b.Ordinals(func(a *calico.AllocationAttribute) bool { return a.HeldBy(handle) })); n > 0 {
				guess.Add(cidr, n)
			}
		}
		if len(guess.Block) == 0 {
			return nil, false, &needs{handle: true}
		}
		data, err := calico.EncodeHandle(guess)
		if err != nil {
			return nil, false, err
		}
		v.handle, v.handleValue = guess, data
	}
	if v.handle == nil {
		v.log.Debug("no handle: nothing to release", "handle", handle)
		return nil, false, nil
	}
	if err := v.require(handleBlocks(v.handle)...); err != nil {
		return nil, false, err
	}
	h, changed, err := v.releaseHandle(handle, match)
	if err == nil && !changed && !v.read.handle {
		// Nothing of this interface in the node's blocks: only the handle can say where it is.
		return nil, false, &needs{handle: true}
	}
	return h, changed, err
}

// emptied returns the blocks this attempt changed that are now empty and owned by a node.
func (v *view) emptied() []netip.Prefix {
	var out []netip.Prefix
	for _, cidr := range v.dirtyCIDRs() {
		if b := v.blocks[cidr].b; b.Empty() && calico.OwnerOf(b, false).Kind == calico.OwnerHost {
			out = append(out, cidr)
		}
	}
	return out
}

// releaseUnselectedEmptied does after a release what Calico's ensureConsistentAffinity does (ipam.go):
// a block the release left empty, whose pool no longer selects the block's owner node, is deleted with
// that node's affinity (calico.ReleaseWhenUnselected), in one transaction conditional on both being as
// read. It costs a read only when a release emptied a block of another node, or one of this node's
// whose pool no longer selects it. Best effort: a failure is logged, and the
// owner's next ADD does the same.
func (c *call) releaseUnselectedEmptied(ctx context.Context, v *view, cidrs []netip.Prefix) {
	cidrs = slices.DeleteFunc(slices.Clone(cidrs), func(cidr netip.Prefix) bool {
		e := v.blocks[cidr]
		if e == nil {
			return true
		}
		// This node's blocks are decided on the state, with no read: a release happens only when
		// the state says the pool no longer selects the node (and is confirmed by the read below).
		if o := calico.OwnerOf(e.b, false).Node; o == c.conf.Node {
			p := v.poolOf(cidr)
			return p == nil || p.Disabled || !calico.ReleaseWhenUnselected(*p, v.node, e.b, o)
		}
		return false
	})
	var owners []string
	for _, cidr := range cidrs {
		if o := calico.OwnerOf(v.blocks[cidr].b, false).Node; !slices.Contains(owners, o) {
			owners = append(owners, o)
		}
	}
	if len(owners) == 0 {
		return
	}
	ops := []op{prefixOp(calico.IPPoolPrefix, false)}
	for _, o := range owners {
		ops = append(ops, getOp(calico.NodeKey(o)))
	}
	for _, cidr := range cidrs {
		ops = append(ops, getOp(calico.HostAffinityKey(calico.OwnerOf(v.blocks[cidr].b, false).Node, cidr)))
	}
	res, err := c.txn(ctx, nil, ops, nil)
	if err != nil || len(res.Ranges) != len(ops) {
		c.log.Warn("cannot check whether emptied blocks' pools still select their nodes", "err", err)
		return
	}
	var pools []calico.IPPool
	for _, kv := range res.Ranges[0] {
		if p, err := calico.DecodeIPPool(kv.Value); err == nil && !p.Disabled {
			pools = append(pools, p)
		}
	}
	nodes := map[string]*calico.Node{}
	for i, o := range owners {
		if kvs := res.Ranges[1+i]; len(kvs) == 1 {
			if n, err := calico.DecodeNode(kvs[0].Value); err == nil {
				nodes[o] = &n
			}
		}
	}
	for i, cidr := range cidrs {
		e, affKVs := v.blocks[cidr], res.Ranges[1+len(owners)+i]
		owner := calico.OwnerOf(e.b, false).Node
		var pool *calico.IPPool
		for j := range pools {
			if inPools(cidr, pools[j:j+1]) {
				pool = &pools[j]
				break
			}
		}
		if pool == nil || len(affKVs) != 1 || !calico.ReleaseWhenUnselected(*pool, nodes[owner], e.b, owner) {
			continue
		}
		bkey, akey := calico.BlockKey(cidr), calico.HostAffinityKey(owner, cidr)
		tr, err := c.txn(ctx, []compare{modRevisionIs(bkey, e.rev), modRevisionIs(akey, affKVs[0].ModRevision)},
			[]op{deleteOp(bkey), deleteOp(akey)}, nil)
		if err != nil || !tr.Succeeded {
			c.log.Warn("could not release an emptied block whose pool no longer selects its node", "block", cidr, "node", owner, "err", err)
			continue
		}
		c.log.Info("released an emptied block whose pool no longer selects its node", "block", cidr, "node", owner, "pool", pool.Name)
		c.state.committed(&plan{blocks: map[netip.Prefix]*blockEntry{cidr: nil}, affinity: map[string][]byte{akey: nil}}, tr.Revision)
	}
}

// releaseHandle releases, in the loaded blocks the handle lists, every allocation of the handle that
// match accepts, and returns the handle corrected to the allocations that remain, and whether
// anything changed.
func (v *view) releaseHandle(handle string, match func(*calico.AllocationAttribute) bool) (*calico.Handle, bool, error) {
	h := calico.NewHandle()
	changed := false
	for k, n := range v.handle.Block {
		p, err := netip.ParsePrefix(k)
		if err != nil {
			v.log.Warn("dropping unparseable block from handle", "handle", handle, "block", k)
			changed = true
			continue
		}
		cidr := calico.Canonical(p)
		if err := v.bad[cidr]; err != nil {
			return nil, false, fmt.Errorf("release %s from %s: %w", handle, cidr, err)
		}
		e := v.blocks[cidr]
		if e == nil {
			// The block is gone: the handle cannot hold anything in it.
			changed = true
			continue
		}
		mine := func(a *calico.AllocationAttribute) bool { return a.HeldBy(handle) }
		if ords := e.b.Ordinals(func(a *calico.AllocationAttribute) bool { return mine(a) && match(a) }); len(ords) > 0 {
			if err := e.edit().Release(ords...); err != nil {
				return nil, false, withCode(ErrDatastore, "release %s from %s: %w", handle, cidr, err)
			}
			e.dirty = true
			changed = true
		}
		left := len(e.b.Ordinals(mine))
		if left != n {
			changed = true
		}
		if left > 0 {
			h.Block[cidr.String()] = left
		}
	}
	return h, changed, nil
}
