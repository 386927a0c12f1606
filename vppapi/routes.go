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
	return c.dumpRoutes(ctx, tableID, "routes", func(t ip.IPTable) api.Message { return &ip.IPRouteDump{Table: t} })
}

// DumpAPIRoutes dumps the IPv4 and then the IPv6 routes of table tableID that were added over the binary
// API (by any client: ours and others'), with their API paths, through ip_route_v2_dump filtered on the
// API source. VPP's own entries (special, interface, recursive-resolution and adjacency /32s) and CLI
// routes are left out. A VPP without ip_route_v2_dump fails with an error wrapping ErrUnsupported.
func (c *Client) DumpAPIRoutes(ctx context.Context, tableID uint32) ([]FIBEntry, error) {
	if sess, err := c.current(); err == nil && !sess.routeSource {
		return nil, fmt.Errorf("dump API routes of table %d: ip_route_v2_dump: %w", tableID, ErrUnsupported)
	}
	return c.dumpRoutes(ctx, tableID, "API routes", func(t ip.IPTable) api.Message {
		return &ip.IPRouteV2Dump{Src: uint8(SourceAPI), Table: t}
	})
}

// DumpBestRoutes dumps every entry of table tableID, IPv4 then IPv6, with the source it forwards with
// (ip_route_v2_dump, no filter): an API route that a higher-priority source shadows (an interface
// address of the same prefix) shows as that source's entry, and DumpAPIRoutes leaves it out (measured on
// 26.06). A VPP without ip_route_v2_dump fails with an error wrapping ErrUnsupported.
func (c *Client) DumpBestRoutes(ctx context.Context, tableID uint32) ([]FIBEntry, error) {
	if sess, err := c.current(); err == nil && !sess.routeSource {
		return nil, fmt.Errorf("dump routes of table %d by source: ip_route_v2_dump: %w", tableID, ErrUnsupported)
	}
	return c.dumpRoutes(ctx, tableID, "routes by source", func(t ip.IPTable) api.Message {
		return &ip.IPRouteV2Dump{Table: t}
	})
}

