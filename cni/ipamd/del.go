package ipamd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
)

// del releases the addresses of (container, ifname) by handle, never by prevResult (libcni sends none
// when its cache is gone) and without the netns. Released ordinals go to the tail of their block's
// FIFO; the handle is decremented, corrected to what the blocks really hold, or deleted; all in one
// transaction. Nothing to release is success. An emptied block keeps its affinity, unless its pool no
// longer selects its node (releaseEmptied).
//
// The DELs waiting behind this one (c.waiting) are decided on the same view, each on what the ones
// before it left, and written in the same transaction (as many as fit in it; the others run later on
// their own). A DEL whose decision fails gets its error and the others go on; a lost race fails the
// transaction, whose failure branch reads every handle and block of the batch, and the batch is
// decided again.
func (c *call) del(ctx context.Context, containerID, ifname string) error {
	lead := &batchRequest{Handle: handleID(c.conf.Network, containerID), IfName: ifname}
	reqs := append([]*batchRequest{lead}, c.waiting...)
	err := c.retry(ctx, "DEL "+lead.Handle, func(ctx context.Context) error {
		err := c.delAttempt(ctx, reqs)
		if errors.Is(err, errConflict) && len(reqs) > 1 {
			reqs = c.isolate(reqs)
		}
		return err
	})
	if lead.err != nil {
		return lead.err
	}
	return err
}

// isolate returns the DELs reqs to decide again after a lost race, so that one DEL whose handle
// keeps changing cannot hold the others up until the leader's deadline: those (but the leader,
// reqs[0]) whose handle, read before their decision, the failure branch found changed again are
// left for an operation of their own. A handle guessed wrong is no reason (the failure branch read
// it: the next decision uses it); when nothing explains the race (a block changed), the batch is
// halved.
func (c *call) isolate(reqs []*batchRequest) []*batchRequest {
	keep, explained := reqs[:1], false
	for i, r := range reqs {
		moved, guessed := c.handleMoved(r)
		explained = explained || moved || guessed
		if i > 0 && !(moved && !r.served) {
			keep = append(keep, r)
		}
	}
	if !explained {
		keep = reqs[:(len(reqs)+1)/2]
	}
	return keep
}

// handleMoved reports whether the DEL r's handle, as the failure branch read it, is not what its
// decision was conditional on: moved when the decision had read it, guessed when it had guessed it.
func (c *call) handleMoved(r *batchRequest) (moved, guessed bool) {
	got, ok := c.read.keys[calico.HandleKey(r.Handle)]
	if !ok || !r.changed || r.err != nil {
		return false, false
	}
	if r.hv.handleGuess != nil {
		return false, got == nil || !bytes.Equal(got.Value, r.hv.handleGuess)
	}
	if got == nil {
		return r.hv.handleRev != 0, false
	}
	return got.ModRevision != r.hv.handleRev, false
}

// errRedo: a request of a batch failed on its own (its err is set); the batch is decided again
// without it.
var errRedo = errors.New("a request of the batch failed; deciding again without it")

// delAttempt decides the first n of the DELs reqs (all, halved until the transaction fits in
// maxTxnOps) and writes them in one transaction. It marks those it served; the others are left for
// an operation of their own.
func (c *call) delAttempt(ctx context.Context, reqs []*batchRequest) error {
	for n := len(reqs); ; {
		chunk := reqs[:n]
		v, err := c.decide(ctx, "", func(v *view) error { return v.delBatch(chunk) })
		if errors.Is(err, errRedo) {
			continue
		}
		if err != nil {
			return err
		}
		if len(v.dels) > 0 {
			_, err = c.write(ctx, v, nil)
			if errors.Is(err, errTooLarge) && n > 1 {
				n = (n + 1) / 2
				continue
			}
			if err != nil {
				return err
			}
		}
		for _, r := range chunk {
			r.served = true
		}
		return nil
	}
}

// delBatch decides the DELs reqs on the view in order, each on what those before it left (the
// view's blocks): v.dels are those that change their handle. A DEL whose decision fails gets its
// error (it is then served) and errRedo is returned: the decision starts again without it, on a
// view it did not touch. The needs of all of them are returned together, so that one round trip
// reads them.
func (v *view) delBatch(reqs []*batchRequest) error {
	var need *needs
	v.dels = nil
	for _, r := range reqs {
		if r.err != nil {
			continue
		}
		hv, err := loadHandle(v.read, r.Handle)
		if err == nil {
			v.handleView = hv
			ifname := r.IfName
			r.left, r.changed, err = v.del(r.Handle, func(a *calico.AllocationAttribute) bool { return ifnameOf(a) == ifname })
			if err == nil && r.changed {
				err = v.releaseEmptied()
			}
		}
		var n *needs
		if errors.As(err, &n) {
			need = need.merge(n)
			continue
		}
		if err != nil {
			r.err, r.served = fmt.Errorf("DEL %s: %w", r.Handle, err), true
			return errRedo
		}
		r.hv = v.handleView
		if r.changed {
			v.dels = append(v.dels, r)
		}
	}
	v.handleView = handleView{}
	if need != nil {
		return need
	}
	return nil
}

// del decides a DEL on the view: the handle as it is left (nil: deleted) and whether anything changes.
// Until the handle is read, its value is derived from the node's blocks and the write is conditional
// on exactly that value (steady state: one round trip, no read); if the handle holds anything else,
// the write's failure branch reads it.
func (v *view) del(handle string, match func(*calico.AllocationAttribute) bool) (*calico.Handle, bool, error) {
	if !v.handleRead {
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
			return nil, false, v.needHandle()
		}
		data, err := calico.EncodeHandle(guess)
		if err != nil {
			return nil, false, err
		}
		v.handle, v.handleGuess = guess, data
	}
	if v.handle == nil {
		v.log.Debug("no handle: nothing to release", "handle", handle)
		return nil, false, nil
	}
	if err := v.require(handleBlocks(v.handle)...); err != nil {
		return nil, false, err
	}
	h, changed, err := v.releaseHandle(handle, match)
	if err == nil && !changed && !v.handleRead {
		// Nothing of this interface in the node's blocks: only the handle can say where it is.
		return nil, false, v.needHandle()
	}
	return h, changed, err
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
		v.log.Info("releasing an emptied block whose pool no longer selects its node", "block", cidr, "node", o.Node, "pool", p.Name)
		e.release = true
		v.use(cidr)
		v.uses[nodeKey], v.uses[affKey], v.keyWrites[affKey] = nkv.ModRevision, akv.ModRevision, nil
	}
	return nil
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
