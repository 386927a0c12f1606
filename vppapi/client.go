package vppapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/internal/backoff"
	"go.fd.io/govpp/adapter/socketclient"
	"go.fd.io/govpp/api"
	interfaces "go.fd.io/govpp/binapi/interface"
	"go.fd.io/govpp/binapi/interface_types"
	"go.fd.io/govpp/binapi/ip"
	"go.fd.io/govpp/binapi/ip_neighbor"
	"go.fd.io/govpp/binapi/ipip"
	"go.fd.io/govpp/binapi/memclnt"
	"go.fd.io/govpp/binapi/vlib"
	"go.fd.io/govpp/binapi/vpe"
	"go.fd.io/govpp/binapi/vxlan"
	"go.fd.io/govpp/core"
)

// clientName is how this agent registers with VPP ("show api clients").
const clientName = "vpp-route-agent"

// eventBuffer is the capacity of the Events channel.
const eventBuffer = 64

// healthFailures is how many consecutive unanswered health probes, with no other reply meanwhile, end a
// connection.
const healthFailures = 2

// usedMessages are exactly the messages this package sends or receives; Run checks them on every connect.
func usedMessages() []api.Message {
	return []api.Message{
		(*ip.IPRouteAddDel)(nil), (*ip.IPRouteAddDelReply)(nil),
		(*ip.IPRouteDump)(nil), (*ip.IPRouteDetails)(nil),
		(*ip.IPTableAddDel)(nil), (*ip.IPTableAddDelReply)(nil),
		(*ip.IPAddressDump)(nil), (*ip.IPAddressDetails)(nil),
		(*interfaces.SwInterfaceDump)(nil), (*interfaces.SwInterfaceDetails)(nil),
		(*interfaces.SwInterfaceSetFlags)(nil), (*interfaces.SwInterfaceSetFlagsReply)(nil),
		(*interfaces.SwInterfaceAddDelAddress)(nil), (*interfaces.SwInterfaceAddDelAddressReply)(nil),
		(*vpe.ShowVersion)(nil), (*vpe.ShowVersionReply)(nil),
		(*memclnt.ControlPing)(nil), (*memclnt.ControlPingReply)(nil),
	}
}

// tunnelMessages are the messages of the IPIP tunnel operations (tunnel.go), all in VPP's core. They are
// checked on connect with usedMessages.
func tunnelMessages() []api.Message {
	return []api.Message{
		(*ipip.IpipAddTunnel)(nil), (*ipip.IpipAddTunnelReply)(nil),
		(*ipip.IpipDelTunnel)(nil), (*ipip.IpipDelTunnelReply)(nil),
		(*ipip.IpipTunnelDump)(nil), (*ipip.IpipTunnelDetails)(nil),
		(*interfaces.SwInterfaceSetUnnumbered)(nil), (*interfaces.SwInterfaceSetUnnumberedReply)(nil),
		(*interfaces.SwInterfaceSetMtu)(nil), (*interfaces.SwInterfaceSetMtuReply)(nil),
		(*interfaces.SwInterfaceTagAddDel)(nil), (*interfaces.SwInterfaceTagAddDelReply)(nil),
	}
}

// routeSourceMessages are the messages of DumpAPIRoutes. VPP has had them since 23.10, marked "in
// progress" (CRC unchanged from 25.10 to 26.06); a VPP without them is still compatible, and
// DumpAPIRoutes fails with ErrUnsupported there.
func routeSourceMessages() []api.Message {
	return []api.Message{(*ip.IPRouteV2Dump)(nil), (*ip.IPRouteV2Details)(nil)}
}

// requestMessageNames are the names of the requests this package sends: the msg label values of
// vpp_route_agent_vpp_api_errors_total.
func requestMessageNames() []string {
	var names []string
	for _, m := range slices.Concat(usedMessages(), tunnelMessages(), routeSourceMessages(), interfaceEventMessages(),
		neighborMessages(), vxlanMessages(), lookupMessages(), bfdMessages()) {
		if m.GetMessageType() == api.RequestMessage {
			names = append(names, m.GetMessageName())
		}
	}
	return names
}

// EventKind is the kind of a connection event.
type EventKind int

