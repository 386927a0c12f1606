package cni

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
)

// maxTxnOps stays under etcd's default --max-txn-ops (128).
const maxTxnOps = 100

// blockEntry is a block as read, its mod revision (0 for a block this operation creates), and
// whether the operation changed it.
type blockEntry struct {
	b     *calico.Block
	rev   int64
	dirty bool
	// created marks a block claimed by this operation (written with its affinity, if absent).
	created bool
	// release marks an empty block of the node whose pool no longer selects it: deleted with its
	// affinity (calico.ReleaseWhenUnselected).
	release bool
	// encoded is the block's value as read or last written (nil once changed in memory).
	encoded []byte
}

// affinityEntry is one of the node's affinity keys as read.
type affinityEntry struct {
	state string
	rev   int64
}

// listing is the set of block CIDRs of one family at a revision.
type listing struct {
	rev   int64
	cidrs []netip.Prefix
}

// view is what one attempt of an operation has read from etcd; everything it writes is conditional
// on the revisions recorded here.
type view struct {
	*call

	handleID  string
	handle    *calico.Handle // nil: absent
	handleRev int64
	// handleValue, when set, is the exact value the handle is believed to hold (derived from cached
	// blocks, not read): the write is then conditional on it instead of on handleRev.
	handleValue []byte
	cfg         calico.IPAMConfig
	pools       []calico.IPPool
	// node is this node's Calico Node resource (for IP pool node selectors); nil when absent or not read.
	node *calico.Node
	// reserved are Calico's IPReservations, never handed out by automatic assignment.
	reserved calico.Reservations
	// readRev is the revision of the first read of the attempt (0 for a view built from the node cache);
	// resourcesRead says that read included the Node resource and the IPReservations.
	readRev       int64
	resourcesRead bool
	// affinityWrites are changes to the node's affinity keys the write makes besides those of the
	// blocks it creates: confirm a pending affinity of a block it uses, or delete a stale one.
	affinityWrites map[netip.Prefix]calico.AffinityStep
	poolRevs       map[string]int64 // pool name -> mod revision
	affinity       map[netip.Prefix]affinityEntry
	blocks         map[netip.Prefix]*blockEntry
	// bad holds blocks that exist but cannot be decoded or break Calico's invariants; never written.
	bad      map[netip.Prefix]error
	listings [2]*listing
	// extra are compares the write must also satisfy (the cached path's pool revisions).
	extra []compare
	// others are batched requests whose handles the write creates too (group commit).
	others []*batchRequest
}

func (c *call) emptyView(handleID string) *view {
	return &view{call: c, handleID: handleID, cfg: calico.DefaultIPAMConfig(), poolRevs: map[string]int64{},
		affinity: map[netip.Prefix]affinityEntry{}, blocks: map[netip.Prefix]*blockEntry{}, bad: map[netip.Prefix]error{},
		affinityWrites: map[netip.Prefix]calico.AffinityStep{}}
}

// readSpec says what the first read of an attempt fetches, all in one transaction: the handle, the
// IPAM config, the pools, the node's affinities, the node's Calico Node resource and the
// IPReservations (resources), and the blocks named in hint (the node cache's list of the node's
// blocks, so that the common path needs no second read).
type readSpec struct {
	handle, config, pools, affinity, resources bool
	hint                                       []netip.Prefix
}

// reads is the list of range operations of a readSpec, and how to interpret each answer.
type reads struct {
	ops   []op
	kinds []string
	cidrs []netip.Prefix // for "block" kinds
}

