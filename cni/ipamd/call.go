package ipamd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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
// node cache of its pool settings and a logger. It runs on the state goroutine only.
type call struct {
	conf  *cni.Request
	etcd  *etcdClient
	log   *slog.Logger
	pause func(context.Context)
	// cache is the node cache of the request's pool settings, owned by the state goroutine.
	cache *nodeCache
	// endpoints names etcd in messages (redacted).
	endpoints string
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