// Connection event kinds.
const (
	// Connected: a compatible VPP is connected; PID and Version are set, Restarted says whether its pid
	// differs from the last one seen (VPP restarted, its FIB is empty).
	Connected EventKind = iota
	// Disconnected: the connection was lost (Err says why) or Run stopped (Err nil). Calls fail with
	// ErrNotConnected until the next Connected.
	Disconnected
	// Incompatible: VPP lacks messages this package uses; Err is an *IncompatibleError naming them and
	// the VPP version. Run disconnects and retries with backoff.
	Incompatible
	// InterfaceDeleted: VPP deleted the interface SwIfIndex (its sw_interface_event with deleted set).
	// It comes between a Connected and the next Disconnected. Routes through a deleted interface stay
	// in VPP's FIB but drop their traffic, even once another interface takes the index (measured on
	// 26.06); a VPP without interface events sends none, and its clients notice by looking.
	InterfaceDeleted
	// InterfaceUp: VPP reported the interface SwIfIndex admin and link up (a sw_interface_event with
	// both flags; VPP sends one per change, the simulator also for an unchanged link). After an
	// interface comes up VPP forwards again over paths whose BFD session is not Up (a defect of 26.06,
	// VPP 26.06 fib_path.c: an interface-up back-walk resolves the path without asking the adjacency) until that session changes state: the consumer re-creates those sessions.
	InterfaceUp
)

// String returns the kind's name.
func (k EventKind) String() string {
	switch k {
	case Connected:
		return "connected"
	case Disconnected:
		return "disconnected"
	case Incompatible:
		return "incompatible"
	case InterfaceDeleted:
		return "interface-deleted"
	case InterfaceUp:
		return "interface-up"
	default:
		return fmt.Sprintf("EventKind(%d)", int(k))
	}
}

// Event is a change of the connection to VPP.
type Event struct {
	Kind EventKind
	// PID is VPP's pid (control_ping's vpe_pid), when known.
	PID uint32
	// Version is VPP's version (show_version), when known.
	Version string
	// Restarted is set on Connected when VPP's pid differs from the last one seen: VPP restarted and its
	// FIB is empty.
	Restarted bool
	// Err says why the connection ended (Disconnected) or was refused (Incompatible).
	Err error
	// SwIfIndex is the interface of an InterfaceDeleted or InterfaceUp.
	SwIfIndex uint32
}

// Status is a snapshot of the connection, for health endpoints and logs.
type Status struct {
	// Connected is true while a compatible VPP is connected.
	Connected bool
	// PID and Version are those of the current or, when disconnected, the last connected VPP.
	PID     uint32
	Version string
	// LastError is why the last connection ended or the last attempt failed; "" if none has.
	LastError string
	// Reconnects counts connections established after the first.
	Reconnects uint64
	// RouteSource says whether the connected VPP dumps routes by source (ip_route_v2_dump), so that
	// DumpAPIRoutes works.
	RouteSource bool
	// Stalled says that the connected VPP is not answering: a request went unanswered for ReplyTimeout
	// with no reply to anything meanwhile (a frozen or hung VPP), since StalledSince. The next reply ends
	// it; two unanswered health probes end the connection.
	Stalled      bool
	StalledSince time.Time
	// VXLAN says whether the connected VPP has the vxlan plugin (its messages, with this package's CRCs),
	// so that the VXLAN tunnel operations work; without it they fail with ErrNoVXLANPlugin.
	VXLAN bool
}

// Client talks to one VPP over its binary API socket. Run keeps the connection; the other methods use
// whatever connection is current and fail with ErrNotConnected when there is none. All methods are safe
// for concurrent use, except that Apply and ApplySync are meant to be called from one goroutine at a time.
type Client struct {
	cfg     Config
	log     *slog.Logger
	metrics *metrics
	events  chan Event
	// bfd delivers BFD state events (bfd.go).
	bfd bfdEvents
	// kick asks Run for a health probe now: an operation saw a send error or a timeout.
	kick    chan struct{}
	running atomic.Bool
	// lastReply is when any operation last received a reply (unix nanoseconds): a busy VPP answering
	// other requests is alive even if a health probe queued behind them times out.
	lastReply atomic.Int64
	// stalledSince is when VPP was found not answering (unix nanoseconds), 0 while it answers (see
	// Status.Stalled).
	stalledSince atomic.Int64

	mu     sync.Mutex
	sess   *session // current connection, nil when disconnected
	status Status
}

