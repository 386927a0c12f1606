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
	cfg       calico.IPAMConfig
	pools     []calico.IPPool
	affinity  map[netip.Prefix]affinityEntry
	blocks    map[netip.Prefix]*blockEntry
	// bad holds blocks that exist but cannot be decoded or break Calico's invariants; never written.
	bad      map[netip.Prefix]error
	listings [2]*listing
}

// readSpec says what the first read of an attempt fetches, all in one transaction.
type readSpec struct {
	handle, config, pools, affinity bool
}

// newView reads the handle, the IPAM config, the pools and the node's affinities (as asked) in one
// round trip.
func (c *call) newView(ctx context.Context, handleID string, spec readSpec) (*view, error) {
	v := &view{call: c, handleID: handleID, cfg: calico.DefaultIPAMConfig(),
		affinity: map[netip.Prefix]affinityEntry{}, blocks: map[netip.Prefix]*blockEntry{}, bad: map[netip.Prefix]error{}}
	node, log := c.conf.Node, c.log
	var ops []op
	var kinds []string
	if spec.handle {
		ops, kinds = append(ops, getOp(calico.HandleKey(handleID))), append(kinds, "handle")
	}
	if spec.config {
		ops, kinds = append(ops, getOp(calico.IPAMConfigKey)), append(kinds, "config")
	}
	if spec.pools {
		ops, kinds = append(ops, prefixOp(calico.IPPoolPrefix, false)), append(kinds, "pools")
	}
	if spec.affinity {
		ops, kinds = append(ops, prefixOp(calico.HostAffinityNodePrefix(node), false)), append(kinds, "affinity")
	}
	res, err := c.etcd.txn(ctx, nil, ops, nil)
	if err != nil {
		return nil, fmt.Errorf("read ipam state of node %s: %w", node, err)
	}
	if len(res.Ranges) != len(ops) {
		return nil, withCode(ErrDatastore, "etcd answered %d of %d reads", len(res.Ranges), len(ops))
	}
	for i, kind := range kinds {
		kvs := res.Ranges[i]
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
				if p.Name == "" {
					p.Name = strings.TrimPrefix(kv.Key, calico.IPPoolPrefix)
				}
				v.pools = append(v.pools, p)
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
		}
	}
	return v, nil
}

// loadBlocks reads the blocks with the given CIDRs that are not loaded yet, in one round trip per
// maxTxnOps blocks. A missing (or soft-deleted) block is recorded as nil, one that cannot be used in
// bad.
func (v *view) loadBlocks(ctx context.Context, cidrs []netip.Prefix) error {
	var todo []netip.Prefix
	for _, c := range cidrs {
		if _, ok := v.blocks[c]; !ok && !slices.Contains(todo, c) {
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
			v.blocks[c] = nil
			if len(res.Ranges[i]) == 1 {
				e, err := decodeBlockKV(c, res.Ranges[i][0])
				if err != nil {
					v.bad[c] = err
					v.log.Warn("cannot use block", "cidr", c, "err", err)
					continue
				}
				v.blocks[c] = e
			}
		}
	}
	return nil
}

// decodeBlockKV decodes a block read under the key of cidr, refusing values that break Calico's
// invariants: block-ipam never writes on top of a block it does not understand.
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
	return &blockEntry{b: b, rev: kv.ModRevision}, nil
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

// loadFamily reads every block of family f with its value (for borrowing), at most once per attempt.
// Blocks that cannot be decoded are skipped with a warning: they are not written.
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

// commit writes every changed block and the handle in one transaction, conditional on every key
// being as read: an existing block at its mod revision, a new block still absent with no block of its
// family created since the listing its choice was based on (so no overlapping block of another size
// appeared), its affinity as read, the handle at its mod revision. newHandle nil deletes the handle.
// It returns errConflict when a condition failed.
func (v *view) commit(ctx context.Context, newHandle *calico.Handle) error {
	var cmps []compare
	var ops []op
	var listed [2]bool
	cidrs := make([]netip.Prefix, 0, len(v.blocks))
	for c, e := range v.blocks {
		if e != nil && e.dirty {
			cidrs = append(cidrs, c)
		}
	}
	slices.SortFunc(cidrs, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	for _, c := range cidrs {
		e := v.blocks[c]
		key := calico.BlockKey(c)
		e.b.BumpSequence()
		data, err := calico.EncodeBlock(e.b)
		if err != nil {
			return fmt.Errorf("encode block %s: %w", c, err)
		}
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
	hkey := calico.HandleKey(v.handleID)
	cmps = append(cmps, modRevisionIs(hkey, v.handleRev))
	if newHandle == nil || len(newHandle.Block) == 0 {
		if v.handleRev != 0 {
			ops = append(ops, deleteOp(hkey))
		}
	} else {
		data, err := calico.EncodeHandle(newHandle)
		if err != nil {
			return fmt.Errorf("encode handle %s: %w", v.handleID, err)
		}
		ops = append(ops, putOp(hkey, data))
	}
	if len(ops) == 0 {
		return nil
	}
	if v.pause != nil {
		v.pause(ctx)
	}
	res, err := v.etcd.txn(ctx, cmps, ops, nil)
	if err != nil {
		return fmt.Errorf("write %d blocks and handle %s: %w", len(cidrs), v.handleID, err)
	}
	if !res.Succeeded {
		return errConflict
	}
	return nil
}
