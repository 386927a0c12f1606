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
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

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

// gcPageSize is the blocks one page of GC's snapshot reads: a full /26 block with its attributes
// is about 15 kB, so a page is a few MB at most, read well within one CallTimeout.
const gcPageSize = 200

// snapshotGC reads every block of both families and finds this node's allocations on the request's
// network whose (containerID, ifname) is not in cni.dev/valid-attachments. The blocks of a whole
// cluster do not fit in one round trip's deadline: they are read in pages of gcPageSize blocks at
// one revision (etcdClient.list), each page with its own CallTimeout, the whole within ctx (the
// request's deadline: the network configuration's ipam.timeout, 30 s by default, which an operator
// of a large cluster can raise). It runs on the connection's goroutine, not the state goroutine:
// the read of the whole cluster's blocks holds no other operation up. Without the key there is
// nothing to find (the runtime gave no information).
func snapshotGC(ctx context.Context, etcd *etcdClient, conf *cni.Request) (*gcSnapshot, error) {
	snap := &gcSnapshot{stale: map[netip.Prefix][]gcCandidate{}}
	if !conf.HaveAttachments {
		return snap, nil
	}
	valid := map[types.GCAttachment]bool{}
	for _, a := range conf.ValidAttachments {
		valid[a] = true
	}
	prefix := conf.Network + "."
	var rts int64
	var err error
	// The revision compacted while the listing read it is no reason to give up: it starts once
	// more, at a fresh revision.
	for try := 0; try < 2; try++ {
		if try > 0 {
			snap.stale, snap.errs = map[netip.Prefix][]gcCandidate{}, nil
		}
		var n int64
		n, err = snap.list(ctx, etcd, conf, valid, prefix)
		rts += n
		if !errors.Is(err, rpctypes.ErrCompacted) {
			break
		}
	}
	snap.roundTrips = rts
	if err != nil {
		return snap, fmt.Errorf("GC snapshot: %w", err)
	}
	return snap, nil
}

// list adds to the snapshot what one listing of every block finds; it returns the round trips.
func (snap *gcSnapshot) list(ctx context.Context, etcd *etcdClient, conf *cni.Request, valid map[types.GCAttachment]bool, prefix string) (int64, error) {
	_, rts, err := etcd.list(ctx, []string{calico.BlockPrefix + "ipv4/block/", calico.BlockPrefix + "ipv6/block/"}, gcPageSize, func(kvs []kv) {
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
	})
	return rts, err
}

// gc releases, on the state goroutine, what snapshotGC found stale, a few blocks per transaction: a
// decision on the blocks (from the state, or read) and the handles involved re-validates each
// candidate (same handle, node, network and allocation sequence number), and the write is
// conditional on what it used. Allocations of other nodes, of other networks, and those block-ipam
// did not write (no network attribute) are never touched. Errors do not stop it: they are returned
// joined at the end.
func (c *call) gc(ctx context.Context, snap *gcSnapshot) (int, error) {
	if !c.conf.HaveAttachments {
		c.log.Info("GC without cni.dev/valid-attachments: nothing released")
		return 0, nil
	}
	c.roundTrips += snap.roundTrips
	errs := snap.errs
	released := 0
	for _, chunk := range gcChunks(snap.stale) {
		// What the previous chunk read is of no use to this one; kept, it would only grow the
		// failure branch of the writes.
		c.read = opRead{}
		cidrs := slices.SortedFunc(maps.Keys(chunk), netip.Prefix.Compare)
		var got int
		var bad []error
		err := c.retry(ctx, "GC", func(ctx context.Context) error {
			v, err := c.decide(ctx, "", func(v *view) error {
				var err error
				got, bad, err = v.gc(cidrs, chunk)
				return err
			})
			if err != nil || got == 0 {
				return err
			}
			err = c.write(ctx, v)
			return err
		})
		errs = append(errs, bad...)
		if err != nil {
			errs = append(errs, fmt.Errorf("GC blocks %s..%s: %w", cidrs[0], cidrs[len(cidrs)-1], err))
			if ctx.Err() != nil {
				break
			}
			continue
		}
		released += got
	}
	if len(errs) > 0 {
		return released, gcError(errs)
	}
	return released, nil
}

// gcChunkKeys bounds the keys (blocks and handles) of one GC transaction: each is compared, and a
// block also with its pool and affinity, and the failure branch reads them besides the state's
// sources, so both branches stay within maxTxnOps.
const gcChunkKeys = maxTxnOps / 2