// session is one established, checked connection.
type session struct {
	conn    *core.Connection
	pid     uint32
	version string
	// routeSource: VPP has ip_route_v2_dump (DumpAPIRoutes works).
	routeSource bool
	// vxlan: VPP has the vxlan plugin (vxlan.go).
	vxlan bool
	// bfd: VPP has this package's BFD messages (bfd.go).
	bfd bool
	// vxlanMu guards the VXLAN state below.
	vxlanMu sync.Mutex
	// vxlanIfaces are the VXLAN tunnels this connection made or dumped, whose routes Apply checks.
	vxlanIfaces map[uint32]struct{}
	// decap is ethernet-input's next index of vxlan4-input and vxlan6-input, once known.
	decap      [2]uint32
	decapKnown [2]bool
	// ctx is cancelled, with a cause wrapping ErrNotConnected, when the connection ends: requests in
	// flight on it stop waiting at once.
	ctx    context.Context
	cancel context.CancelCauseFunc
}

// New validates cfg, applies its defaults and registers the metrics. It does not connect: Run does.
func New(cfg Config) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	m.setConnected(false)
	return &Client{
		cfg:     cfg,
		log:     cfg.Logger.With("component", "vppapi", "socket", cfg.Socket),
		metrics: m,
		events:  make(chan Event, eventBuffer),
		bfd:     newBFDEvents(),
		kick:    make(chan struct{}, 1),
	}, nil
}

// Events delivers connection events in order. It is buffered; the consumer must keep reading, or Run
// blocks on it (until its ctx is done).
func (c *Client) Events() <-chan Event { return c.events }

// Connected reports whether a compatible VPP is connected right now.
func (c *Client) Connected() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sess != nil
}

// Status returns a snapshot of the connection state.
func (c *Client) Status() Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.status
	if since := c.stalledSince.Load(); since != 0 && st.Connected {
		st.Stalled, st.StalledSince = true, time.Unix(0, since)
	}
	return st
}

