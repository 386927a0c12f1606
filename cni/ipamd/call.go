package ipamd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/cni"
	"github.com/vpp-route-agent/vpp-route-agent/internal/backoff"
	"github.com/vpp-route-agent/vpp-route-agent/internal/netaddr"
)

// Secondary attribute keys block-ipam writes besides Calico's namespace, pod, node and timestamp.
const (
	// AttrIfname is the container interface an address belongs to: Calico's handle is per container,
	// so two interfaces of one container on one network share it and are told apart by this key. An
	// allocation without it (written by calico-ipam) belongs to "eth0".
	AttrIfname = "ifname"
	// AttrNetwork is the CNI network name, so that GC recognises its own allocations exactly even
	// when one network's name is a dotted prefix of another's.
	AttrNetwork = "network"
	// defaultIfname is the interface of allocations that carry no AttrIfname.
	defaultIfname = "eth0"
)

// maxAttempts bounds the retries of one operation (Calico allows 100); the deadline usually ends
// them first.
const maxAttempts = 100

// call is one operation of the daemon: its request (Node is the daemon's), the etcd store, the
// node state and what the operation read besides it. It runs on the state goroutine only.
type call struct {
	conf  *cni.Request
	etcd  *etcdClient
	state *nodeState
	log   *slog.Logger
	pause func(context.Context)
	// endpoints names etcd in messages (redacted).
	endpoints string
	// read is what the operation read besides the state.
	read opRead
	// attempts counts the optimistic attempts of the operation (1 when no race was lost);
	// roundTrips its etcd round trips.
	attempts   int
	roundTrips int64
	// claims counts the blocks this operation claimed; outside the blocks outside every pool it
	// found first in the daemon's life.
	claims, outside int
	// answer replies to a request of the batch before the operation ends (nil: at its end).
	answer func(*request)
	// down, when set, says why etcd cannot serve now (nil when it may): retry gives up at once.
	down func() error
}

// opRead is what an operation read besides the node state: keys (its handle, and those GC and a
// release ask for; nil: absent), blocks that are not the node's (decoded; nil: absent, or in bad),
// block listings and whole families of blocks; fresh once it has read every source of the state
// (then the state holds them at a revision no older than the operation).
type opRead struct {
	keys     map[string]*kv
	blocks   map[netip.Prefix]*blockEntry
	bad      map[netip.Prefix]error
	listings [2]*listing
	family   [2]bool
	fresh    bool
}

// maxNeeds bounds the reads one decision may ask for before it is taken.
const maxNeeds = 6

// decide runs f, a pure decision, on a view of the state, reading first what the state lacks (with
// handleID's handle) and then what f says it needs, until it needs nothing more. f only changes the
// view.
func (c *call) decide(ctx context.Context, handleID string, f func(*view) error) (*view, error) {
	for range maxNeeds {
		if err := c.sync(ctx, handleID); err != nil {
			return nil, err
		}
		v := newView(c.state, c.conf, &c.read)
		err := f(v)
		var n *needs
		if !errors.As(err, &n) {
			return v, err
		}
		if err := c.fetch(ctx, n); err != nil {
			return nil, err
		}
	}
	return nil, withCode(ErrDatastore, "the datastore kept changing under %d reads", maxNeeds)
}

// fetch reads what n names, in one round trip (one more per maxTxnOps blocks).
func (c *call) fetch(ctx context.Context, n *needs) error {
	for {
		ops, rest := c.readOps(n)
		res, err := c.txn(ctx, nil, ops, nil)
		if err != nil {
			return fmt.Errorf("read ipam state of node %s: %w", c.conf.Node, err)
		}
		if err := c.applyReads(n, res); err != nil {
			return err
		}
		if len(rest) == 0 {
			return nil
		}
		n = &needs{blocks: rest}
	}
}