// gcChunks splits the candidates into the transactions GC writes, in block order: a block and the
// handles of its candidates are at most 1+len(candidates) keys, and a block with more candidates
// than fit in one transaction (a /24 block holds 256) is split across several.
func gcChunks(stale map[netip.Prefix][]gcCandidate) []map[netip.Prefix][]gcCandidate {
	var out []map[netip.Prefix][]gcCandidate
	cur, keys := map[netip.Prefix][]gcCandidate{}, 0
	for _, cidr := range slices.SortedFunc(maps.Keys(stale), netip.Prefix.Compare) {
		for cands := stale[cidr]; len(cands) > 0; {
			if keys+2 > gcChunkKeys {
				out = append(out, cur)
				cur, keys = map[netip.Prefix][]gcCandidate{}, 0
			}
			n := min(len(cands), gcChunkKeys-keys-1)
			cur[cidr] = cands[:n]
			keys += 1 + n
			cands = cands[n:]
		}
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}

// gc decides the release of the candidates of the blocks cidrs that are still the allocations
// snapshotGC found: their blocks lose them, their handles are corrected (or deleted when emptied).
// It returns how many it releases, and the errors of blocks it cannot use.
func (v *view) gc(cidrs []netip.Prefix, stale map[netip.Prefix][]gcCandidate) (int, []error, error) {
	if err := v.require(cidrs...); err != nil {
		return 0, nil, err
	}
	var handleKeys []string
	for _, cidr := range cidrs {
		for _, cd := range stale[cidr] {
			if k := calico.HandleKey(cd.handle); !slices.Contains(handleKeys, k) {
				handleKeys = append(handleKeys, k)
			}
		}
	}
	handles, err := v.keys(handleKeys...)
	if err != nil {
		return 0, nil, err
	}
	var errs []error
	released := 0
	perHandle := map[string]map[netip.Prefix]int{}
	for _, cidr := range cidrs {
		if err := v.bad[cidr]; err != nil {
			errs = append(errs, fmt.Errorf("GC block %s: %w", cidr, err))
			continue
		}
		e := v.blocks[cidr]
		if e == nil {
			continue // the block is gone: nothing left to release
		}
		var ords []int
		for _, cd := range stale[cidr] {
			a := e.b.AttributeOf(cd.ord)
			if !ours(v.conf, a) || a.Handle() != cd.handle {
				continue
			}
			if seq, ok := e.b.SequenceOf(cd.ord); ok != cd.hasSeq || seq != cd.seq {
				continue // released and reallocated since the snapshot
			}
			ords = append(ords, cd.ord)
			if perHandle[cd.handle] == nil {
				perHandle[cd.handle] = map[netip.Prefix]int{}
			}
			perHandle[cd.handle][cidr]++
		}
		if len(ords) == 0 {
			continue
		}
		if err := e.edit().Release(ords...); err != nil {
			errs = append(errs, withCode(ErrDatastore, "GC block %s: %w", cidr, err))
			continue
		}
		e.dirty = true
		released += len(ords)
		v.did("GC releases stale allocations", "block", cidr, "count", len(ords))
	}
	for i, key := range handleKeys {
		counts, kv := perHandle[strings.TrimPrefix(key, calico.HandlePrefix)], handles[i]
		if len(counts) == 0 {
			continue
		}
		if kv == nil {
			// An allocation without its handle: released all the same; there is no count to fix.
			v.uses[key] = 0
			continue
		}
		hv, err := calico.DecodeHandle(kv.Value)
		if err != nil {
			return 0, nil, withCode(ErrDatastore, "%s: %w", key, err)
		}
		for cidr, n := range counts {
			hv.Remove(cidr, n)
		}
		v.uses[key], v.keyWrites[key] = kv.ModRevision, nil
		if len(hv.Block) > 0 {
			if v.keyWrites[key], err = calico.EncodeHandle(hv); err != nil {
				return 0, nil, err
			}
		}
	}
	return released, errs, nil
}

// ours reports whether an allocation is the request's node's on its network, written by block-ipam.
func ours(conf *cni.Request, a *calico.AllocationAttribute) bool {
	return a != nil && a.Secondary[AttrNetwork] == conf.Network && a.Secondary[calico.AttrNode] == conf.Node &&
		strings.HasPrefix(a.Handle(), conf.Network+".")
}

// gcError joins GC's errors into one CNI error, with the code of the first typed one (11 when they
// are all transient).
func gcError(errs []error) error {
	joined := errors.Join(errs...)
	te := toCNIError(errs[0])
	return &types.Error{Code: te.Code, Msg: "GC finished with errors: " + strings.ReplaceAll(joined.Error(), "\n", "; ")}
}
