package ipamd

import (
	"context"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/internal/backoff"
)

// kvEvent is one change of a key at revision Rev (a deletion when Deleted).
type kvEvent struct {
	KV      kv
	Rev     int64
	Deleted bool
}

// update is what a follower hands the state goroutine: a read of its key or prefix at Rev (Snapshot),
// or the changes one watch response carried.
type update struct {
	src      source
	block    netip.Prefix // set for a block's follower (src unused)
	snapshot bool
	kvs      []kv // snapshot
	rev      int64
	events   []kvEvent
}

// follower keeps one key or prefix of the datastore flowing into the state goroutine: read it at R,
// watch it from R+1 (requiring a leader), and on any watch error, compaction, cancellation or close,
// read it again after a capped backoff. etcd's client resumes a watch across reconnects by itself;
// what it cannot resume ends the watch, and the read after it makes up for anything missed.
type follower struct {
	cli     *clientv3.Client
	timeout time.Duration
	log     *slog.Logger
	out     chan<- update
}

// run follows key (a prefix when prefix) until ctx is done, tagging its updates with tag.
func (f *follower) run(ctx context.Context, key string, prefix bool, tag update) {
	bo := backoff.Backoff{Base: 100 * time.Millisecond, Max: 5 * time.Second}
	var opts []clientv3.OpOption
	if prefix {
		opts = append(opts, clientv3.WithPrefix())
	}
	for ctx.Err() == nil {
		if f.follow(ctx, key, opts, tag) {
			bo.Reset()
		}
		if !bo.Wait(ctx) {
			return
		}
	}
}

// follow reads key once and watches it until the watch ends; it reports whether it got as far as
// watching.
func (f *follower) follow(ctx context.Context, key string, opts []clientv3.OpOption, tag update) bool {
	rctx, cancel := context.WithTimeout(ctx, f.timeout)
	resp, err := f.cli.Get(rctx, key, opts...)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			f.log.Debug("follower: read failed", "key", key, "err", err)
		}
		return false
	}
	snap := tag
	snap.snapshot, snap.rev, snap.kvs = true, resp.Header.Revision, kvsOf(resp.Kvs)
	if !f.send(ctx, snap) {
		return false
	}
	wctx, stop := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer stop()
	for wr := range f.cli.Watch(wctx, key, append(opts, clientv3.WithRev(resp.Header.Revision+1))...) {
		if err := wr.Err(); err != nil || wr.Canceled {
			if ctx.Err() == nil {
				f.log.Debug("follower: watch ended; reading again", "key", key, "err", err, "compact_revision", wr.CompactRevision)
			}
			return true
		}
		if len(wr.Events) == 0 {
			continue
		}
		u := tag
		for _, ev := range wr.Events {
			u.events = append(u.events, kvEvent{KV: kvOf(ev.Kv), Rev: ev.Kv.ModRevision, Deleted: ev.Type == clientv3.EventTypeDelete})
		}
		if !f.send(ctx, u) {
			return true
		}
	}
	return true
}

func (f *follower) send(ctx context.Context, u update) bool {
	select {
	case f.out <- u:
		return true
	case <-ctx.Done():
		return false
	}
}

// followers runs the state's followers: one per source from start, and one per block of the node's
// affinities, started and stopped as the affinities change (a node has a handful of blocks: watching
// each one's key costs nothing on the shared watch stream, where a watch of the block prefix would
// carry every allocation of the cluster to every node).
type followers struct {
	f      follower
	wg     sync.WaitGroup
	blocks map[netip.Prefix]context.CancelFunc
}

// start starts the source followers under ctx.
func (fs *followers) start(ctx context.Context, s *nodeState) {
	fs.blocks = map[netip.Prefix]context.CancelFunc{}
	for src := range numSources {
		key, prefix := s.key(src)
		fs.spawn(ctx, key, prefix, update{src: src})
	}
}

func (fs *followers) spawn(ctx context.Context, key string, prefix bool, tag update) {
	fs.wg.Add(1)
	go func() {
		defer fs.wg.Done()
		fs.f.run(ctx, key, prefix, tag)
	}()
}

// reconcile follows exactly the blocks of the state's affinities.
func (fs *followers) reconcile(ctx context.Context, s *nodeState) {
	if fs.blocks == nil || ctx.Err() != nil {
		return
	}
	for cidr, stop := range fs.blocks {
		if _, ok := s.affinity[cidr]; !ok {
			stop()
			delete(fs.blocks, cidr)
		}
	}
	for cidr := range s.affinity {
		if _, ok := fs.blocks[cidr]; !ok {
			bctx, stop := context.WithCancel(ctx)
			fs.blocks[cidr] = stop
			fs.spawn(bctx, calico.BlockKey(cidr), false, update{block: cidr})
		}
	}
}

// wait stops every block follower and waits for all of them (the source followers stop with the
// context start was given).
func (fs *followers) wait() {
	for _, stop := range fs.blocks {
		stop()
	}
	fs.wg.Wait()
}

// apply hands an update to the state.
func (s *nodeState) apply(u update) {
	if u.block.IsValid() {
		if u.snapshot {
			var v *kv
			if len(u.kvs) == 1 {
				v = &u.kvs[0]
			}
			s.setBlock(u.block, v, u.rev)
			return
		}
		for _, e := range u.events {
			if e.Deleted {
				s.setBlock(u.block, nil, e.Rev)
			} else {
				s.setBlock(u.block, &e.KV, e.Rev)
			}
		}
		return
	}
	if u.snapshot {
		s.replace(u.src, u.kvs, u.rev)
		return
	}
	s.event(u.src, u.events)
}
