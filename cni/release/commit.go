package release

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/cni/ipamd"
)

// ErrAborted: a transaction's conditions no longer held (something changed since the plan read it,
// or the node came back); nothing after it was attempted. A new plan picks up what is left.
var ErrAborted = errors.New("release aborted")

// Result is what a commit did. Every list holds only what committed.
type Result struct {
	Node   string    `json:"node"`
	At     time.Time `json:"at"`
	By     string    `json:"by,omitempty"`
	Forced bool      `json:"forced,omitempty"`
	// Alive are the signs of life a forced release went past.
	Alive             []Sign         `json:"alive,omitempty"`
	Released          []Allocation   `json:"released"`
	BlocksDeleted     []netip.Prefix `json:"blocks_deleted"`
	BlocksUnowned     []netip.Prefix `json:"blocks_unowned,omitempty"`
	BlocksUpdated     []netip.Prefix `json:"blocks_updated,omitempty"`
	AffinitiesDeleted []string       `json:"affinities_deleted"`
	HandlesDeleted    []string       `json:"handles_deleted,omitempty"`
	HandlesUpdated    []string       `json:"handles_updated,omitempty"`
	Skipped           []Skipped      `json:"skipped,omitempty"`
	Transactions      int            `json:"transactions"`
	// Aborted says why a transaction's conditions failed; Error the etcd error that stopped the
	// commit. Either means a rerun has work left.
	Aborted string `json:"aborted,omitempty"`
	Error   string `json:"error,omitempty"`
	// Record is the key of the record written, if any.
	Record string `json:"-"`
}

// Complete reports whether the commit released everything the plan named (skipped values aside).
func (r *Result) Complete() bool { return r.Aborted == "" && r.Error == "" }

// Done reports whether the commit changed anything.
func (r *Result) Done() bool { return r.Transactions > 0 }

// Commit releases what p names, each block (a chunk of it for a block whose handles do not fit in
// one transaction) in one transaction conditional on the mod revisions p read, of the block, its
// handles and the node's affinity key, and, unless forced, on the node still having neither liveness
// key nor registration. It stops at the first transaction whose conditions fail (ErrAborted) or that
// etcd does not answer; the Result holds what committed before. A plan whose node looks alive
// commits only with o.Force. When anything committed, a Record is written (best effort: its failure
// is returned only when nothing else failed).
func Commit(ctx context.Context, o Options, p *Plan) (*Result, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	if o.Node != p.Node {
		return nil, fmt.Errorf("release: plan of node %s, options of %s", p.Node, o.Node)
	}
	if len(p.Alive) > 0 && !o.Force {
		return nil, &AliveError{Node: p.Node, Signs: p.Alive}
	}
	r := &Result{Node: p.Node, At: time.Now().UTC(), By: o.By, Forced: o.Force && len(p.Alive) > 0, Skipped: p.Skipped}
	if r.Forced {
		r.Alive = p.Alive
	}
	err := commit(ctx, &o, p, r)
	if r.Done() {
		if rerr := writeRecord(ctx, &o, r); rerr != nil {
			o.Logger.Warn("release: write the release record", "node", p.Node, "err", rerr)
			if err == nil {
				err = rerr
			}
		}
	}
	return r, err
}

// guards are the conditions of every transaction: the node still looks dead (none when forced).
func (o *Options) guards() []clientv3.Cmp {
	if o.Force {
		return nil
	}
	return []clientv3.Cmp{
		clientv3.Compare(clientv3.Version(ipamd.AliveKey(o.Node)), "=", 0),
		clientv3.Compare(clientv3.Version(o.registrationPrefix()), "=", 0).WithPrefix(),
	}
}

// txn runs one transaction within CallTimeout; ok is false when its conditions failed.
func (o *Options) txn(ctx context.Context, cmps []clientv3.Cmp, ops []clientv3.Op) (rev int64, ok bool, err error) {
	cctx, cancel := context.WithTimeout(ctx, o.CallTimeout)
	defer cancel()
	resp, err := o.KV.Txn(cctx).If(cmps...).Then(ops...).Commit()
	if err != nil {
		return 0, false, err
	}
	return resp.Header.Revision, resp.Succeeded, nil
}

