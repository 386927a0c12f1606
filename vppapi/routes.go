package vppapi

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"

	"go.fd.io/govpp/api"
	"go.fd.io/govpp/binapi/fib_types"
	"go.fd.io/govpp/binapi/ip"
	"go.fd.io/govpp/binapi/memclnt"
)

// dumpReplyBuffer is the reply buffer of a dump's stream. GoVPP drops a reply, silently, when its stream's
// buffer stays full for 100ms; a large buffer keeps a dump of tens of thousands of routes whole even when
// the reader is descheduled for a while.
const dumpReplyBuffer = 16384

// EnsureTable creates table tableID for IPv4 and IPv6 unless it is 0, which always exists. It is
// idempotent: VPP accepts adding an existing table.
func (c *Client) EnsureTable(ctx context.Context, tableID uint32) error {
	if tableID == 0 {
		return nil
	}
	sess, err := c.current()
	if err != nil {
		return fmt.Errorf("create table %d: %w", tableID, err)
	}
	for _, ip6 := range []bool{false, true} {
		req := &ip.IPTableAddDel{IsAdd: true, Table: ip.IPTable{TableID: tableID, IsIP6: ip6}}
		if _, err := c.call(ctx, sess, req); err != nil {
			return fmt.Errorf("create %s table %d: %w", family(ip6), tableID, err)
		}
	}
	return nil
}

