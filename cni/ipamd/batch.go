package ipamd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/cni"
)

// request is one request of a batch: reqs[0], the leader, whose operation runs the batch, or one
// queued behind it (Server.runJobs) that the leader's transaction may serve too.
type request struct {
	job *job
	// deadline is when the request is given up, whatever the leader's is.
	deadline       time.Time
	handle, ifname string
	// attr is an ADD's allocation attribute.
	attr calico.AllocationAttribute

	// What the last decision said: the handle as it decided on it (hv), whether the write changes
	// the handle and what it leaves of it (newHandle; nil or empty: deleted), an ADD's addresses,
	// and whether the request was skipped (left for an operation of its own).
	hv        handleView
	changed   bool
	newHandle *calico.Handle
	allocs    []allocation
	skipped   bool

	// served: the batch answers the request (err: its own failure).
	served bool
	err    error
}

// reply is the answer of a request the batch served.
func (r *request) reply() *cni.Reply {
	if r.err != nil {
		te := toCNIError(r.err)
		return &cni.Reply{Code: te.Code, Msg: te.Msg}
	}
	return &cni.Reply{Allocations: r.allocs}
}

// decision decides one request of a batch on the view, on what the requests before it left (lead:
// it is reqs[0]; the view's handleView is its handle). It sets the request's changed, newHandle and
// allocs, and returns nil, needs, errSkip (the request is left for an operation of its own; the
// view is as before), or the request's own failure.
type decision func(v *view, r *request, lead bool) error

var (
	// errSkip: a decision leaves its request for an operation of its own.
	errSkip = errors.New("left for an operation of its own")
	// errRedo: a request of the batch failed on its own (its err is set); the batch is decided
	// again without it, on a view it did not touch.
	errRedo = errors.New("a request of the batch failed; deciding again without it")
)

// serve runs a batch of ADDs, DELs or a CHECK, led by reqs[0]: each attempt decides the requests in
// order on one view, each on what those before it left, and writes what they change in one
// transaction conditional on everything they used (no write when nothing changes). The caller keeps
// each container's order: no two requests of a batch are of one container.
//
// A request that fails on its own gets its error and the others go on without it. A write that would
// exceed maxTxnOps is split: the first half is decided again, the rest left for operations of their
// own. A lost race is decided again on what the failure branch read, without the requests whose
// handle keeps changing (isolate). Each request is given up at its own deadline: the attempts run
// until the earliest deadline of the batch, and a request whose deadline passes (or whose plugin
// hangs up) is answered with code 11 while the others go on, until the leader's deadline, ctx's.
func (c *call) serve(ctx context.Context, reqs []*request, decide decision) error {
	lead := reqs[0]
	c.expire(reqs)
	for {
		bctx, cancel := context.WithDeadline(ctx, earliest(reqs))
		err := c.retry(bctx, c.conf.Verb+" "+lead.handle, func(ctx context.Context) error {
			err := c.attempt(ctx, reqs, decide)
			if errors.Is(err, errConflict) && len(reqs) > 1 {
				reqs = c.isolate(reqs)
			}
			return err
		})
		ended := bctx.Err() != nil
		cancel()
		switch {
		case lead.err != nil:
			return lead.err
		case err == nil || !ended || c.expire(reqs) || ctx.Err() != nil:
			return err
		}
		// The deadline of a request behind the leader ended the attempts: expire answered it, and
		// the others go on.
	}
}

// earliest returns the earliest deadline of the requests not answered yet.
func earliest(reqs []*request) time.Time {
	d := reqs[0].deadline
	for _, r := range reqs[1:] {
		if !r.served && r.deadline.Before(d) {
			d = r.deadline
		}
	}
	return d
}

// expire answers at once (code 11) the requests behind the leader whose deadline has passed or
// whose plugin hung up; it reports whether the leader's deadline has passed.
func (c *call) expire(reqs []*request) (leader bool) {
	now := time.Now()
	for _, r := range reqs[1:] {
		if !r.served && (!now.Before(r.deadline) || r.job.ctx.Err() != nil) {
			r.err = &types.Error{Code: types.ErrTryAgainLater, Msg: fmt.Sprintf("%s %s: its deadline passed (or its plugin hung up) before the batch it was in was written",
				c.conf.Verb, r.handle)}
			r.served = true
			if c.answer != nil {
				c.answer(r)
			}
		}
	}
	return !now.Before(reqs[0].deadline)
}