func (c *call) reads(handleID string, spec readSpec) reads {
	var r reads
	add := func(o op, kind string, cidr netip.Prefix) {
		r.ops, r.kinds, r.cidrs = append(r.ops, o), append(r.kinds, kind), append(r.cidrs, cidr)
	}
	if spec.handle {
		add(getOp(calico.HandleKey(handleID)), "handle", netip.Prefix{})
	}
	if spec.config {
		add(getOp(calico.IPAMConfigKey), "config", netip.Prefix{})
	}
	if spec.pools {
		add(prefixOp(calico.IPPoolPrefix, false), "pools", netip.Prefix{})
	}
	if spec.affinity {
		add(prefixOp(calico.HostAffinityNodePrefix(c.conf.Node), false), "affinity", netip.Prefix{})
	}
	if spec.resources {
		add(getOp(calico.NodeKey(c.conf.Node)), "node", netip.Prefix{})
		add(prefixOp(calico.IPReservationPrefix, false), "reservations", netip.Prefix{})
	}
	for _, cidr := range spec.hint {
		if len(r.ops) >= maxTxnOps-8 {
			break
		}
		add(getOp(calico.BlockKey(cidr)), "block", cidr)
	}
	return r
}

// newView runs the reads of spec in one round trip.
func (c *call) newView(ctx context.Context, handleID string, spec readSpec) (*view, error) {
	r := c.reads(handleID, spec)
	res, err := c.etcd.txn(ctx, nil, r.ops, nil)
	if err != nil {
		return nil, fmt.Errorf("read ipam state of node %s: %w", c.conf.Node, err)
	}
	return c.viewFrom(handleID, r, res)
}

// viewFrom builds a view from the answers to r (from newView, or from the failure branch of a
// transaction built on the node cache).
func (c *call) viewFrom(handleID string, r reads, res *txnResult) (*view, error) {
	ranges := res.Ranges
	if len(ranges) != len(r.ops) {
		return nil, withCode(ErrDatastore, "etcd answered %d of %d reads", len(ranges), len(r.ops))
	}
	v := c.emptyView(handleID)
	v.readRev = res.Revision
	node, log := c.conf.Node, c.log
	for i, kind := range r.kinds {
		kvs := ranges[i]
		switch kind {
		case "handle":
			if len(kvs) == 1 {
				h, err := calico.DecodeHandle(kvs[0].Value)
				if err != nil {
					return nil, withCode(ErrDatastore, "handle %s: %w", handleID, err)
				}
				if !h.Deleted {
					v.handle = h
				}
				v.handleRev = kvs[0].ModRevision
			}
		case "config":
			if len(kvs) == 1 {
				c, err := calico.DecodeIPAMConfig(kvs[0].Value)
				if err != nil {
					return nil, withCode(ErrDatastore, "%s: %w", calico.IPAMConfigKey, err)
				}
				v.cfg = c
			}
		case "pools":
			for _, kv := range kvs {
				p, err := calico.DecodeIPPool(kv.Value)
				if err != nil {
					log.Warn("ignoring undecodable IP pool", "key", kv.Key, "err", err)
					continue
				}
				p.Name = strings.TrimPrefix(kv.Key, calico.IPPoolPrefix)
				v.pools = append(v.pools, p)
				v.poolRevs[p.Name] = kv.ModRevision
			}
		case "affinity":
			for _, kv := range kvs {
				k, err := calico.ParseKey(kv.Key)
				if err != nil || k.Kind != calico.KindHostAffinity || k.Name != node {
					continue
				}
				a, err := calico.DecodeAffinity(kv.Value)
				if err != nil {
					log.Warn("ignoring undecodable affinity", "key", kv.Key, "err", err)
					continue
				}
				if a.Deleted {
					a.State = calico.AffinityPendingDeletion
				}
				v.affinity[k.CIDR] = affinityEntry{state: a.State, rev: kv.ModRevision}
			}
		case "node":
			if len(kvs) == 1 {
				n, err := calico.DecodeNode(kvs[0].Value)
				if err != nil {
					// Pools with node selectors then select nothing; those for every node still serve.
					log.Warn("ignoring undecodable Calico Node resource", "key", kvs[0].Key, "err", err)
					continue
				}
				v.node = &n
			}
		case "reservations":
			v.resourcesRead = true
			for _, kv := range kvs {
				rs, err := calico.DecodeIPReservation(kv.Value)
				if err != nil {
					log.Warn("ignoring undecodable IPReservation entries", "key", kv.Key, "err", err)
				}
				v.reserved = append(v.reserved, rs...)
			}
		case "block":
			v.absorbBlock(r.cidrs[i], kvs)
		}
	}
	return v, nil
}

