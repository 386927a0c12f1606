package ipamd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/cni"
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
	// attempts counts the optimistic attempts of the operation (1 when no race was lost; 0 when
	// another ADD's write served this one); roundTrips its etcd round trips.
	attempts   int
	roundTrips int64
	// batched counts the other ADDs this one served in its write.
	batched int
	// waiting are ADDs queued behind this one that its write may serve.
	waiting []*batchRequest
	// claims counts the blocks this operation claimed.
	claims int
}

// opRead is what an operation read besides the node state: its handle, blocks that are not the
// node's (nil: absent), block listings and whole families of blocks.
type opRead struct {
	// handleRead: the handle was read, as handleKV (nil: absent), decoded as handle (nil: absent or
	// soft-deleted).
	handleRead bool
	handleKV   *kv
	handle     *calico.Handle
	blocks     map[netip.Prefix]*kv
	listings   [2]*listing
	family     [2]bool
	// keys are other keys read (nil: absent).
	keys map[string]*kv
}

// maxNeeds bounds the reads one decision may ask for before it is taken.
const maxNeeds = 6

// decide takes decision on a view of the state, reading first what the state lacks and then what
// the decision says it needs, until it needs nothing more. The decision only changes the view.
func (c *call) decide(ctx context.Context, handleID string, decision func(*view) error) (*view, error) {
	for range maxNeeds {
		if err := c.sync(ctx, handleID); err != nil {
			return nil, err
		}
		v := c.newView(handleID)
		err := decision(v)
		var n *needs
		if !errors.As(err, &n) {
			return v, err
		}
		if err := c.fetch(ctx, handleID, n); err != nil {
			return nil, err
		}
	}
	return nil, withCode(ErrDatastore, "the datastore kept changing under %d reads", maxNeeds)
}

// sync reads what the state has not received from its followers yet: every source (with the handle,
// in the same round trip), then the blocks of new affinities. None in steady state.
func (c *call) sync(ctx context.Context, handleID string) error {
	s := c.state
	if !s.allListed() {
		blocks := slices.Collect(maps.Keys(s.blocks))
		res, err := c.txn(ctx, nil, s.refreshOps(handleID, blocks), nil)
		if err != nil {
			return fmt.Errorf("read ipam state of node %s: %w", c.conf.Node, err)
		}
		if err := c.refreshed(handleID, blocks, res); err != nil {
			return err
		}
	}
	if m := s.missingBlocks(); len(m) > 0 {
		return c.fetch(ctx, handleID, &needs{blocks: m})
	}
	return nil
}

// newView returns a view of the state and of what the operation read.
func (c *call) newView(handleID string) *view {
	return newView(c.state, c.conf, c.log, &c.read, handleID)
}

// refreshed applies the answer to the state's refreshOps (a read, or a failed write's failure branch).
func (c *call) refreshed(handleID string, blocks []netip.Prefix, res *txnResult) error {
	hkv, others, err := c.state.refreshed(handleID, blocks, res.Ranges, res.Revision)
	if err != nil {
		return err
	}
	if handleID != "" {
		if err := c.setHandle(handleID, hkv); err != nil {
			return err
		}
	}
	if c.read.blocks == nil {
		c.read.blocks = map[netip.Prefix]*kv{}
	}
	maps.Copy(c.read.blocks, others)
	// Listings are as old as the decision that lost: read them again if needed.
	c.read.listings, c.read.family = [2]*listing{}, [2]bool{}
	return nil
}

// setHandle records the handle as read (nil: absent).
func (c *call) setHandle(handleID string, hkv *kv) error {
	c.read.handleRead, c.read.handleKV, c.read.handle = true, hkv, nil
	if hkv == nil {
		return nil
	}
	h, err := calico.DecodeHandle(hkv.Value)
	if err != nil {
		return withCode(ErrDatastore, "handle %s: %w", handleID, err)
	}
	if !h.Deleted {
		c.read.handle = h
	}
	return nil
}