// readOps returns the reads of n that fit in one transaction: its keys, every source of the state
// (n.sources), the family listings (keys only) or whole families, and as many of its blocks as fit;
// rest are the blocks left out.
func (c *call) readOps(n *needs) (ops []op, rest []netip.Prefix) {
	for _, k := range n.keys {
		ops = append(ops, getOp(k))
	}
	for src := range numSources {
		if !n.sources {
			break
		}
		if k, prefix := c.state.key(src); prefix {
			ops = append(ops, prefixOp(k, false))
		} else {
			ops = append(ops, getOp(k))
		}
	}
	for _, f := range []netaddr.Family{netaddr.V4, netaddr.V6} {
		if n.listing[f] || n.family[f] {
			ops = append(ops, prefixOp(calico.BlockPrefix+f.String()+"/block/", !n.family[f]))
		}
	}
	fit := min(len(n.blocks), max(0, maxTxnOps-len(ops)))
	for _, cidr := range n.blocks[:fit] {
		ops = append(ops, getOp(calico.BlockKey(cidr)))
	}
	return ops, n.blocks[fit:]
}

// applyReads applies the answer to readOps(n) (a read, or a failed write's failure branch).
func (c *call) applyReads(n *needs, res *txnResult) error {
	ops, rest := c.readOps(n)
	if len(res.Ranges) != len(ops) {
		return withCode(ErrDatastore, "etcd answered %d reads of %d", len(res.Ranges), len(ops))
	}
	ranges := res.Ranges
	if c.read.keys == nil {
		c.read.keys = map[string]*kv{}
	}
	for i, k := range n.keys {
		c.read.keys[k] = first(ranges[i])
	}
	ranges = ranges[len(n.keys):]
	if n.sources {
		for src := range numSources {
			c.state.replace(src, ranges[src], res.Revision)
		}
		ranges = ranges[numSources:]
		// Listings are as old as the decision that lost: read them again if needed.
		c.read.listings, c.read.family, c.read.fresh = [2]*listing{}, [2]bool{}, true
	}
	for _, f := range []netaddr.Family{netaddr.V4, netaddr.V6} {
		if !n.listing[f] && !n.family[f] {
			continue
		}
		if n.family[f] {
			// The family read again: a block of it read before and deleted since is gone.
			for cidr := range c.read.blocks {
				if netaddr.FamilyOf(cidr.Addr()) == f {
					delete(c.read.blocks, cidr)
					delete(c.read.bad, cidr)
				}
			}
		}
		l := &listing{rev: res.Revision}
		for i := range ranges[0] {
			kv := &ranges[0][i]
			k, err := calico.ParseKey(kv.Key)
			if err != nil || k.Kind != calico.KindBlock {
				c.log.Warn("ignoring foreign key under the block prefix", "key", kv.Key)
				continue
			}
			if c.outsidePools(k.CIDR) {
				// Calico's claim walk looks only for its own subnets' keys: a block outside every pool
				// (a stray 0.0.0.0/0) takes no subnet of any pool, and must not stop every claim.
				continue
			}
			l.cidrs = append(l.cidrs, k.CIDR)
			if n.family[f] {
				c.gotBlock(k.CIDR, kv, res.Revision)
			}
		}
		c.read.listings[f] = l
		c.read.family[f] = c.read.family[f] || n.family[f]
		ranges = ranges[1:]
	}
	for i, cidr := range n.blocks[:len(n.blocks)-len(rest)] {
		c.gotBlock(cidr, first(ranges[i]), res.Revision)
	}
	return nil
}

// outsidePools reports whether a listed block lies outside every IP pool and every pool CIDR the
// request names: claims ignore it. Each such block is logged once in the daemon's life and counted
// (c.outside).
func (c *call) outsidePools(cidr netip.Prefix) bool {
	if inPools(cidr, c.state.pools) {
		return false
	}
	for _, ref := range c.conf.Pools[netaddr.FamilyOf(cidr.Addr())] {
		if ref.CIDR.IsValid() && netaddr.Covers(ref.CIDR, cidr) {
			return false
		}
	}
	if c.state.noteOutside(cidr) {
		c.outside++
		c.log.Warn("ignoring a block outside every IP pool: claims do not avoid it, as Calico's do not", "block", cidr)
	}
	return true
}