// absorbBlock records the answer to a read of the block cidr: nil when absent or soft-deleted, in bad
// when it cannot be used.
func (v *view) absorbBlock(cidr netip.Prefix, kvs []kv) {
	v.blocks[cidr] = nil
	if len(kvs) != 1 {
		return
	}
	e, err := decodeBlockKV(cidr, kvs[0])
	if err != nil {
		v.bad[cidr] = err
		v.log.Warn("cannot use block", "cidr", cidr, "err", err)
		return
	}
	v.blocks[cidr] = e
}

// loadBlocks reads the blocks with the given CIDRs that are not loaded yet, in one round trip per
// maxTxnOps blocks (none when all are loaded).
func (v *view) loadBlocks(ctx context.Context, cidrs []netip.Prefix) error {
	var todo []netip.Prefix
	for _, c := range cidrs {
		_, loaded := v.blocks[c]
		if _, bad := v.bad[c]; !loaded && !bad && !slices.Contains(todo, c) {
			todo = append(todo, c)
		}
	}
	for len(todo) > 0 {
		n := min(len(todo), maxTxnOps)
		chunk := todo[:n]
		todo = todo[n:]
		ops := make([]op, len(chunk))
		for i, c := range chunk {
			ops[i] = getOp(calico.BlockKey(c))
		}
		res, err := v.etcd.txn(ctx, nil, ops, nil)
		if err != nil {
			return fmt.Errorf("read %d blocks: %w", len(chunk), err)
		}
		if len(res.Ranges) != len(ops) {
			return withCode(ErrDatastore, "etcd answered %d of %d block reads", len(res.Ranges), len(ops))
		}
		for i, c := range chunk {
			v.absorbBlock(c, res.Ranges[i])
		}
	}
	return nil
}

// decodeBlockKV decodes a block read under the key of cidr, refusing values that break Calico's
// invariants: block-ipam never writes on top of a block it does not understand. A soft-deleted block
// gives nil.
func decodeBlockKV(cidr netip.Prefix, kv kv) (*blockEntry, error) {
	b, err := calico.DecodeBlock(kv.Value)
	if err != nil {
		return nil, withCode(ErrDatastore, "block %s: %w", cidr, err)
	}
	if b.Deleted {
		return nil, nil
	}
	if b.CIDR != cidr {
		return nil, withCode(ErrDatastore, "block key %s holds cidr %s", calico.BlockKey(cidr), b.CIDR)
	}
	if err := b.Validate(); err != nil {
		return nil, withCode(ErrDatastore, "%w", err)
	}
	return &blockEntry{b: b, rev: kv.ModRevision, encoded: kv.Value}, nil
}

// resourcesUnchanged are the compares that hold while no IPReservation, no affinity of the node and
// not its Calico Node resource was written after rev (deletions of reservations and affinities go
// unnoticed: they only make a decision taken without them more cautious than needed).
func (v *view) resourcesUnchanged(rev int64) []compare {
	return []compare{
		noneModifiedSince(calico.IPReservationPrefix, rev),
		noneModifiedSince(calico.HostAffinityNodePrefix(v.conf.Node), rev),
		unmodifiedSince(calico.NodeKey(v.conf.Node), rev),
	}
}

