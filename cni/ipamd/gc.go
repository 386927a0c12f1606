package ipamd

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/cni"
)

// gcCandidate is an allocation GC found stale in its snapshot, identified by the sequence number it
// was allocated with, so that an address released and reallocated meanwhile is never touched.
type gcCandidate struct {
	ord    int
	seq    uint64
	hasSeq bool
	handle string
}

// gcSnapshot is what GC found stale in one read of every block: the candidates by block, and the
// errors of blocks it could not read.
type gcSnapshot struct {
	stale      map[netip.Prefix][]gcCandidate
	errs       []error
	roundTrips int64
}

// snapshotGC reads every block of both families in one round trip and finds this node's allocations
// on the request's network whose (containerID, ifname) is not in cni.dev/valid-attachments. It runs
// on the connection's goroutine, not the state goroutine: the read of the whole cluster's blocks
// holds no other operation up. Without the key there is nothing to find (the runtime gave no
// information).
func snapshotGC(ctx context.Context, etcd *etcdClient, conf *cni.Request) (*gcSnapshot, error) {
	snap := &gcSnapshot{stale: map[netip.Prefix][]gcCandidate{}}
	if !conf.HaveAttachments {
		return snap, nil
	}
	snap.roundTrips++
	res, err := etcd.txn(ctx, nil, []op{
		prefixOp(calico.BlockPrefix+"ipv4/block/", false),
		prefixOp(calico.BlockPrefix+"ipv6/block/", false),
	}, nil)
	if err != nil {
		return snap, fmt.Errorf("GC snapshot: %w", err)
	}
	valid := map[types.GCAttachment]bool{}
	for _, a := range conf.ValidAttachments {
		valid[a] = true
	}
	prefix := conf.Network + "."
	for _, kvs := range res.Ranges {
		for _, kv := range kvs {
			k, err := calico.ParseKey(kv.Key)
			if err != nil || k.Kind != calico.KindBlock {
				continue
			}
			e, err := decodeBlockKV(k.CIDR, kv)
			if err != nil {
				// Only a problem if it holds something of ours; the error is reported either way.
				snap.errs = append(snap.errs, fmt.Errorf("GC: %w", err))
				continue
			}
			if e == nil {
				continue
			}
			for ord := range e.b.Allocations {
				a := e.b.AttributeOf(ord)
				if !ours(conf, a) {
					continue
				}
				att := types.GCAttachment{ContainerID: strings.TrimPrefix(a.Handle(), prefix), IfName: ifnameOf(a)}
				if valid[att] {
					continue
				}
				seq, ok := e.b.SequenceOf(ord)
				snap.stale[k.CIDR] = append(snap.stale[k.CIDR], gcCandidate{ord: ord, seq: seq, hasSeq: ok, handle: a.Handle()})
			}
		}
	}
	return snap, nil
}

// gc releases, on the state goroutine, what snapshotGC found stale, block by block: each block is
// re-read with the handles involved, each candidate re-validated (same handle, node, network and
// allocation sequence number), and written conditionally on what was read. Allocations of other
// nodes, of other networks, and those block-ipam did not write (no network attribute) are never
// touched. Errors do not stop it: they are returned joined at the end.
func (c *call) gc(ctx context.Context, snap *gcSnapshot) (int, error) {
	if !c.conf.HaveAttachments {
		c.log.Info("GC without cni.dev/valid-attachments: nothing released")
		return 0, nil
	}
	c.roundTrips += snap.roundTrips
	errs := snap.errs
	stale := snap.stale
	if c.pause != nil && len(stale) > 0 {
		c.pause(ctx)
	}
	cidrs := slices.SortedFunc(maps.Keys(stale), comparePrefix)
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

// ours reports whether an allocation is the request's node's on its network, written by block-ipam.
func ours(conf *cni.Request, a *calico.AllocationAttribute) bool {
	return a != nil && a.Secondary[AttrNetwork] == conf.Network && a.Secondary[calico.AttrNode] == conf.Node &&
		strings.HasPrefix(a.Handle(), conf.Network+".")
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
	res, err := c.txn(ctx, nil, ops, nil)
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
		if !ours(c.conf, a) || a.Handle() != cd.handle {
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
	if err := e.edit().Release(ords...); err != nil {
		return 0, withCode(ErrDatastore, "%w", err)
	}
	cmps := []compare{modRevisionIs(calico.BlockKey(cidr), e.rev)}
	var writes []op
	written := e
	if e.b.DeleteWhenReleased() {
		writes = append(writes, deleteOp(calico.BlockKey(cidr)))
		written = nil
	} else {
		e.b.BumpSequence()
		if e.encoded, err = calico.EncodeBlock(e.b); err != nil {
			return 0, err
		}
		writes = append(writes, putOp(calico.BlockKey(cidr), e.encoded))
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
	tr, err := c.txn(context.WithoutCancel(ctx), cmps, writes, nil)
	if err != nil {
		return 0, err
	}
	if !tr.Succeeded {
		return 0, errConflict
	}
	c.state.committed(&plan{blocks: map[netip.Prefix]*blockEntry{cidr: written}}, tr.Revision)
	c.log.Info("GC released stale allocations", "block", cidr, "count", len(ords), "handles", strings.Join(handles, ","))
	return len(ords), nil
}

// gcError joins GC's errors into one CNI error, with the code of the first typed one (11 when they
// are all transient).
func gcError(errs []error) error {
	joined := errors.Join(errs...)
	te := toCNIError(errs[0])
	return &types.Error{Code: te.Code, Msg: "GC finished with errors: " + strings.ReplaceAll(joined.Error(), "\n", "; ")}
}