// first returns the pair a read of one key found, nil when none.
func first(kvs []kv) *kv {
	if len(kvs) == 0 {
		return nil
	}
	return &kvs[0]
}

// gotBlock records a block read at rev (v nil: absent): the state's when it is one of the node's
// affinities, else the operation's, decoded.
func (c *call) gotBlock(cidr netip.Prefix, v *kv, rev int64) {
	if _, ok := c.state.affinity[cidr]; ok {
		c.state.setBlock(cidr, v, rev)
		return
	}
	if c.read.blocks == nil {
		c.read.blocks, c.read.bad = map[netip.Prefix]*blockEntry{}, map[netip.Prefix]error{}
	}
	delete(c.read.bad, cidr)
	c.read.blocks[cidr] = nil
	if v == nil {
		return
	}
	e, err := decodeBlockKV(cidr, *v)
	if err != nil {
		c.read.bad[cidr] = err
		return
	}
	c.read.blocks[cidr] = e
}

// write sends the plan of a view, conditional as writes() says. A transaction that was sent is
// waited for even when the plugin hangs up, so that what it did is applied to the state, but not past
// the operation's deadline (one it did not see commit reaches the state through its followers). When
// the conditions fail, the same transaction reads the state's sources, the handles and the view's
// blocks instead; write applies that and returns errConflict.
func (c *call) write(ctx context.Context, v *view) error {
	p, err := v.writes()
	if err != nil {
		return err
	}
	blocks := slices.SortedFunc(maps.Keys(v.blocks), netip.Prefix.Compare)
	// The failure branch reads the handles and the keys read that this plan compares or writes, not
	// everything the operation ever read: GC's chunks share one call, and its reads would add up.
	var keys []string
	for k := range c.read.keys {
		_, used := v.uses[k]
		_, written := p.keys[k]
		if used || written {
			keys = append(keys, k)
		}
	}
	for _, r := range v.handles {
		if k := calico.HandleKey(r.handle); !slices.Contains(keys, k) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	what := fmt.Sprintf("write %d blocks and %d other keys", len(p.blocks), len(p.keys))
	reread := &needs{keys: keys, sources: true, blocks: blocks}
	failure, _ := c.readOps(reread)
	if n := max(len(p.cmps), len(p.ops), len(failure)); n > maxTxnOps {
		return fmt.Errorf("%s: %w (%d operations)", what, errTooLarge, n)
	}
	if c.pause != nil {
		c.pause(ctx)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	// Not cancelled when the plugin hangs up, but bounded by the operation's deadline: the reply must
	// reach the plugin before its own timeout (the deadline leaves it a tenth of it).
	wctx := context.WithoutCancel(ctx)
	if d, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		wctx, cancel = context.WithDeadline(wctx, d)
		defer cancel()
	}
	res, err := c.txn(wctx, p.cmps, p.ops, failure)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if !res.Succeeded {
		if err := c.applyReads(reread, res); err != nil {
			return err
		}
		return errConflict
	}
	c.state.committed(p, res.Revision)
	c.claims += p.claims
	defer c.logActions(v)
	// What the operation read is now as written.
	for cidr, e := range p.blocks {
		var w *blockEntry
		if e == nil {
			v.blocks[cidr] = nil
			v.did("deleted an empty block (no affinity, or its pool no longer selects its node)", "block", cidr)
		} else {
			e.rev, e.dirty, e.created = res.Revision, false, false
			w = &blockEntry{b: e.b, rev: e.rev}
		}
		if _, ok := c.read.blocks[cidr]; ok {
			c.read.blocks[cidr] = w
		}
	}
	for k, val := range p.keys {
		if _, ok := c.read.keys[k]; ok {
			c.read.keys[k] = nil
			if val != nil {
				c.read.keys[k] = &kv{Key: k, Value: val, ModRevision: res.Revision}
			}
		}
	}
	return nil
}

// retry runs attempt until it succeeds, fails for good, or the deadline or maxAttempts ends it. Lost
// races (errConflict) and an unreachable etcd (errUnavailable) are retried after a capped, jittered
// exponential backoff (the project's one); running out returns an error that maps to CNI code 11.
// c.attempts counts the attempts of every retry of the operation.
func (c *call) retry(ctx context.Context, what string, attempt func(context.Context) error) error {
	bo := backoff.Backoff{Base: 2 * time.Millisecond, Max: 250 * time.Millisecond}
	var last error
	for n := 1; n <= maxAttempts; n++ {
		c.attempts++
		err := attempt(ctx)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil && last != nil {
			// The deadline ended an attempt after races were lost: say so, not only that a write ran out of time.
			return fmt.Errorf("%s: gave up after %d attempts (%w): %w (last lost: %w)", what, n, ctx.Err(), err, last)
		}
		if !errors.Is(err, errConflict) && !errors.Is(err, errUnavailable) {
			return err
		}
		last = err
		if c.down != nil {
			if derr := c.down(); derr != nil {
				return fmt.Errorf("%s: gave up after %d attempts: %w (last: %w)", what, n, derr, last)
			}
		}
		c.log.Debug("retrying", "what", what, "attempt", n, "err", err)
		if !bo.Wait(ctx) {
			return fmt.Errorf("%s: gave up after %d attempts (%w): %w", what, n, ctx.Err(), last)
		}
	}
	return fmt.Errorf("%s: gave up after %d attempts: %w", what, maxAttempts, last)
}

// txn runs one transaction, counting it as a round trip of this operation.
func (c *call) txn(ctx context.Context, cmps []compare, success, failure []op) (*txnResult, error) {
	c.roundTrips++
	return c.etcd.txn(ctx, cmps, success, failure)
}

// handleID is Calico's handle for a container on a network: "<network>.<containerID>".
func handleID(network, containerID string) string { return network + "." + containerID }

// ifnameOf returns the interface an allocation belongs to.
func ifnameOf(a *calico.AllocationAttribute) string {
	if n := a.Secondary[AttrIfname]; n != "" {
		return n
	}
	return defaultIfname
}

// attribute is the allocation attribute of an ADD: Calico's handle and secondary attributes plus
// the interface and network.
func attribute(conf *cni.Request, handle, ifname string) calico.AllocationAttribute {
	sec := map[string]string{
		calico.AttrNode:      conf.Node,
		calico.AttrTimestamp: time.Now().UTC().String(),
		AttrIfname:           ifname,
		AttrNetwork:          conf.Network,
	}
	if conf.Namespace != "" {
		sec[calico.AttrNamespace] = conf.Namespace
	}
	if conf.Pod != "" {
		sec[calico.AttrPod] = conf.Pod
	}
	return calico.AllocationAttribute{HandleID: &handle, Secondary: sec}
}

// held returns the addresses of this (handle, ifname) in the blocks the handle lists (which must be
// loaded), IPv4 first.
func (v *view) held(handle, ifname string) []allocation {
	var out []allocation
	for _, cidr := range handleBlocks(v.handle) {
		e := v.blocks[cidr]
		if e == nil {
			continue
		}
		for _, ord := range e.b.Ordinals(func(a *calico.AllocationAttribute) bool {
			return a.HeldBy(handle) && ifnameOf(a) == ifname
		}) {
			addr, _ := calico.OrdinalAddr(e.b.CIDR, ord)
			out = append(out, allocation{Block: e.b.CIDR, Addr: addr})
		}
	}
	sortAllocations(out)
	return out
}

func sortAllocations(a []allocation) {
	slices.SortFunc(a, func(x, y allocation) int { return x.Addr.Compare(y.Addr) })
}

// handleBlocks returns the block CIDRs a handle lists.
func handleBlocks(h *calico.Handle) []netip.Prefix {
	if h == nil {
		return nil
	}
	var out []netip.Prefix
	for k := range h.Block {
		if p, err := netip.ParsePrefix(k); err == nil {
			out = append(out, netaddr.Canonical(p))
		}
	}
	return out
}

// logActions logs what the decision of v did; its write has committed.
func (c *call) logActions(v *view) {
	for _, a := range v.actions {
		c.log.Log(context.Background(), a.level, a.msg, a.args...)
	}
}