// Run owns the connection: it connects, checks compatibility, reads VPP's version and pid, probes the
// connection's health, and reconnects with capped jittered backoff whenever the connection fails or VPP is
// incompatible, until ctx is done; then it disconnects and returns nil. It returns an error only if it is
// already running.
func (c *Client) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return errors.New("vppapi: Run is already running")
	}
	defer c.running.Store(false)

	bo := backoff.Backoff{Base: c.cfg.ReconnectDelay, Max: maxReconnectDelay}
	var lastPID uint32
	var lastFailure string
	connects := 0
	for {
		sess, err := c.connect(ctx)
		if err == nil {
			bo.Reset()
			lastFailure = ""
			restarted := lastPID != 0 && sess.pid != lastPID
			lastPID = sess.pid
			connects++
			w := c.watchInterfaces(ctx, sess)
			bfdWatched := c.watchBFD(ctx, sess)
			c.publish(sess, connects > 1)
			c.log.Info("connected to VPP", "version", sess.version, "pid", sess.pid, "restarted", restarted,
				"route_source_dump", sess.routeSource, "vxlan_plugin", sess.vxlan, "bfd", sess.bfd)
			c.emit(ctx, Event{Kind: Connected, PID: sess.pid, Version: sess.version, Restarted: restarted})
			watched := c.forwardInterfaceEvents(ctx, sess, w)

			err = c.serve(ctx, sess)
			c.teardown(sess, err)
			<-watched // no InterfaceDeleted after the Disconnected
			<-bfdWatched
			if err != nil {
				c.log.Warn("lost connection to VPP", "error", err)
			}
			c.emit(ctx, Event{Kind: Disconnected, PID: sess.pid, Version: sess.version, Err: err})
		} else if ctx.Err() == nil {
			c.setLastError(err)
			// Logged when the reason changes, not on every retry while VPP is down or incompatible.
			msg := err.Error()
			var incompat *IncompatibleError
			if errors.As(err, &incompat) {
				if msg != lastFailure {
					c.log.Error("VPP is incompatible", "version", incompat.Version, "messages", incompat.Messages)
				}
				c.emit(ctx, Event{Kind: Incompatible, Version: incompat.Version, Err: err})
			} else if msg != lastFailure {
				c.log.Warn("connecting to VPP failed, retrying", "error", err)
			}
			lastFailure = msg
		}
		if ctx.Err() != nil {
			return nil
		}
		t := time.NewTimer(bo.Next())
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// connect establishes a connection, checks it and reads VPP's version and pid. GoVPP's connect is not
// cancellable, but its handshake is bounded by ReplyTimeout.
func (c *Client) connect(ctx context.Context) (*session, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	adapter := socketclient.NewVppClient(c.cfg.Socket)
	adapter.SetClientName(clientName)
	adapter.SetConnectTimeout(c.cfg.ReplyTimeout)
	conn, err := core.Connect(adapter)
	if err != nil {
		return nil, fmt.Errorf("connect to VPP at %s: %w", c.cfg.Socket, err)
	}
	sctx, cancel := context.WithCancelCause(context.Background())
	sess := &session{conn: conn, ctx: sctx, cancel: cancel, vxlanIfaces: map[uint32]struct{}{}}
	fail := func(err error) (*session, error) {
		cancel(err)
		conn.Disconnect()
		return nil, err
	}

	compatErr := checkCompatibility(conn, slices.Concat(usedMessages(), tunnelMessages(), neighborMessages(), lookupMessages())...)
	sess.version = "unknown"
	var missing []string
	var cerr *api.CompatibilityError
	if errors.As(compatErr, &cerr) {
		missing = cerr.IncompatibleMessages
	} else if compatErr != nil {
		return fail(fmt.Errorf("check VPP API compatibility: %w", compatErr))
	}
	if !contains(missing, (*vpe.ShowVersion)(nil), (*vpe.ShowVersionReply)(nil)) {
		v, err := c.showVersion(ctx, sess)
		if err != nil {
			return fail(err)
		}
		sess.version = v
	}
	if compatErr != nil {
		return fail(&IncompatibleError{Version: sess.version, Messages: missing, Err: compatErr})
	}
	sess.routeSource = checkCompatibility(conn, routeSourceMessages()...) == nil
	sess.vxlan = checkCompatibility(conn, vxlanMessages()...) == nil
	sess.bfd = checkCompatibility(conn, bfdMessages()...) == nil
	pid, err := c.ping(ctx, sess)
	if err != nil {
		return fail(err)
	}
	sess.pid = pid
	return sess, nil
}

// checkCompatibility runs GoVPP's CheckCompatiblity (a look-up in VPP's message table) on msgs.
func checkCompatibility(conn *core.Connection, msgs ...api.Message) error {
	ch, err := conn.NewAPIChannel()
	if err != nil {
		return fmt.Errorf("open API channel: %w", err)
	}
	defer ch.Close()
	return ch.CheckCompatiblity(msgs...)
}

// contains reports whether any of msgs is among the name_crc strings of missing.
func contains(missing []string, msgs ...api.Message) bool {
	for _, s := range missing {
		for _, m := range msgs {
			if s == m.GetMessageName()+"_"+m.GetCrcString() {
				return true
			}
		}
	}
	return false
}

// showVersion reads VPP's version.
func (c *Client) showVersion(ctx context.Context, sess *session) (string, error) {
	reply, err := c.call(ctx, sess, &vpe.ShowVersion{})
	if err != nil {
		return "", fmt.Errorf("read VPP version: %w", err)
	}
	r, ok := reply.(*vpe.ShowVersionReply)
	if !ok {
		return "", fmt.Errorf("read VPP version: unexpected reply %s", reply.GetMessageName())
	}
	return r.Version, nil
}

// ping sends control_ping and returns VPP's pid.
func (c *Client) ping(ctx context.Context, sess *session) (uint32, error) {
	reply, err := c.call(ctx, sess, &memclnt.ControlPing{})
	if err != nil {
		return 0, fmt.Errorf("ping VPP: %w", err)
	}
	r, ok := reply.(*memclnt.ControlPingReply)
	if !ok {
		return 0, fmt.Errorf("ping VPP: unexpected reply %s", reply.GetMessageName())
	}
	return r.VpePID, nil
}

// publish makes sess the current connection.
func (c *Client) publish(sess *session, reconnect bool) {
	c.stalledSince.Store(0)
	c.mu.Lock()
	c.sess = sess
	c.status.Connected = true
	c.status.PID = sess.pid
	c.status.Version = sess.version
	c.status.RouteSource = sess.routeSource
	c.status.VXLAN = sess.vxlan
	if reconnect {
		c.status.Reconnects++
	}
	c.mu.Unlock()
	c.metrics.setConnected(true)
	if reconnect {
		c.metrics.reconnected()
	}
}

// teardown ends sess: new calls fail with ErrNotConnected, calls in flight stop waiting, and the socket
// is closed.
func (c *Client) teardown(sess *session, cause error) {
	c.mu.Lock()
	if c.sess == sess {
		c.sess = nil
	}
	c.status.Connected = false
	if cause != nil {
		c.status.LastError = cause.Error()
	}
	c.mu.Unlock()
	c.metrics.setConnected(false)
	if cause == nil {
		sess.cancel(fmt.Errorf("%w: client stopped", ErrNotConnected))
	} else {
		sess.cancel(fmt.Errorf("%w: connection lost: %w", ErrNotConnected, cause))
	}
	sess.conn.Disconnect()
}

func (c *Client) setLastError(err error) {
	c.mu.Lock()
	c.status.LastError = err.Error()
	c.mu.Unlock()
}

// emit delivers ev in order; it blocks while the buffer is full, until ctx is done, after which it only
// delivers what fits.
func (c *Client) emit(ctx context.Context, ev Event) {
	select {
	case c.events <- ev:
		return
	default:
	}
	if ctx.Err() != nil {
		c.log.Warn("event buffer full, dropping event", "kind", ev.Kind)
		return
	}
	select {
	case c.events <- ev:
	case <-ctx.Done():
		c.log.Warn("event buffer full, dropping event", "kind", ev.Kind)
	}
}

// interfaceEventMessages are the messages of VPP's interface events; a VPP without them is still
// compatible (see InterfaceDeleted).
func interfaceEventMessages() []api.Message {
	return []api.Message{(*interfaces.WantInterfaceEvents)(nil), (*interfaces.WantInterfaceEventsReply)(nil),
		(*interfaces.SwInterfaceEvent)(nil)}
}

// watchInterfaces subscribes to VPP's interface events on sess, before its Connected is emitted so that
// no deletion after it goes unheard; nil when VPP has none or refuses (a deleted uplink is then
// noticed by looking). The subscription is made anew on every connection: VPP forgets it with its
// client.
func (c *Client) watchInterfaces(ctx context.Context, sess *session) api.Watcher {
	if checkCompatibility(sess.conn, interfaceEventMessages()...) != nil {
		c.log.Info("VPP has no interface events: a deleted uplink is noticed at the next resync")
		return nil
	}
	w, err := sess.conn.WatchEvent(sess.ctx, (*interfaces.SwInterfaceEvent)(nil))
	if err == nil {
		_, err = c.call(ctx, sess, &interfaces.WantInterfaceEvents{EnableDisable: 1, PID: uint32(os.Getpid())})
		if err != nil {
			w.Close()
		}
	}
	if err != nil {
		c.log.Warn("subscribing to VPP's interface events failed: a deleted uplink is noticed at the next resync", "error", err)
		return nil
	}
	return w
}

// forwardInterfaceEvents emits an InterfaceDeleted for each deletion w reports and an InterfaceUp for
// each report of an interface admin and link up, from a goroutine that
// ends with the session; the returned channel is closed then.
func (c *Client) forwardInterfaceEvents(ctx context.Context, sess *session, w api.Watcher) <-chan struct{} {
	done := make(chan struct{})
	if w == nil {
		close(done)
		return done
	}
	go func() {
		defer close(done)
		defer w.Close()
		for m := range w.Events() { // closed when the session ends
			ev, ok := m.(*interfaces.SwInterfaceEvent)
			const up = interface_types.IF_STATUS_API_FLAG_ADMIN_UP | interface_types.IF_STATUS_API_FLAG_LINK_UP
			switch {
			case !ok:
			case ev.Deleted:
				sess.noteVXLAN(uint32(ev.SwIfIndex), false) // its index may be another interface's next
				c.emit(ctx, Event{Kind: InterfaceDeleted, PID: sess.pid, Version: sess.version, SwIfIndex: uint32(ev.SwIfIndex)})
			case ev.Flags&up == up:
				c.emit(ctx, Event{Kind: InterfaceUp, PID: sess.pid, Version: sess.version, SwIfIndex: uint32(ev.SwIfIndex)})
			}
		}
	}()
	return done
}

// serve probes the connection's health until it fails (returning why) or ctx is done (returning nil).
func (c *Client) serve(ctx context.Context, sess *session) error {
	ticker := time.NewTicker(c.cfg.HealthInterval)
	defer ticker.Stop()
	failures := 0
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		case <-c.kick:
		}
		sent := time.Now().UnixNano()
		pid, err := c.ping(ctx, sess)
		switch {
		case ctx.Err() != nil:
			return nil
		case err == nil && pid != sess.pid:
			return fmt.Errorf("VPP pid changed from %d to %d", sess.pid, pid)
		case err == nil:
			failures = 0
		case errors.Is(err, ErrTimeout):
			if c.lastReply.Load() > sent {
				// VPP answered something else meanwhile: busy, not dead.
				continue
			}
			failures++
			c.log.Warn("VPP health probe got no reply", "timeout", c.cfg.ReplyTimeout, "failures", failures)
			if failures >= healthFailures {
				return fmt.Errorf("VPP not responding: %d health probes unanswered: %w", failures, err)
			}
		default:
			return err
		}
	}
}

