package ipamd

import (
	"fmt"
	"net/netip"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/internal/netaddr"
)

// del decides a DEL (a decision of a batch, see serve): it releases the addresses of (container,
// ifname) by handle, never by prevResult (libcni sends none when its cache is gone) and without the
// netns. Released ordinals go to the tail of their block's FIFO; the handle is decremented,
// corrected to what the blocks really hold, or deleted. Nothing to release is success. An emptied
// block keeps its affinity, unless its pool no longer selects its node (releaseEmptied). The DELs of
// a batch are decided alike, each on what the ones before it left.
//
// Until the handle is read, its value is derived from the node's blocks and the write is conditional
// on exactly that value (steady state: one round trip, no read); if the handle holds anything else,
// the write's failure branch reads it.
func (v *view) del(r *request, _ bool) error {
	if !v.handleRead {
		guess := calico.NewHandle()
		for cidr, e := range v.blocks {
			if e == nil {
				continue
			}
			if n := len(e.b.Ordinals(func(a *calico.AllocationAttribute) bool { return a.HeldBy(r.handle) })); n > 0 {
				guess.Add(cidr, n)
			}
		}
		if len(guess.Block) == 0 {
			return v.needHandle()
		}
		data, err := calico.EncodeHandle(guess)
		if err != nil {
			return err
		}
		v.handle, v.handleGuess = guess, data
	}
	if v.handle == nil {
		return nil // nothing to release
	}
	if err := v.require(handleBlocks(v.handle)...); err != nil {
		return err
	}
	h, changed, err := v.releaseHandle(r.handle, r.ifname)
	switch {
	case err != nil:
		return err
	case !changed && !v.handleRead:
		// Nothing of this interface in the node's blocks: only the handle can say where it is.
		return v.needHandle()
	case changed:
		if err := v.releaseEmptied(); err != nil {
			return err
		}
	}
	r.changed, r.newHandle = changed, h
	return nil
}

// releaseEmptied does in the release's write what Calico's ensureConsistentAffinity does after a
// release (ipam.go): a block the release left empty, whose pool no longer selects the block's owner
// node, is deleted with that node's affinity (calico.ReleaseWhenUnselected). This node's blocks are
// decided on the state; another node's need its Node resource and affinity read.
func (v *view) releaseEmptied() error {
	for _, cidr := range v.dirtyCIDRs() {
		e, p := v.blocks[cidr], v.poolOf(cidr)
		o := calico.OwnerOf(e.b, false)
		if e.release || e.created || !e.b.Empty() || o.Kind != calico.OwnerHost || p == nil || p.Disabled {
			continue
		}
		if o.Node == v.conf.Node {
			v.releaseUnselected(cidr, p)
			continue
		}
		nodeKey, affKey := calico.NodeKey(o.Node), calico.HostAffinityKey(o.Node, cidr)
		kvs, err := v.keys(nodeKey, affKey)
		if err != nil {
			return err
		}
		nkv, akv := kvs[0], kvs[1]
		if nkv == nil || akv == nil {
			continue
		}
		n, err := calico.DecodeNode(nkv.Value)
		if err != nil || !calico.ReleaseWhenUnselected(*p, &n, e.b, o.Node) {
			continue
		}
		v.did("releasing an emptied block whose pool no longer selects its node", "block", cidr, "node", o.Node, "pool", p.Name)
		e.release = true
		v.use(cidr)
		v.uses[nodeKey], v.uses[affKey], v.keyWrites[affKey] = nkv.ModRevision, akv.ModRevision, nil
	}
	return nil
}

// releaseHandle releases, in the loaded blocks the handle lists, every allocation of the handle on
// interface ifname, and returns the handle corrected to the allocations that remain, and whether
// anything changed.
func (v *view) releaseHandle(handle, ifname string) (*calico.Handle, bool, error) {
	h := calico.NewHandle()
	changed := false
	for k, n := range v.handle.Block {
		p, err := netip.ParsePrefix(k)
		if err != nil {
			v.didWarn("dropping an unparseable block from the handle", "handle", handle, "block", k)
			changed = true
			continue
		}
		cidr := netaddr.Canonical(p)
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
		if ords := e.b.Ordinals(func(a *calico.AllocationAttribute) bool { return mine(a) && ifnameOf(a) == ifname }); len(ords) > 0 {
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