// listBlocks lists the CIDRs of every block of family f (keys only), once per attempt.
func (v *view) listBlocks(ctx context.Context, f Family) (*listing, error) {
	if l := v.listings[f]; l != nil {
		return l, nil
	}
	prefix := calico.BlockPrefix + f.String() + "/block/"
	res, err := v.etcd.txn(ctx, nil, []op{prefixOp(prefix, true)}, nil)
	if err != nil {
		return nil, fmt.Errorf("list %s blocks: %w", f, err)
	}
	l := &listing{rev: res.Revision}
	for _, kv := range res.Ranges[0] {
		k, err := calico.ParseKey(kv.Key)
		if err != nil || k.Kind != calico.KindBlock {
			v.log.Warn("ignoring foreign key under the block prefix", "key", kv.Key)
			continue
		}
		l.cidrs = append(l.cidrs, k.CIDR)
	}
	v.listings[f] = l
	return l, nil
}

// loadFamily reads every block of family f with its value (for borrowing). Blocks that cannot be
// decoded are recorded in bad and never written.
func (v *view) loadFamily(ctx context.Context, f Family) error {
	prefix := calico.BlockPrefix + f.String() + "/block/"
	res, err := v.etcd.txn(ctx, nil, []op{prefixOp(prefix, false)}, nil)
	if err != nil {
		return fmt.Errorf("read %s blocks: %w", f, err)
	}
	l := &listing{rev: res.Revision}
	for _, kv := range res.Ranges[0] {
		k, err := calico.ParseKey(kv.Key)
		if err != nil || k.Kind != calico.KindBlock {
			continue
		}
		l.cidrs = append(l.cidrs, k.CIDR)
		if e, ok := v.blocks[k.CIDR]; ok && (e == nil || e.dirty || e.rev >= kv.ModRevision) {
			continue
		}
		e, err := decodeBlockKV(k.CIDR, kv)
		if err != nil {
			v.bad[k.CIDR] = err
			continue
		}
		v.blocks[k.CIDR] = e
	}
	if v.listings[f] == nil {
		v.listings[f] = l
	}
	return nil
}

