package blockwatch

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// page is one list response of one prefix, or the end of the listing (last), or the error that ended it.
type page struct {
	src  source
	resp *clientv3.GetResponse
	// rev is the revision the page reflects (the response header's is etcd's current one).
	rev      int64
	received time.Time
	last     bool
	err      error
}

// minParallelDecode is the page length from which a page is decoded on several cores.
const minParallelDecode = 64

// list reads the watched prefixes at one revision into a fresh view, replaces the current view with it
// and returns the Full snapshot for watch to emit. On error the current view is left untouched. Block
// owners come from w.source; in OwnershipAuto, a list that finds the IPAM config asking for the other
// source switches w.source and fails with errOwnershipChanged.
// With at != 0 every page is read serializably at revision at, a request that etcd's gRPC proxy
// answers from its cache when another client sent the same one before.
//
// A goroutine fetches the pages (so that etcd serves the next page while this one is decoded); each
// page is decoded on all cores, then installed in key order.
func (w *Watcher) list(ctx context.Context, reason string, at int64) (*Snapshot, error) {
	started := time.Now()
	w.prefixes = w.prefixesFor(w.source)
	lctx, cancel := context.WithCancel(ctx)
	pages := make(chan page, 1)
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(pages)
		w.fetch(lctx, pages, at)
	})
	defer wg.Wait()
	defer cancel()

	prev := w.view
	first := prev == nil // its parts go out on Listing
	if first {
		prev = newCache()
	}
	// Last good values survive a relist only from a view of the same ownership source: the revisions
	// of affinity keys say nothing of block keys.
	lastGood := prev
	if prev.ownership != w.source {
		lastGood = newCache()
	}
	next := newCache()
	next.ownership = w.source
	var received time.Time
	total := 0 // the number of block (or affinity) keys etcd counted with their first page
	complete := false
	for p := range pages {
		if p.err != nil {
			return nil, p.err
		}
		if p.last {
			complete = true
			break
		}
		if next.rev == 0 {
			next.rev, received = p.rev, p.received
		}
		if (p.src == srcBlocks || p.src == srcAffinities) && total == 0 {
			// etcd counts the whole range with the first page: room for every block at once.
			total = int(p.resp.Count)
			next.grow(total)
		}
		var listed []*Block
		for _, d := range w.decodePage(p) {
			w.install(next, lastGood, &d, nil)
			if first && d.src == srcBlocks && d.keyErr == nil {
				if b, ok := next.blocks.get(d.cidr); ok {
					listed = append(listed, b)
				}
			}
		}
		if len(listed) > 0 {
			w.emitListed(next, listed, total)
		}
	}
	if !complete {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("list: %w", err)
		}
		return nil, errors.New("list: incomplete")
	}
	if w.cfg.Ownership == OwnershipAuto {
		if want := next.ipam.want(w.source); want != w.source {
			w.source = want
			return nil, errOwnershipChanged
		}
	}
	ch := changes{received: received}
	if first {
		// Nothing to diff against: everything is new, and the consumer builds its state from the
		// whole view (and the parts it was handed) anyway.
		ch.pools, ch.tunnel = len(next.pools) > 0, true
	} else {
		next.diff(prev, &ch)
	}
	w.view = next
	w.metrics.setOwnership(next.ownership)
	if p := next.problem(); p != "" {
		w.log.Warn(p)
	}
	full := next.snapshot(&ch, true, reason)
	w.metrics.relist(reason)
	w.log.Info("listed etcd", "reason", reason, "revision", next.rev, "ownership", next.ownership, "blocks", next.blocks.n,
		"peers", len(next.peers), "pools", len(next.pools), "nodes", len(next.nodes), "changed_blocks", len(ch.blocks),
		"duration", time.Since(started).Round(time.Millisecond))
	return full, nil
}

// fetch sends the pages of the watched prefixes to out, all read at revision at (if not 0: serializably)
// or else at the revision of the first one, then a last page; or the error that stopped it. It
// returns early when ctx ends. The pools, peers, Nodes and FelixConfigurations come first, so that a
// listed block's routes can be known as soon as it is (Listing).
func (w *Watcher) fetch(ctx context.Context, out chan<- page, at int64) {
	send := func(p page) bool {
		select {
		case out <- p:
			return true
		case <-ctx.Done():
			return false
		}
	}
	rev := at
	// The IPAM config first (it names the ownership source), then what a block's routes depend on:
	// pools, peers, Nodes and FelixConfigurations.
	for _, src := range [...]source{srcIPAMConfig, srcPools, srcHosts, srcNodes, srcFelixConfigs, srcBlocks, srcAffinities} {
		prefix := w.prefixes[src]
		if prefix == "" {
			continue
		}
		key, end := keyRange(src, prefix)
		for n := 0; ; n++ {
			opts := []clientv3.OpOption{
				clientv3.WithRange(end), clientv3.WithLimit(w.cfg.PageSize),
				clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend),
			}
			if rev != 0 {
				// Serializable: what a revision holds never changes, and a member that has not applied
				// it yet says so (ErrFutureRev, and the list starts over); a linearizable read would
				// first wait for the leader to confirm the member's applied index, page after page.
				opts = append(opts, clientv3.WithRev(rev), clientv3.WithSerializable())
			}
			rctx, cancel := context.WithTimeout(ctx, w.cfg.RequestTimeout)
			resp, err := w.cfg.Client.Get(rctx, key, opts...)
			cancel()
			if err != nil {
				if rev == 0 {
					err = fmt.Errorf("list %s: %w", prefix, err)
				} else {
					err = fmt.Errorf("list %s at revision %d: %w", prefix, rev, err)
				}
				send(page{err: err})
				return
			}
			if rev == 0 {
				rev = resp.Header.Revision
			}
			if !send(page{src: src, resp: resp, rev: rev, received: time.Now()}) {
				return
			}
			if w.testHookPage != nil {
				w.testHookPage(src, n)
			}
			if !resp.More || len(resp.Kvs) == 0 {
				break
			}
			key = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
		}
	}
	send(page{last: true})
}

// decodePage decodes a page's keys and values, in order, on up to GOMAXPROCS goroutines.
func (w *Watcher) decodePage(p page) []decoded {
	kvs := p.resp.Kvs
	out := make([]decoded, len(kvs))
	workers := min(runtime.GOMAXPROCS(0), len(kvs)/minParallelDecode+1)
	chunk := (len(kvs) + workers - 1) / workers
	var wg sync.WaitGroup
	for i := 0; i < len(kvs); i += chunk {
		part, res := kvs[i:min(i+chunk, len(kvs))], out[i:min(i+chunk, len(kvs))]
		wg.Go(func() {
			for j, kv := range part {
				res[j] = w.decode(p.src, kv, false)
			}
		})
	}
	wg.Wait()
	return out
}