func commit(ctx context.Context, o *Options, p *Plan, r *Result) error {
	fail := func(what string, err error) error {
		r.Error = fmt.Sprintf("%s: %v", what, err)
		return fmt.Errorf("release node %s: %s: %w", p.Node, what, err)
	}
	for i := range p.Blocks {
		bp := &p.Blocks[i]
		for _, chunk := range chunks(bp) {
			last := chunk.last
			cmps := append(o.guards(), clientv3.Compare(clientv3.ModRevision(bp.Key), "=", bp.modRev))
			var ops []clientv3.Op
			var nb *calico.Block
			if bp.block != nil {
				nb = bp.block.Clone()
				if len(chunk.ords) > 0 {
					if err := nb.Release(chunk.ords...); err != nil {
						return fail("release in block "+bp.CIDR.String(), err)
					}
				}
			}
			switch {
			case last && bp.Action == BlockDelete:
				ops = append(ops, clientv3.OpDelete(bp.Key))
			case last && bp.Action == BlockUnown:
				nb.Affinity, nb.AffinityClaimTime = nil, nil
				fallthrough
			case nb != nil && (len(chunk.ords) > 0 || bp.Action == BlockUnown):
				nb.BumpSequence()
				v, err := calico.EncodeBlock(nb)
				if err != nil {
					return fail("encode block "+bp.CIDR.String(), err)
				}
				ops = append(ops, clientv3.OpPut(bp.Key, string(v)))
			}
			type hw struct {
				id  string
				h   *calico.Handle // nil: deleted
				put bool
			}
			var hws []hw
			for _, id := range chunk.handles {
				st := p.handles[id]
				cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(calico.HandleKey(id)), "=", st.modRev))
				if st.h == nil {
					continue // missing or malformed: left as it is
				}
				nh := &calico.Handle{Block: map[string]int{}}
				for k, v := range st.h.Block {
					nh.Block[k] = v
				}
				nh.Remove(bp.CIDR, chunk.count[id])
				if nh.Count() == 0 {
					ops = append(ops, clientv3.OpDelete(calico.HandleKey(id)))
					hws = append(hws, hw{id: id})
				} else {
					v, err := calico.EncodeHandle(nh)
					if err != nil {
						return fail("encode handle "+id, err)
					}
					ops = append(ops, clientv3.OpPut(calico.HandleKey(id), string(v)))
					hws = append(hws, hw{id: id, h: nh, put: true})
				}
			}
			if last && bp.AffinityKey != "" {
				cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(bp.AffinityKey), "=", bp.affinityModRev))
				ops = append(ops, clientv3.OpDelete(bp.AffinityKey))
			}
			if len(ops) == 0 {
				continue
			}
			rev, ok, err := o.txn(ctx, cmps, ops)
			if err != nil {
				return fail("transaction on block "+bp.CIDR.String(), err)
			}
			if !ok {
				return aborted(ctx, o, r, "block "+bp.CIDR.String())
			}
			r.Transactions++
			// What the next transaction compares with is what this one wrote.
			bp.modRev, bp.block = rev, nb
			for _, w := range hws {
				st := p.handles[w.id]
				if w.put {
					st.h, st.modRev = w.h, rev
					r.HandlesUpdated = appendOnce(r.HandlesUpdated, w.id)
				} else {
					st.h, st.modRev = nil, 0
					r.HandlesDeleted = append(r.HandlesDeleted, w.id)
				}
			}
			for _, ord := range chunk.ords {
				for _, a := range bp.Release {
					if a.Ordinal == ord {
						r.Released = append(r.Released, a)
					}
				}
			}
			if last {
				switch bp.Action {
				case BlockDelete:
					r.BlocksDeleted = append(r.BlocksDeleted, bp.CIDR)
				case BlockUnown:
					r.BlocksUnowned = append(r.BlocksUnowned, bp.CIDR)
				case BlockUpdate:
					r.BlocksUpdated = append(r.BlocksUpdated, bp.CIDR)
				}
				if bp.AffinityKey != "" {
					r.AffinitiesDeleted = append(r.AffinitiesDeleted, bp.AffinityKey)
				}
			}
			o.Logger.Debug("release: committed", "node", p.Node, "block", bp.CIDR, "released", len(chunk.ords), "revision", rev)
		}
	}
	for _, a := range p.Orphans {
		cmps := append(o.guards(),
			clientv3.Compare(clientv3.ModRevision(a.Key), "=", a.modRev),
			clientv3.Compare(clientv3.Version(calico.BlockKey(a.CIDR)), "=", 0))
		_, ok, err := o.txn(ctx, cmps, []clientv3.Op{clientv3.OpDelete(a.Key)})
		if err != nil {
			return fail("delete affinity "+a.Key, err)
		}
		if !ok {
			return aborted(ctx, o, r, "affinity "+a.Key)
		}
		r.Transactions++
		r.AffinitiesDeleted = append(r.AffinitiesDeleted, a.Key)
	}
	return nil
}