// dirtyCIDRs returns the CIDRs of the blocks this attempt changed, sorted.
func (v *view) dirtyCIDRs() []netip.Prefix {
	var out []netip.Prefix
	for c, e := range v.blocks {
		if e != nil && e.dirty {
			out = append(out, c)
		}
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	return out
}

// commit writes every changed block and the handle in one transaction, conditional on every key
// being as read: an existing block at its mod revision, a new block still absent with no block of its
// family created since the listing its choice was based on (so no overlapping block of another size
// appeared), its affinity as read, the handle at its mod revision, and v.extra. A block a release left
// empty and without affinity is deleted instead of written (calico.Block.DeleteWhenReleased), and
// v.affinityWrites confirm or delete affinities, each conditional on its mod revision. newHandle nil
// or empty deletes the handle. When the conditions fail the transaction runs failure instead (reads
// for the next attempt) and commit returns errConflict with the transaction's result.
func (v *view) commit(ctx context.Context, newHandle *calico.Handle, failure []op) (*txnResult, error) {
	cmps := slices.Clone(v.extra)
	if v.resourcesRead {
		// The decisions rest on the reservations, the Node resource and the node's affinities as read:
		// a write conditional on them also makes the view valid up to the write's revision (the node
		// cache's ReadRev).
		cmps = append(cmps, v.resourcesUnchanged(v.readRev)...)
	}
	var ops []op
	var listed [2]bool
	cidrs := v.dirtyCIDRs()
	var deleted []netip.Prefix
	for _, c := range cidrs {
		e := v.blocks[c]
		key := calico.BlockKey(c)
		if !e.created && (e.release || e.b.DeleteWhenReleased()) {
			cmps = append(cmps, modRevisionIs(key, e.rev))
			ops = append(ops, deleteOp(key))
			deleted = append(deleted, c)
			continue
		}
		e.b.BumpSequence()
		data, err := calico.EncodeBlock(e.b)
		if err != nil {
			return nil, fmt.Errorf("encode block %s: %w", c, err)
		}
		e.encoded = data
		if e.created {
			f := familyOf(c.Addr())
			cmps = append(cmps, absent(key))
			if l := v.listings[f]; l != nil && !listed[f] {
				listed[f] = true
				cmps = append(cmps, noneCreatedSince(calico.BlockPrefix+f.String()+"/block/", l.rev))
			}
			affKey := calico.HostAffinityKey(v.conf.Node, c)
			if a, ok := v.affinity[c]; ok {
				cmps = append(cmps, modRevisionIs(affKey, a.rev))
			} else {
				cmps = append(cmps, absent(affKey))
			}
			aff, _ := calico.EncodeAffinity(calico.AffinityValue{State: calico.AffinityConfirmed})
			ops = append(ops, putOp(affKey, aff))
		} else {
			cmps = append(cmps, modRevisionIs(key, e.rev))
		}
		ops = append(ops, putOp(key, data))
	}
	for c, step := range v.affinityWrites {
		a, ok := v.affinity[c]
		if e := v.blocks[c]; !ok || (e != nil && e.created) {
			continue
		}
		affKey := calico.HostAffinityKey(v.conf.Node, c)
		cmps = append(cmps, modRevisionIs(affKey, a.rev))
		if step == calico.AffinityStale {
			ops = append(ops, deleteOp(affKey))
		} else {
			aff, _ := calico.EncodeAffinity(calico.AffinityValue{State: calico.AffinityConfirmed})
			ops = append(ops, putOp(affKey, aff))
		}
	}
	hkey := calico.HandleKey(v.handleID)
	if v.handleValue != nil {
		cmps = append(cmps, valueIs(hkey, v.handleValue))
	} else {
		cmps = append(cmps, modRevisionIs(hkey, v.handleRev))
	}
	if newHandle == nil || len(newHandle.Block) == 0 {
		if v.handleRev != 0 || v.handleValue != nil {
			ops = append(ops, deleteOp(hkey))
		}
	} else {
		data, err := calico.EncodeHandle(newHandle)
		if err != nil {
			return nil, fmt.Errorf("encode handle %s: %w", v.handleID, err)
		}
		ops = append(ops, putOp(hkey, data))
	}
	for _, r := range v.others {
		data, err := calico.EncodeHandle(handleWith(nil, r.allocs))
		if err != nil {
			return nil, fmt.Errorf("encode handle %s: %w", r.Handle, err)
		}
		key := calico.HandleKey(r.Handle)
		cmps = append(cmps, absent(key))
		ops = append(ops, putOp(key, data))
	}
	if len(ops) == 0 {
		return &txnResult{Succeeded: true}, nil
	}
	if v.pause != nil {
		v.pause(ctx)
	}
	res, err := v.etcd.txn(ctx, cmps, ops, failure)
	if err != nil {
		return nil, fmt.Errorf("write %d blocks and handle %s: %w", len(cidrs), v.handleID, err)
	}
	if !res.Succeeded {
		return res, errConflict
	}
	if v.resourcesRead {
		v.readRev = res.Revision
	}
	for _, c := range cidrs {
		if slices.Contains(deleted, c) {
			v.blocks[c] = nil
			v.log.Info("deleted an empty block (no affinity, or its pool no longer selects this node)", "block", c)
			continue
		}
		e := v.blocks[c]
		if e.created {
			v.affinity[c] = affinityEntry{state: calico.AffinityConfirmed, rev: res.Revision}
		}
		e.rev, e.dirty, e.created = res.Revision, false, false
	}
	for c, step := range v.affinityWrites {
		if step == calico.AffinityStale {
			delete(v.affinity, c)
		} else if _, ok := v.affinity[c]; ok {
			v.affinity[c] = affinityEntry{state: calico.AffinityConfirmed, rev: res.Revision}
		}
	}
	clear(v.affinityWrites)
	return res, nil
}