// DumpRoutes dumps the IPv4 and then the IPv6 routes of table tableID (ip_route_dump), normalised. Every
// source is included, VPP's own special and interface routes and other clients' routes as well as ours,
// so that the caller can tell its own apart. A table that does not exist has no routes.
func (c *Client) DumpRoutes(ctx context.Context, tableID uint32) ([]FIBEntry, error) {
	sess, err := c.current()
	if err != nil {
		return nil, fmt.Errorf("dump routes of table %d: %w", tableID, err)
	}
	var out []FIBEntry
	for _, ip6 := range []bool{false, true} {
		req := &ip.IPRouteDump{Table: ip.IPTable{TableID: tableID, IsIP6: ip6}}
		err := c.dump(ctx, sess, req, func(m api.Message) error {
			d, ok := m.(*ip.IPRouteDetails)
			if !ok {
				return fmt.Errorf("unexpected %s in the dump", m.GetMessageName())
			}
			e, err := entryFromAPI(&d.Route)
			if err != nil {
				return err
			}
			out = append(out, e)
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("dump %s routes of table %d: %w", family(ip6), tableID, err)
		}
	}
	return out, nil
}

func family(ip6 bool) string {
	if ip6 {
		return "IPv6"
	}
	return "IPv4"
}

// dump sends a dump request and the control_ping that ends it on one stream, and hands each detail to
// each until the ping's reply. After each fails, it drains the rest, so the stream ends clean, and returns
// that first error.
func (c *Client) dump(ctx context.Context, sess *session, req api.Message, each func(api.Message) error) error {
	octx, stop := sess.opContext(ctx)
	defer stop()
	s, err := c.newStream(octx, sess, dumpReplyBuffer)
	if err != nil {
		return err
	}
	defer func() { _ = s.Close() }()
	if err := s.SendMsg(req); err != nil {
		return c.failed(req, c.streamError(octx, err))
	}
	if err := s.SendMsg(&memclnt.ControlPing{}); err != nil {
		return c.failed(req, c.streamError(octx, err))
	}
	var firstErr error
	for {
		m, err := s.RecvMsg()
		if err != nil {
			return c.failed(req, c.streamError(octx, err))
		}
		c.noteReply()
		if _, ok := m.(*memclnt.ControlPingReply); ok {
			return firstErr
		}
		if firstErr == nil {
			firstErr = each(m)
		}
	}
}

// Apply programs adds first (each replacing its prefix's path set with the one path of the Route), then
// deletes, pipelined over one dedicated GoVPP stream with at most Config.Window requests in flight. Every
// reply's retval is checked and attributed to its route. Each reply must come within Config.ReplyTimeout
// of the previous one (VPP answers in order), and within ctx's deadline.
//
// A route that cannot be encoded (invalid prefix) fails without being sent. When VPP stops answering, the
// connection is lost or ctx is done, the requests in flight and all those not yet sent fail with that
// error. Apply is safe to call while Run reconnects, but not concurrently with itself.
func (c *Client) Apply(ctx context.Context, adds, deletes []Route) Result {
	return c.apply(ctx, adds, deletes, c.cfg.Window)
}

// ApplySync is Apply with one synchronous request per route: each is sent only after the previous reply.
// It exists for comparison and as a fallback.
func (c *Client) ApplySync(ctx context.Context, adds, deletes []Route) Result {
	return c.apply(ctx, adds, deletes, 1)
}

// routeAddDel is the request name Apply's errors are counted under.
var routeAddDel = (*ip.IPRouteAddDel)(nil).GetMessageName()

// indexedError is a route error and the index of its route in adds followed by deletes.
type indexedError struct {
	i   int
	err RouteError
}

// apply runs adds then deletes with up to window requests in flight.
func (c *Client) apply(ctx context.Context, adds, deletes []Route, window int) (res Result) {
	total := len(adds) + len(deletes)
	if total == 0 {
		return
	}
	at := func(i int) (Route, Op) {
		if i < len(adds) {
			return adds[i], OpAdd
		}
		return deletes[i-len(adds)], OpDelete
	}
	// Failures are collected with their index and reported in input order: a route rejected before
	// sending fails before the replies to the routes ahead of it arrive.
	var failed []indexedError
	fail := func(i int, err error) {
		r, op := at(i)
		failed = append(failed, indexedError{i, RouteError{Route: r, Op: op, Err: err}})
	}
	defer func() {
		slices.SortStableFunc(failed, func(a, b indexedError) int { return cmp.Compare(a.i, b.i) })
		for _, f := range failed {
			res.Failed = append(res.Failed, f.err)
		}
	}()

	sess, err := c.current()
	if err != nil {
		for i := range total {
			fail(i, err)
		}
		return
	}
	octx, stop := sess.opContext(ctx)
	defer stop()
	s, err := c.newStream(octx, sess, window)
	if err != nil {
		for i := range total {
			fail(i, err)
		}
		return
	}
	defer func() { _ = s.Close() }()

	// One message, re-encoded for every route: SendMsg encodes it before returning.
	msg := &ip.IPRouteAddDel{Route: ip.IPRoute{Paths: make([]fib_types.FibPath, 0, 1)}}
	// The op indexes in flight, oldest first, in a ring: VPP answers a client's requests in order.
	ring := make([]int, window)
	head, inFlight, next := 0, 0, 0
	var stopErr error // once set, nothing more is sent and the unsent fail with it
	done := octx.Done()

	for {
		for inFlight < window && next < total && stopErr == nil {
			select {
			case <-done:
				stopErr = c.streamError(octx, octx.Err())
				continue
			default:
			}
			r, op := at(next)
			if err := fillRouteAddDel(msg, r, op == OpAdd); err != nil {
				fail(next, fmt.Errorf("invalid route: %w", err))
				next++
				continue
			}
			if err := s.SendMsg(msg); err != nil {
				stopErr = c.streamError(octx, err)
				break
			}
			ring[(head+inFlight)%window] = next
			inFlight++
			next++
		}
		if inFlight == 0 {
			break
		}
		reply, err := s.RecvMsg()
		if err != nil {
			err = c.streamError(octx, err)
			if errors.Is(err, ErrTimeout) {
				c.metrics.apiErrorsN(routeAddDel, inFlight)
			}
			for ; inFlight > 0; inFlight-- {
				fail(ring[head], err)
				head = (head + 1) % window
			}
			if stopErr == nil {
				stopErr = err
			}
			break
		}
		c.noteReply()
		i := ring[head]
		head = (head + 1) % window
		inFlight--
		rep, ok := reply.(*ip.IPRouteAddDelReply)
		switch {
		case !ok:
			fail(i, fmt.Errorf("unexpected reply %s", reply.GetMessageName()))
		case rep.Retval != 0:
			c.metrics.apiError(routeAddDel)
			fail(i, api.VPPApiError(rep.Retval))
		case i < len(adds):
			res.Added++
		default:
			res.Deleted++
		}
	}
	if stopErr != nil {
		for ; next < total; next++ {
			fail(next, fmt.Errorf("not sent: %w", stopErr))
		}
	}
	return
}
