package cni

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
)

// gcCandidate is an allocation GC found stale in its snapshot, identified by the sequence number it
// was allocated with, so that an address released and reallocated meanwhile is never touched.
type gcCandidate struct {
	ord    int
	seq    uint64
	hasSeq bool
	handle string
}

// gc releases this node's allocations on this network whose (containerID, ifname) is not in
// cni.dev/valid-attachments. Without the key it releases nothing (the runtime gave no information).
// It snapshots every block once, then releases block by block: each block is re-read with the handles
// involved, each candidate re-validated (same handle, node, network and allocation sequence number),
// and written conditionally on what was read. Allocations of other nodes, of other networks, and those
// block-ipam did not write (no network attribute) are never touched. Errors do not stop it: they are
// returned joined at the end.
func (c *call) gc(ctx context.Context) (int, error) {
	if !c.conf.HaveAttachments {
		c.log.Info("GC without cni.dev/valid-attachments: nothing released")
		return 0, nil
	}
	valid := map[types.GCAttachment]bool{}
	for _, a := range c.conf.ValidAttachments {
		valid[a] = true
	}
	lock, err := c.lock(ctx)
	if err != nil {
		return 0, err
	}
	defer lock.release()

	// Snapshot: every block of both families in one read.
	res, err := c.etcd.txn(ctx, nil, []op{
		prefixOp(calico.BlockPrefix+"ipv4/block/", false),
		prefixOp(calico.BlockPrefix+"ipv6/block/", false),
	}, nil)
	if err != nil {
		return 0, fmt.Errorf("GC snapshot: %w", err)
	}
	prefix := c.conf.Network + "."
	stale := map[netip.Prefix][]gcCandidate{}
	var errs []error
	for _, kvs := range res.Ranges {
		for _, kv := range kvs {
			k, err := calico.ParseKey(kv.Key)
			if err != nil || k.Kind != calico.KindBlock {
				continue
			}
			e, err := decodeBlockKV(k.CIDR, kv)
			if err != nil {
				// Only a problem if it holds something of ours; the error is reported either way.
				errs = append(errs, fmt.Errorf("GC: %w", err))
				continue
			}
			if e == nil {
				continue
			}
			for ord := range e.b.Allocations {
				a := e.b.AttributeOf(ord)
				if !c.ours(a) {
					continue
				}
				att := types.GCAttachment{ContainerID: strings.TrimPrefix(a.Handle(), prefix), IfName: ifnameOf(a)}
				if valid[att] {
					continue
				}
				seq, ok := e.b.SequenceOf(ord)
				stale[k.CIDR] = append(stale[k.CIDR], gcCandidate{ord: ord, seq: seq, hasSeq: ok, handle: a.Handle()})
			}
		}
	}

	if c.pause != nil && len(stale) > 0 {
		c.pause(ctx)
	}
	cidrs := make([]netip.Prefix, 0, len(stale))
	for cidr := range stale {
		cidrs = append(cidrs, cidr)
	}
	slices.SortFunc(cidrs, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	released := 0
	for _, cidr := range cidrs {
		n := 0
		err := c.retry(ctx, "GC "+cidr.String(), func(ctx context.Context) error {
			var err error
			n, err = c.gcBlock(ctx, cidr, stale[cidr])
			return err
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("GC block %s: %w", cidr, err))
			if ctx.Err() != nil {
				break
			}
			continue
		}
		released += n
	}
	if len(errs) > 0 {
		return released, gcError(errs)
	}
	return released, nil
}

// ours reports whether an allocation is this node's on this network, written by block-ipam.
func (c *call) ours(a *calico.AllocationAttribute) bool {
	return a != nil && a.Secondary[AttrNetwork] == c.conf.Network && a.Secondary[calico.AttrNode] == c.conf.Node &&
		strings.HasPrefix(a.Handle(), c.conf.Network+".")
}

// gcBlock re-reads one block and the handles of its candidates in one transaction, releases the
// candidates that are still the same allocations, and writes block and handles in one conditional
// transaction. It returns how many addresses it released.
func (c *call) gcBlock(ctx context.Context, cidr netip.Prefix, cands []gcCandidate) (int, error) {
	var handles []string
	for _, cd := range cands {
		if !slices.Contains(handles, cd.handle) {
			handles = append(handles, cd.handle)
		}
	}
	ops := []op{getOp(calico.BlockKey(cidr))}
	for _, h := range handles {
		ops = append(ops, getOp(calico.HandleKey(h)))
	}
	res, err := c.etcd.txn(ctx, nil, ops, nil)
	if err != nil {
		return 0, err
	}
	if len(res.Ranges) != len(ops) || len(res.Ranges[0]) != 1 {
		return 0, nil // the block is gone: nothing left to release
	}
	e, err := decodeBlockKV(cidr, res.Ranges[0][0])
	if err != nil || e == nil {
		return 0, err
	}
	var ords []int
	perHandle := map[string]int{}
	for _, cd := range cands {
		a := e.b.AttributeOf(cd.ord)
		if !c.ours(a) || a.Handle() != cd.handle {
			continue
		}
		if seq, ok := e.b.SequenceOf(cd.ord); ok != cd.hasSeq || seq != cd.seq {
			continue // released and reallocated since the snapshot
		}
		ords = append(ords, cd.ord)
		perHandle[cd.handle]++
	}
	if len(ords) == 0 {
		return 0, nil
	}
	if err := e.b.Release(ords...); err != nil {
		return 0, withCode(ErrDatastore, "%w", err)
	}
	cmps := []compare{modRevisionIs(calico.BlockKey(cidr), e.rev)}
	var writes []op
	if e.b.DeleteWhenReleased() {
		writes = append(writes, deleteOp(calico.BlockKey(cidr)))
	} else {
		e.b.BumpSequence()
		data, err := calico.EncodeBlock(e.b)
		if err != nil {
			return 0, err
		}
		writes = append(writes, putOp(calico.BlockKey(cidr), data))
	}
	for i, h := range handles {
		if perHandle[h] == 0 {
			continue
		}
		key := calico.HandleKey(h)
		kvs := res.Ranges[i+1]
		if len(kvs) != 1 {
			// An allocation without its handle: release it all the same; there is no count to fix.
			cmps = append(cmps, absent(key))
			continue
		}
		hv, err := calico.DecodeHandle(kvs[0].Value)
		if err != nil {
			return 0, withCode(ErrDatastore, "handle %s: %w", h, err)
		}
		hv.Remove(cidr, perHandle[h])
		cmps = append(cmps, modRevisionIs(key, kvs[0].ModRevision))
		if len(hv.Block) == 0 {
			writes = append(writes, deleteOp(key))
		} else {
			data, err := calico.EncodeHandle(hv)
			if err != nil {
				return 0, err
			}
			writes = append(writes, putOp(key, data))
		}
	}
	tr, err := c.etcd.txn(ctx, cmps, writes, nil)
	if err != nil {
		return 0, err
	}
	if !tr.Succeeded {
		return 0, errConflict
	}
	c.forget()
	c.log.Info("GC released stale allocations", "block", cidr, "count", len(ords), "handles", strings.Join(handles, ","))
	return len(ords), nil
}

// gcError joins GC's errors into one CNI error, with the code of the first typed one (11 when they
// are all transient).
func gcError(errs []error) error {
	joined := errors.Join(errs...)
	te := toCNIError(errs[0]).(*types.Error)
	return &types.Error{Code: te.Code, Msg: "GC finished with errors: " + strings.ReplaceAll(joined.Error(), "\n", "; ")}
}