// kickHealth asks Run to probe the connection now.
func (c *Client) kickHealth() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// current returns the current session or ErrNotConnected.
func (c *Client) current() (*session, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sess == nil {
		return nil, ErrNotConnected
	}
	return c.sess, nil
}

// opContext returns a context for requests on sess: done when ctx is, or when the session ends, with
// the session's cause. stop releases it.
func (sess *session) opContext(ctx context.Context) (context.Context, func()) {
	octx, cancel := context.WithCancelCause(ctx)
	stopAfter := context.AfterFunc(sess.ctx, func() { cancel(context.Cause(sess.ctx)) })
	return octx, func() {
		stopAfter()
		cancel(nil)
	}
}

// newStream opens a GoVPP stream on sess for one operation, replies buffered up to replies.
func (c *Client) newStream(octx context.Context, sess *session, replies int) (api.Stream, error) {
	s, err := sess.conn.NewStream(octx,
		core.WithRequestSize(1), // the Stream API sends directly; its request channel is unused
		core.WithReplySize(replies),
		core.WithReplyTimeout(c.cfg.ReplyTimeout))
	if err != nil {
		return nil, fmt.Errorf("open stream: %w", err)
	}
	return s, nil
}

// streamError turns a stream's send or receive error into this package's: a lost connection or a
// failed socket wraps ErrNotConnected, an unanswered request ErrTimeout (both ask Run for a health probe
// now), a done ctx is its error.
func (c *Client) streamError(octx context.Context, err error) error {
	if cause := context.Cause(octx); cause != nil && octx.Err() != nil {
		if errors.Is(cause, ErrNotConnected) {
			return cause
		}
		return octx.Err()
	}
	switch {
	case errors.Is(err, core.ErrNotConnected):
		return fmt.Errorf("%w: %w", ErrNotConnected, err)
	case errors.Is(err, ErrTimeout):
		c.noteTimeout()
		c.kickHealth()
		return fmt.Errorf("no reply within %v: %w", c.cfg.ReplyTimeout, ErrTimeout)
	case errors.As(err, new(net.Error)):
		// The socket failed (VPP hung up): the connection is lost, Run will notice at its next probe.
		c.kickHealth()
		return fmt.Errorf("%w: %w", ErrNotConnected, err)
	default:
		return err
	}
}