// dumpRoutes sends the dump req builds for each family of table tableID and converts the details.
func (c *Client) dumpRoutes(ctx context.Context, tableID uint32, what string, req func(ip.IPTable) api.Message) ([]FIBEntry, error) {
	sess, err := c.current()
	if err != nil {
		return nil, fmt.Errorf("dump %s of table %d: %w", what, tableID, err)
	}
	var out []FIBEntry
	for _, ip6 := range []bool{false, true} {
		r := req(ip.IPTable{TableID: tableID, IsIP6: ip6})
		err := c.dump(ctx, sess, r, func(m api.Message) error {
			e, keep, err := routeEntry(r, m)
			if keep {
				out = append(out, e)
			}
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("dump %s %s of table %d: %w", family(ip6), what, tableID, err)
		}
	}
	return out, nil
}

// routeEntry converts one ip_route_details or ip_route_v2_details, a reply to filter; keep is false for a
// detail of a source other than the one asked for (from a VPP that ignored the filter).
func routeEntry(filter, m api.Message) (e FIBEntry, keep bool, err error) {
	switch d := m.(type) {
	case *ip.IPRouteDetails:
		e, err = entryFromAPI(d.Route.TableID, d.Route.Prefix, d.Route.Paths)
		return e, err == nil, err
	case *ip.IPRouteV2Details:
		if req, ok := filter.(*ip.IPRouteV2Dump); ok && req.Src != 0 && d.Route.Src != req.Src {
			return FIBEntry{}, false, nil
		}
		e, err = entryFromAPI(d.Route.TableID, d.Route.Prefix, d.Route.Paths)
		e.Source = Source(d.Route.Src)
		return e, err == nil, err
	}
	return FIBEntry{}, false, fmt.Errorf("unexpected %s in the dump", m.GetMessageName())
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

// Apply programs adds first (each replacing its prefix's path set with the Route's paths, in one request), then
// deletes, pipelined over one dedicated GoVPP stream with at most Config.Window requests in flight: one
// goroutine sends while the caller's receives the replies. Every reply's retval is checked and attributed
// to its route. Each reply must come within Config.ReplyTimeout of its request being sent or of the
// previous reply, whichever is later (VPP answers in order), and within ctx's deadline.
//
// A route that cannot be encoded (invalid prefix) fails without being sent. When VPP stops answering, the
// connection is lost or ctx is done, the requests in flight fail with that error and those not yet sent
// with "not sent: " and that error. Failures are reported in input order. Apply is safe to call while Run
// reconnects, but not concurrently with itself.
func (c *Client) Apply(ctx context.Context, adds, deletes []Route) Result {
	return c.apply(ctx, adds, deletes, true)
}

// ApplySync is Apply's contract with one synchronous request per route: each is sent only after the
// previous reply arrived. It exists for comparison and as a fallback.
func (c *Client) ApplySync(ctx context.Context, adds, deletes []Route) Result {
	return c.apply(ctx, adds, deletes, false)
}

// routeAddDel is the request name Apply's errors are counted under.
var routeAddDel = (*ip.IPRouteAddDel)(nil).GetMessageName()

// batch is the routes of one Apply and their outcome so far.
type batch struct {
	adds, deletes []Route
	res           Result
	failed        []indexedError
	// sess is the connection the batch goes over: its VXLAN tunnels need a next hop.
	sess *session
}

// indexedError is a route error and the index of its route in adds followed by deletes.
type indexedError struct {
	i   int
	err RouteError
}

func (b *batch) len() int { return len(b.adds) + len(b.deletes) }

// at returns route i of adds followed by deletes, and what to do with it.
func (b *batch) at(i int) (Route, Op) {
	if i < len(b.adds) {
		return b.adds[i], OpAdd
	}
	return b.deletes[i-len(b.adds)], OpDelete
}

func (b *batch) fail(i int, err error) {
	r, op := b.at(i)
	b.failed = append(b.failed, indexedError{i, RouteError{Route: r, Op: op, Err: err}})
}

// failRest fails routes from..len with "not sent" and the error that stopped the batch.
func (b *batch) failRest(from int, err error) {
	for i := from; i < b.len(); i++ {
		b.fail(i, fmt.Errorf("not sent: %w", err))
	}
}

// encode fills msg with route i; a route that cannot be encoded fails.
func (b *batch) encode(msg *ip.IPRouteAddDel, i int) bool {
	r, op := b.at(i)
	if op == OpAdd && b.sess != nil {
		for _, h := range r.Hops() {
			if !h.NextHop.IsValid() && b.sess.isVXLAN(h.SwIfIndex) {
				b.fail(i, fmt.Errorf("invalid route: %w", ErrNoNextHop))
				return false
			}
		}
	}
	if err := fillRouteAddDel(msg, r, op == OpAdd); err != nil {
		b.fail(i, fmt.Errorf("invalid route: %w", err))
		return false
	}
	return true
}

// result returns the outcome with failures in input order: a route rejected before sending fails before
// the replies to the routes ahead of it arrive.
func (b *batch) result() Result {
	slices.SortStableFunc(b.failed, func(x, y indexedError) int { return cmp.Compare(x.i, y.i) })
	for _, f := range b.failed {
		b.res.Failed = append(b.res.Failed, f.err)
	}
	return b.res
}

// reply attributes the reply to route i.
func (c *Client) reply(b *batch, i int, reply api.Message) {
	c.noteReply()
	rep, ok := reply.(*ip.IPRouteAddDelReply)
	switch {
	case !ok:
		b.fail(i, fmt.Errorf("unexpected reply %s", reply.GetMessageName()))
	case rep.Retval != 0:
		c.metrics.apiError(routeAddDel)
		b.fail(i, api.VPPApiError(rep.Retval))
	case i < len(b.adds):
		b.res.Added++
	default:
		b.res.Deleted++
	}
}

// newRouteMsg returns the one message a batch re-encodes for every route: SendMsg encodes it before
// returning, so it can be refilled at once.
func newRouteMsg() *ip.IPRouteAddDel {
	return &ip.IPRouteAddDel{Route: ip.IPRoute{Paths: make([]fib_types.FibPath, 0, 1)}}
}

func (c *Client) apply(ctx context.Context, adds, deletes []Route, pipelined bool) Result {
	b := &batch{adds: adds, deletes: deletes}
	if b.len() == 0 {
		return b.res
	}
	sess, err := c.current()
	if err != nil {
		b.failRest(0, err)
		return b.result()
	}
	b.sess = sess
	octx, stop := sess.opContext(ctx)
	defer stop()
	window := 1
	if pipelined {
		window = c.cfg.Window
	}
	s, err := c.newStream(octx, sess, window)
	if err != nil {
		b.failRest(0, err)
		return b.result()
	}
	defer func() { _ = s.Close() }()
	if pipelined {
		c.pipeline(octx, s, b, window)
	} else {
		c.lockstep(octx, s, b)
	}
	return b.result()
}

// lockstep sends each route only after the previous one's reply.
func (c *Client) lockstep(octx context.Context, s api.Stream, b *batch) {
	msg := newRouteMsg()
	for i := range b.len() {
		if octx.Err() != nil {
			b.failRest(i, c.streamError(octx, octx.Err()))
			return
		}
		if !b.encode(msg, i) {
			continue
		}
		if err := s.SendMsg(msg); err != nil {
			b.failRest(i, c.streamError(octx, err))
			return
		}
		reply, err := s.RecvMsg()
		if err != nil {
			err = c.streamError(octx, err)
			if errors.Is(err, ErrTimeout) {
				c.metrics.apiError(routeAddDel)
			}
			b.fail(i, err)
			b.failRest(i+1, err)
			return
		}
		c.reply(b, i, reply)
	}
}

// pipeline sends from a goroutine of its own, at most window requests ahead of the replies, and receives
// on the caller's. Both use the one stream: GoVPP's Stream guards the only state its SendMsg and RecvMsg
// share (the reply's package path) with its mutex, and the sender returns before the stream is closed.
func (c *Client) pipeline(octx context.Context, s api.Stream, b *batch, window int) {
	var (
		tokens = make(chan struct{}, window) // one per request in flight
		sent   = make(chan int, window)      // route indexes in flight, in order; closed when the sender ends
		quit   = make(chan struct{})         // closed by the receiver when it stops receiving
		// Owned by the sender until it closes sent.
		next    int            // the first route not sent
		sendErr error          // why the sender stopped early
		local   []indexedError // routes rejected before sending
	)
	go func() {
		defer close(sent)
		lb := &batch{adds: b.adds, deletes: b.deletes, sess: b.sess} // the sender's own failures, merged after it ends
		defer func() { local = lb.failed }()
		msg := newRouteMsg()
		done := octx.Done()
		for ; next < b.len(); next++ {
			// Checked before every send, not only while waiting for room in the window: a select with
			// several cases ready picks one at random.
			select {
			case <-quit:
				return
			case <-done:
				sendErr = c.streamError(octx, octx.Err())
				return
			default:
			}
			if !lb.encode(msg, next) {
				continue
			}
			select {
			case tokens <- struct{}{}:
			case <-quit:
				return
			case <-done:
				sendErr = c.streamError(octx, octx.Err())
				return
			}
			if err := s.SendMsg(msg); err != nil {
				sendErr = c.streamError(octx, err)
				return
			}
			sent <- next
		}
	}()

	var recvErr error
	unanswered := 0
	for i := range sent {
		if recvErr != nil {
			// Sent before the sender noticed quit: its outcome is as unknown as the one that failed.
			b.fail(i, recvErr)
			unanswered++
			continue
		}
		reply, err := s.RecvMsg()
		if err != nil {
			recvErr = c.streamError(octx, err)
			close(quit)
			b.fail(i, recvErr)
			unanswered++
			continue
		}
		<-tokens
		c.reply(b, i, reply)
	}
	// The sender has ended: next, sendErr and local are the receiver's now.
	b.failed = append(b.failed, local...)
	if errors.Is(recvErr, ErrTimeout) {
		c.metrics.apiErrorsN(routeAddDel, unanswered)
	}
	stopErr := recvErr
	if stopErr == nil {
		stopErr = sendErr
	}
	if stopErr != nil {
		b.failRest(next, stopErr)
	}
}