// aborted records why a transaction's conditions failed: the node came back, or something else
// changed what the plan read.
func aborted(ctx context.Context, o *Options, r *Result, what string) error {
	why := "changed since the plan read it (another release, or an IPAM operation): plan again"
	cctx, cancel := context.WithTimeout(ctx, o.CallTimeout)
	defer cancel()
	if !o.Force {
		for _, key := range []string{ipamd.AliveKey(o.Node), o.registrationPrefix()} {
			opts := []clientv3.OpOption{clientv3.WithKeysOnly(), clientv3.WithLimit(1)}
			if key == o.registrationPrefix() {
				opts = append(opts, clientv3.WithPrefix())
			}
			if resp, err := o.KV.Get(cctx, key, opts...); err == nil && len(resp.Kvs) > 0 {
				why = fmt.Sprintf("node %s came back (%s): not released", o.Node, resp.Kvs[0].Key)
				break
			}
		}
	}
	r.Aborted = what + ": " + why
	return fmt.Errorf("release node %s: %w at %s", o.Node, ErrAborted, r.Aborted)
}

func appendOnce(s []string, v string) []string {
	for _, x := range s {
		if x == v {
			return s
		}
	}
	return append(s, v)
}

// chunk is the part of a block's release one transaction carries: ordinals whose handles all fit.
type chunk struct {
	ords    []int
	handles []string
	count   map[string]int
	last    bool
}

// chunks splits a block's release so that each transaction's compares (2 guards, the block, the
// affinity key, one per handle) stay within maxTxnOps; a handle's ordinals stay in one chunk.
func chunks(bp *BlockPlan) []chunk {
	const perTxn = maxTxnOps - 4
	var out []chunk
	cur := chunk{count: map[string]int{}}
	byHandle := map[string][]int{}
	var order []string
	var noHandle []int
	for _, a := range bp.Release {
		if a.Handle == "" {
			noHandle = append(noHandle, a.Ordinal)
			continue
		}
		if _, ok := byHandle[a.Handle]; !ok {
			order = append(order, a.Handle)
		}
		byHandle[a.Handle] = append(byHandle[a.Handle], a.Ordinal)
	}
	cur.ords = noHandle
	for _, id := range order {
		if len(cur.handles) == perTxn {
			out = append(out, cur)
			cur = chunk{count: map[string]int{}}
		}
		cur.handles = append(cur.handles, id)
		cur.ords = append(cur.ords, byHandle[id]...)
		cur.count[id] = len(byHandle[id])
	}
	cur.last = true
	return append(out, cur)
}

// Record is the JSON value of a release record (RecordPrefix+<node>/<time>): the Result.
type Record = Result

// RecordKey is the key of a release record of node at t.
func RecordKey(node string, t time.Time) string {
	return RecordPrefix + node + "/" + t.UTC().Format("2006-01-02T15:04:05.000000000Z")
}

// writeRecord writes r under RecordKey on a lease of RecordTTL.
func writeRecord(ctx context.Context, o *Options, r *Result) error {
	v, err := json.Marshal(r)
	if err != nil {
		return err
	}
	key := RecordKey(r.Node, r.At)
	cctx, cancel := context.WithTimeout(ctx, o.CallTimeout)
	defer cancel()
	var opts []clientv3.OpOption
	if o.Client != nil {
		lease, err := o.Client.Grant(cctx, int64(RecordTTL/time.Second))
		if err != nil {
			return fmt.Errorf("grant the lease of %s: %w", key, err)
		}
		opts = append(opts, clientv3.WithLease(lease.ID))
	}
	// Created only if absent, like every other write: a record is never overwritten.
	resp, err := o.KV.Txn(cctx).If(clientv3.Compare(clientv3.Version(key), "=", 0)).Then(clientv3.OpPut(key, string(v), opts...)).Commit()
	if err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("put %s: a record with this key exists", key)
	}
	r.Record = key
	return nil
}