// call sends one request on its own stream and returns its reply, or an error wrapping api.VPPApiError
// if the reply's retval is not 0.
func (c *Client) call(ctx context.Context, sess *session, req api.Message) (api.Message, error) {
	return c.callExpecting(ctx, sess, req)
}

// callExpecting is call for a request to which the retvals in expected are answers, not failures (an
// ensure's "already exists"): they are returned all the same, but not counted as API errors.
func (c *Client) callExpecting(ctx context.Context, sess *session, req api.Message, expected ...api.VPPApiError) (api.Message, error) {
	octx, stop := sess.opContext(ctx)
	defer stop()
	s, err := c.newStream(octx, sess, 2)
	if err != nil {
		return nil, err
	}
	defer func() { _ = s.Close() }()
	if err := s.SendMsg(req); err != nil {
		return nil, c.failed(req, c.streamError(octx, err))
	}
	reply, err := s.RecvMsg()
	if err != nil {
		return nil, c.failed(req, c.streamError(octx, err))
	}
	c.noteReply()
	if err := replyError(reply); err != nil {
		var rv api.VPPApiError
		if !errors.As(err, &rv) || !slices.Contains(expected, rv) {
			c.metrics.apiError(req.GetMessageName())
		}
		return reply, err
	}
	return reply, nil
}