// attempt decides the first n of reqs (all, halved until the write fits in maxTxnOps) and writes
// what they change in one transaction. It marks those it served; the others are left for an
// operation of their own.
func (c *call) attempt(ctx context.Context, reqs []*request, decide decision) error {
	for n := len(reqs); ; {
		chunk := reqs[:n]
		v, err := c.decide(ctx, chunk[0].handle, func(v *view) error { return v.decideBatch(chunk, decide) })
		if errors.Is(err, errRedo) {
			continue
		}
		if err != nil {
			return err
		}
		if len(v.handles) > 0 {
			err = c.write(ctx, v)
			if errors.Is(err, errTooLarge) && n > 1 {
				n = (n + 1) / 2
				continue
			}
			if err != nil {
				return err
			}
		}
		for _, r := range chunk {
			r.served = r.served || !r.skipped
		}
		return nil
	}
}

// decideBatch decides the requests on the view in order (those answered already passed over): the
// view's handles are those whose handle the write changes. A request whose decision fails gets its
// error, and errRedo is returned while others remain. The needs of all of them are returned
// together, so that one round trip reads them.
func (v *view) decideBatch(reqs []*request, decide decision) error {
	var need *needs
	v.handles = nil
	defer func() { v.handleView = handleView{} }()
	for i, r := range reqs {
		if r.served {
			continue
		}
		r.changed, r.newHandle, r.allocs, r.skipped = false, nil, nil, false
		hv, err := loadHandle(v.read, r.handle)
		if err == nil {
			v.handleView = hv
			err = decide(v, r, i == 0)
		}
		var n *needs
		switch {
		case errors.As(err, &n):
			need = need.merge(n)
		case errors.Is(err, errSkip):
			r.skipped = true
		case err != nil:
			r.err, r.served = fmt.Errorf("%s %s: %w", v.conf.Verb, r.handle, err), true
			if slices.ContainsFunc(reqs, func(o *request) bool { return !o.served }) {
				return errRedo
			}
		default:
			r.hv = v.handleView
			if r.changed {
				v.handles = append(v.handles, r)
			}
		}
	}
	if need != nil {
		return need
	}
	return nil
}

// isolate returns the requests to decide again after a lost race, so that one whose handle keeps
// changing cannot hold the others up until the leader's deadline: those (but the leader, reqs[0])
// whose handle, read before their decision, the failure branch found changed again are left for an
// operation of their own. A handle guessed wrong is no reason (the failure branch read it: the next
// decision uses it); when nothing explains the race (a block changed), the batch is halved.
func (c *call) isolate(reqs []*request) []*request {
	keep, explained := []*request{reqs[0]}, false
	for i, r := range reqs {
		moved, guessed := c.handleMoved(r)
		explained = explained || moved || guessed
		if i > 0 && !(moved && !r.served) {
			keep = append(keep, r)
		}
	}
	if !explained {
		keep = reqs[:(len(reqs)+1)/2]
	}
	return keep
}

// handleMoved reports whether the handle of r, as the failure branch read it, is not what its
// decision was conditional on: moved when the decision had read it, guessed when it had guessed it
// (its value derived from the node's blocks, or absent).
func (c *call) handleMoved(r *request) (moved, guessed bool) {
	got, ok := c.read.keys[calico.HandleKey(r.handle)]
	switch {
	case !ok || !r.changed || r.err != nil:
		return false, false
	case !r.hv.handleRead && r.hv.handleGuess == nil:
		return false, got != nil
	case !r.hv.handleRead:
		return false, got == nil || !bytes.Equal(got.Value, r.hv.handleGuess)
	case got == nil:
		return r.hv.handleRev != 0, false
	}
	return got.ModRevision != r.hv.handleRev, false
}