// fetch reads what a decision needs, in one round trip (one per maxTxnOps blocks).
func (c *call) fetch(ctx context.Context, handleID string, n *needs) error {
	var ops []op
	if n.handle {
		ops = append(ops, getOp(calico.HandleKey(handleID)))
	}
	for _, f := range []Family{V4, V6} {
		if n.listing[f] || n.family[f] {
			ops = append(ops, prefixOp(calico.BlockPrefix+f.String()+"/block/", !n.family[f]))
		}
	}
	for _, k := range n.keys {
		ops = append(ops, getOp(k))
	}
	blocks := n.blocks
	for {
		chunk := blocks[:min(len(blocks), maxTxnOps-len(ops))]
		blocks = blocks[len(chunk):]
		for _, cidr := range chunk {
			ops = append(ops, getOp(calico.BlockKey(cidr)))
		}
		res, err := c.txn(ctx, nil, ops, nil)
		if err != nil {
			return fmt.Errorf("read ipam state of node %s: %w", c.conf.Node, err)
		}
		if len(res.Ranges) != len(ops) {
			return withCode(ErrDatastore, "etcd answered %d reads of %d", len(res.Ranges), len(ops))
		}
		if c.read.blocks == nil {
			c.read.blocks = map[netip.Prefix]*kv{}
		}
		ranges := res.Ranges
		if n.handle {
			var hkv *kv
			if len(ranges[0]) == 1 {
				hkv = &ranges[0][0]
			}
			if err := c.setHandle(handleID, hkv); err != nil {
				return err
			}
			ranges, n.handle = ranges[1:], false
		}
		for _, f := range []Family{V4, V6} {
			if !n.listing[f] && !n.family[f] {
				continue
			}
			l := &listing{rev: res.Revision}
			for i := range ranges[0] {
				kv := &ranges[0][i]
				k, err := calico.ParseKey(kv.Key)
				if err != nil || k.Kind != calico.KindBlock {
					c.log.Warn("ignoring foreign key under the block prefix", "key", kv.Key)
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
			n.listing[f], n.family[f] = false, false
		}
		if c.read.keys == nil {
			c.read.keys = map[string]*kv{}
		}
		for i, k := range n.keys {
			c.read.keys[k] = nil
			if len(ranges[i]) == 1 {
				c.read.keys[k] = &ranges[i][0]
			}
		}
		ranges, n.keys = ranges[len(n.keys):], nil
		for i, cidr := range chunk {
			var v *kv
			if len(ranges[i]) == 1 {
				v = &ranges[i][0]
			}
			c.gotBlock(cidr, v, res.Revision)
		}
		if len(blocks) == 0 {
			return nil
		}
		ops = ops[:0]
	}
}

// gotBlock records a block read at rev: the state's when it is one of the node's affinities, else the
// operation's.
func (c *call) gotBlock(cidr netip.Prefix, v *kv, rev int64) {
	if _, ok := c.state.affinity[cidr]; ok {
		c.state.setBlock(cidr, v, rev)
		return
	}
	c.read.blocks[cidr] = v
}

// write sends the plan of a view, conditional as writes() says. A transaction that was sent is
// waited for even when the operation is cancelled, so that what it did is applied to the state. When
// the conditions fail, the same transaction reads the state's sources, the handle and the view's
// blocks instead; write applies that and returns errConflict.
func (c *call) write(ctx context.Context, v *view, newHandle *calico.Handle) (*plan, error) {
	p, err := v.writes(newHandle)
	if err != nil {
		return nil, err
	}
	if c.pause != nil {
		c.pause(ctx)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("write %s: %w", v.handleID, err)
	}
	blocks := slices.Collect(maps.Keys(v.blocks))
	slices.SortFunc(blocks, comparePrefix)
	res, err := c.txn(context.WithoutCancel(ctx), p.cmps, p.ops, c.state.refreshOps(v.handleID, blocks))
	if err != nil {
		return nil, fmt.Errorf("write %d blocks and handle %s: %w", len(p.blocks), v.handleID, err)
	}
	if !res.Succeeded {
		if err := c.refreshed(v.handleID, blocks, res); err != nil {
			return nil, err
		}
		return nil, errConflict
	}
	c.state.committed(p, res.Revision)
	c.claims += p.claims
	for cidr, e := range p.blocks {
		if _, ok := c.read.blocks[cidr]; ok {
			c.read.blocks[cidr] = nil
		}
		if e == nil {
			v.blocks[cidr] = nil
			v.log.Info("deleted an empty block (no affinity, or its pool no longer selects its node)", "block", cidr)
			continue
		}
		e.rev, e.dirty, e.created = res.Revision, false, false
		if _, ok := c.read.blocks[cidr]; ok {
			c.read.blocks[cidr] = &kv{Key: calico.BlockKey(cidr), Value: e.encoded, ModRevision: res.Revision}
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
	return p, nil
}

// retry runs attempt until it succeeds, fails for good, or the deadline or maxAttempts ends it. Lost
// races (errConflict) and an unreachable etcd (errUnavailable) are retried after a capped, jittered
// exponential backoff; running out returns an error that maps to CNI code 11.
func (c *call) retry(ctx context.Context, what string, attempt func(context.Context) error) error {
	backoff := 2 * time.Millisecond
	var last error
	for c.attempts = 1; c.attempts <= maxAttempts; c.attempts++ {
		err := attempt(ctx)
		if err == nil {
			return nil
		}
		if !errors.Is(err, errConflict) && !errors.Is(err, errUnavailable) {
			return err
		}
		last = err
		c.log.Debug("retrying", "what", what, "attempt", c.attempts, "err", err)
		d := backoff/2 + rand.N(backoff/2+1)
		backoff = min(backoff*2, 250*time.Millisecond)
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%s: gave up after %d attempts (%w): %w", what, c.attempts, ctx.Err(), last)
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
	if v.handle == nil {
		return nil
	}
	for k := range v.handle.Block {
		cidr, err := netip.ParsePrefix(k)
		if err != nil {
			continue
		}
		e := v.blocks[calico.Canonical(cidr)]
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
			out = append(out, calico.Canonical(p))
		}
	}
	return out
}