// failed counts err against req's message if VPP did not answer in time, and returns err.
func (c *Client) failed(req api.Message, err error) error {
	if errors.Is(err, ErrTimeout) {
		c.metrics.apiError(req.GetMessageName())
	}
	return err
}

// noteReply records that VPP just answered, ending a stall.
func (c *Client) noteReply() {
	c.lastReply.Store(time.Now().UnixNano())
	if c.stalledSince.Load() != 0 && c.stalledSince.Swap(0) != 0 {
		c.mu.Lock() // against a teardown setting it to 0 meanwhile
		if c.sess != nil {
			c.metrics.setConnected(true)
		}
		c.mu.Unlock()
		c.log.Info("VPP answers again")
	}
}

// noteTimeout records that a request went unanswered for ReplyTimeout; when VPP answered nothing else
// meanwhile either, it is stalled: vpp_connected is 0 from then on until it answers or the connection
// ends, and Status says so at once, instead of after the two unanswered health probes that end the
// connection.
func (c *Client) noteTimeout() {
	now := time.Now().UnixNano()
	if now-c.lastReply.Load() < int64(c.cfg.ReplyTimeout) || !c.Connected() {
		return
	}
	if c.stalledSince.CompareAndSwap(0, now) {
		c.metrics.setConnected(false)
		c.log.Warn("VPP is not answering: no reply to anything within the reply timeout", "timeout", c.cfg.ReplyTimeout)
	}
}

// replyError returns the api.VPPApiError of a reply's non-zero retval, else nil.
func replyError(reply api.Message) error {
	var rv int32
	switch r := reply.(type) {
	case *ip.IPRouteAddDelReply:
		rv = r.Retval
	case *ip.IPTableAddDelReply:
		rv = r.Retval
	case *interfaces.SwInterfaceSetFlagsReply:
		rv = r.Retval
	case *interfaces.SwInterfaceAddDelAddressReply:
		rv = r.Retval
	case *vpe.ShowVersionReply:
		rv = r.Retval
	case *memclnt.ControlPingReply:
		rv = r.Retval
	case *interfaces.WantInterfaceEventsReply:
		rv = r.Retval
	case *ipip.IpipAddTunnelReply:
		rv = r.Retval
	case *ipip.IpipDelTunnelReply:
		rv = r.Retval
	case *interfaces.SwInterfaceSetUnnumberedReply:
		rv = r.Retval
	case *interfaces.SwInterfaceSetMtuReply:
		rv = r.Retval
	case *interfaces.SwInterfaceTagAddDelReply:
		rv = r.Retval
	case *interfaces.SwInterfaceSetMacAddressReply:
		rv = r.Retval
	case *vlib.AddNodeNextReply:
		rv = r.Retval
	case *ip_neighbor.IPNeighborAddDelReply:
		rv = r.Retval
	case *vxlan.VxlanAddDelTunnelV3Reply:
		rv = r.Retval
	default:
		// A reply not listed above still has its retval checked (as GoVPP's channels do), so that a new
		// request's failure is never taken for success.
		if f := reflect.Indirect(reflect.ValueOf(reply)).FieldByName("Retval"); f.IsValid() && f.Kind() == reflect.Int32 {
			rv = int32(f.Int())
		}
	}
	return api.RetvalToVPPApiError(rv)
}
