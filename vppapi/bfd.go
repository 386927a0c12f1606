package vppapi

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"go.fd.io/govpp/api"
	"go.fd.io/govpp/binapi/bfd"
	"go.fd.io/govpp/binapi/interface_types"
	"go.fd.io/govpp/binapi/ip_types"
	"go.fd.io/govpp/core"

	"github.com/vpp-route-agent/vpp-route-agent/internal/netaddr"
)

// Single-hop BFD (RFC 5880/5881) sessions in VPP (vnet core: every build has them). VPP ties a session to
// the neighbour adjacency (peer, interface): every route path through that adjacency forwards only while
// the session is Up, and a session that was never Up counts as down (VPP 26.06 src/vnet/adj/adj_bfd.c). VPP does
// that pruning itself; this file only creates, changes, deletes and reads sessions, and reports their
// state changes.

var (
	// ErrBFDExists is wrapped by AddBFDSession's error when VPP already has a session of that key (VPP's
	// -101, BFD_EEXIST; errors.Is matches api.BFD_EEXIST too).
	ErrBFDExists = errors.New("BFD session already exists")
	// ErrBFDNotFound is wrapped by ModifyBFDSession's and SetBFDAdminUp's errors when VPP has no session
	// of that key (-102, BFD_ENOENT). DeleteBFDSession takes a missing session as deleted.
	ErrBFDNotFound = errors.New("no such BFD session")
	// ErrBFDInvalid is wrapped when VPP refuses a session's values (-73, INVALID_ARGUMENT: a detect
	// multiplier or desired min TX of 0, local and peer of different families). BFDSession.Validate
	// catches these before anything is sent; VPP's answer is mapped all the same.
	ErrBFDInvalid = errors.New("invalid BFD session parameters")
	// ErrNoBFD is wrapped by the BFD operations' errors when the connected VPP lacks the BFD messages
	// (with this package's CRCs). VPP 26.06 has them all in its core.
	ErrNoBFD = errors.New("VPP has no (compatible) BFD API")
)

// bfdEventBuffer is the capacity of the BFDEvents channel and of GoVPP's subscription buffers under it.
// Each state change of each session is one event: 500 sessions going Down and Up again is 1,000.
const bfdEventBuffer = 4096

// bfdMessages are the BFD messages this package uses, all in VPP's core. They are optional, like the
// vxlan plugin's: a VPP without them is still compatible, and the BFD operations fail with ErrNoBFD.
func bfdMessages() []api.Message {
	return []api.Message{
		(*bfd.BfdUDPAdd)(nil), (*bfd.BfdUDPAddReply)(nil),
		(*bfd.BfdUDPMod)(nil), (*bfd.BfdUDPModReply)(nil),
		(*bfd.BfdUDPDel)(nil), (*bfd.BfdUDPDelReply)(nil),
		(*bfd.BfdUDPSessionSetFlags)(nil), (*bfd.BfdUDPSessionSetFlagsReply)(nil),
		(*bfd.BfdUDPSessionDump)(nil), (*bfd.BfdUDPSessionDetails)(nil),
		(*bfd.WantBfdEvents)(nil), (*bfd.WantBfdEventsReply)(nil),
		(*bfd.BfdUDPSessionEvent)(nil),
	}
}

// BFDState is a session's state as VPP numbers it (enum bfd_state). Only BFDUp lets routes use the
// adjacency; the others all count as down.
type BFDState uint8

// BFD states.
const (
	BFDAdminDown BFDState = 0
	BFDDown      BFDState = 1
	BFDInit      BFDState = 2
	BFDUp        BFDState = 3
)

// String returns "admin-down", "down", "init", "up" or the number.
func (s BFDState) String() string {
	switch s {
	case BFDAdminDown:
		return "admin-down"
	case BFDDown:
		return "down"
	case BFDInit:
		return "init"
	case BFDUp:
		return "up"
	}
	return "BFDState(" + strconv.Itoa(int(s)) + ")"
}

// BFDKey is what VPP keys a single-hop session by: the interface, our address and the peer's.
type BFDKey struct {
	SwIfIndex   uint32
	Local, Peer netip.Addr
}

// String names the session for errors and logs: "BFD 192.0.2.1 -> 192.0.2.2 on sw_if_index 1".
func (k BFDKey) String() string {
	return "BFD " + k.Local.String() + " -> " + k.Peer.String() + " on sw_if_index " + strconv.FormatUint(uint64(k.SwIfIndex), 10)
}

// validate checks the addresses of the key.
func (k BFDKey) validate() error {
	switch {
	case !k.Local.IsValid() || !k.Peer.IsValid():
		return errors.New("local and peer addresses needed")
	case netaddr.CanonicalAddr(k.Local).Is4() != netaddr.CanonicalAddr(k.Peer).Is4():
		return errors.New("local and peer addresses of different families")
	case k.SwIfIndex == noInterface:
		return errors.New("a single-hop session needs an interface")
	}
	return nil
}

// BFDSession is a session's configuration. VPP's API takes the intervals in microseconds: they are
// truncated to whole microseconds.
type BFDSession struct {
	BFDKey
	// DesiredMinTx is how often we would like to send (at least 1µs; VPP sends at most once a second
	// while the session is not Up, as RFC 5880 requires).
	DesiredMinTx time.Duration
	// RequiredMinRx is the fastest we accept to receive; 0 asks the peer to send nothing.
	RequiredMinRx time.Duration
	// DetectMult is the detection multiplier (at least 1): the peer declares us down after DetectMult
	// intervals without a packet.
	DetectMult uint8
}

// maxBFDInterval is the largest interval VPP's u32 of microseconds carries.
const maxBFDInterval = time.Duration(^uint32(0)) * time.Microsecond

// Validate checks what VPP would refuse (-73, -2), and intervals that do not fit its u32 of
// microseconds, so that a bad session fails before it is sent.
func (s BFDSession) Validate() error {
	if err := s.BFDKey.validate(); err != nil {
		return err
	}
	switch {
	case s.DetectMult == 0:
		return fmt.Errorf("%w: detect multiplier 0", ErrBFDInvalid)
	case s.DesiredMinTx < time.Microsecond:
		return fmt.Errorf("%w: desired min TX %v is below 1µs", ErrBFDInvalid, s.DesiredMinTx)
	case s.RequiredMinRx < 0:
		return fmt.Errorf("%w: required min RX %v is negative", ErrBFDInvalid, s.RequiredMinRx)
	case s.DesiredMinTx > maxBFDInterval || s.RequiredMinRx > maxBFDInterval:
		return fmt.Errorf("%w: intervals above %v do not fit VPP's API", ErrBFDInvalid, maxBFDInterval)
	}
	return nil
}

// String names the session with its timers: "BFD 192.0.2.1 -> 192.0.2.2 on sw_if_index 1 300ms/300ms x3".
func (s BFDSession) String() string {
	return s.BFDKey.String() + " " + s.DesiredMinTx.String() + "/" + s.RequiredMinRx.String() + " x" +
		strconv.Itoa(int(s.DetectMult))
}

// BFDSessionState is a session as VPP reports it (bfd_udp_session_dump, bfd_udp_session_event): the
// configured timers, not the negotiated ones, and its state.
type BFDSessionState struct {
	BFDSession
	State BFDState
}

// BFDEvent is one state change VPP reported (bfd_udp_session_event): VPP sends one on every local state
// change of a session, none at its creation nor at its deletion.
type BFDEvent struct {
	BFDSessionState
	// PID is VPP's pid on the connection that delivered it: an event from before a restart is stale.
	PID uint32
}

// HasBFD reports whether the connected VPP has this package's BFD messages; false when disconnected.
func (c *Client) HasBFD() bool {
	sess, err := c.current()
	return err == nil && sess.bfd
}

// bfdSession returns the current session if its VPP has BFD.
func (c *Client) bfdSession() (*session, error) {
	sess, err := c.current()
	if err == nil && !sess.bfd {
		err = ErrNoBFD
	}
	return sess, err
}

// bfdError maps VPP's BFD retvals to this package's errors; the api.VPPApiError stays wrapped too.
func bfdError(err error) error {
	switch {
	case errors.Is(err, api.BFD_EEXIST):
		return fmt.Errorf("%w: %w", ErrBFDExists, err)
	case errors.Is(err, api.BFD_ENOENT):
		return fmt.Errorf("%w: %w", ErrBFDNotFound, err)
	case errors.Is(err, api.INVALID_ARGUMENT):
		return fmt.Errorf("%w: %w", ErrBFDInvalid, err)
	case errors.Is(err, api.INVALID_SW_IF_INDEX):
		return fmt.Errorf("%w: %w", ErrNoInterface, err)
	}
	return err
}

// micros converts an interval to VPP's microseconds (Validate bounds it).
func micros(d time.Duration) uint32 { return uint32(d / time.Microsecond) }

// AddBFDSession creates session s in VPP and starts it. Until the peer answers and the session comes
// Up, every route path via (s.Peer, s.SwIfIndex) drops: open sessions only to peers that run BFD. A
// session of the same key fails with ErrBFDExists; an unknown interface with ErrNoInterface.
func (c *Client) AddBFDSession(ctx context.Context, s BFDSession) error {
	if err := s.Validate(); err != nil {
		return fmt.Errorf("add %v: %w", s, err)
	}
	sess, err := c.bfdSession()
	if err == nil {
		local, peer := mustAPIAddress(s.Local), mustAPIAddress(s.Peer)
		// An existing session is an answer, not counted as an API error: a caller re-asserting its
		// sessions after a lost reply meets it.
		_, err = c.callExpecting(ctx, sess, &bfd.BfdUDPAdd{SwIfIndex: interface_types.InterfaceIndex(s.SwIfIndex),
			DesiredMinTx: micros(s.DesiredMinTx), RequiredMinRx: micros(s.RequiredMinRx),
			LocalAddr: local, PeerAddr: peer, DetectMult: s.DetectMult}, api.BFD_EEXIST)
	}
	if err != nil {
		return fmt.Errorf("add %v: %w", s, bfdError(err))
	}
	return nil
}

// ModifyBFDSession changes the timers and multiplier of the existing session of s's key (ErrBFDNotFound
// if VPP has none). VPP keeps the session's state; changing the intervals of an Up session starts a poll
// sequence with the peer, changing only the multiplier does not.
func (c *Client) ModifyBFDSession(ctx context.Context, s BFDSession) error {
	if err := s.Validate(); err != nil {
		return fmt.Errorf("modify %v: %w", s, err)
	}
	sess, err := c.bfdSession()
	if err == nil {
		_, err = c.call(ctx, sess, &bfd.BfdUDPMod{SwIfIndex: interface_types.InterfaceIndex(s.SwIfIndex),
			DesiredMinTx: micros(s.DesiredMinTx), RequiredMinRx: micros(s.RequiredMinRx),
			LocalAddr: mustAPIAddress(s.Local), PeerAddr: mustAPIAddress(s.Peer), DetectMult: s.DetectMult})
	}
	if err != nil {
		return fmt.Errorf("modify %v: %w", s, bfdError(err))
	}
	return nil
}

// DeleteBFDSession deletes the session of key k. A session VPP does not have (-102) counts as deleted:
// nil. VPP sends no event for it, and paths via its adjacency forward again at once (an untracked
// adjacency counts as up).
func (c *Client) DeleteBFDSession(ctx context.Context, k BFDKey) error {
	if err := k.validate(); err != nil {
		return fmt.Errorf("delete %v: %w", k, err)
	}
	sess, err := c.bfdSession()
	if err == nil {
		_, err = c.callExpecting(ctx, sess, &bfd.BfdUDPDel{SwIfIndex: interface_types.InterfaceIndex(k.SwIfIndex),
			LocalAddr: mustAPIAddress(k.Local), PeerAddr: mustAPIAddress(k.Peer)}, api.BFD_ENOENT)
		if errors.Is(err, api.BFD_ENOENT) {
			err = nil
		}
	}
	if err != nil {
		return fmt.Errorf("delete %v: %w", k, bfdError(err))
	}
	return nil
}

// SetBFDAdminUp sets the session of key k administratively up or down (bfd_udp_session_set_flags). An
// admin-down session reports BFDAdminDown at once, tells the peer (which goes Down), and its paths drop
// like any session's not Up; admin up starts it again from Down.
func (c *Client) SetBFDAdminUp(ctx context.Context, k BFDKey, up bool) error {
	if err := k.validate(); err != nil {
		return fmt.Errorf("set %v admin up=%t: %w", k, up, err)
	}
	sess, err := c.bfdSession()
	if err == nil {
		var flags interface_types.IfStatusFlags
		if up {
			flags = interface_types.IF_STATUS_API_FLAG_ADMIN_UP
		}
		_, err = c.call(ctx, sess, &bfd.BfdUDPSessionSetFlags{SwIfIndex: interface_types.InterfaceIndex(k.SwIfIndex),
			LocalAddr: mustAPIAddress(k.Local), PeerAddr: mustAPIAddress(k.Peer), Flags: flags})
	}
	if err != nil {
		return fmt.Errorf("set %v admin up=%t: %w", k, up, bfdError(err))
	}
	return nil
}

// DumpBFDSessions returns every UDP BFD session VPP has, with its configured timers and current state,
// in VPP's order. Multi-hop sessions have SwIfIndex ~0.
func (c *Client) DumpBFDSessions(ctx context.Context) ([]BFDSessionState, error) {
	sess, err := c.bfdSession()
	if err != nil {
		return nil, fmt.Errorf("dump BFD sessions: %w", err)
	}
	var out []BFDSessionState
	err = c.dump(ctx, sess, &bfd.BfdUDPSessionDump{}, func(m api.Message) error {
		d, ok := m.(*bfd.BfdUDPSessionDetails)
		if !ok {
			return fmt.Errorf("unexpected %s in the dump", m.GetMessageName())
		}
		st, err := bfdStateFromAPI(uint32(d.SwIfIndex), d.LocalAddr, d.PeerAddr, d.DesiredMinTx, d.RequiredMinRx, d.DetectMult, d.State)
		if err != nil {
			return err
		}
		out = append(out, st)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("dump BFD sessions: %w", err)
	}
	return out, nil
}

// bfdStateFromAPI converts the fields common to bfd_udp_session_details and bfd_udp_session_event.
func bfdStateFromAPI(swIfIndex uint32, local, peer ip_types.Address, tx, rx uint32, mult uint8, state bfd.BfdState) (BFDSessionState, error) {
	l, err := fromAPIAddress(local)
	if err != nil {
		return BFDSessionState{}, fmt.Errorf("BFD session local address: %w", err)
	}
	p, err := fromAPIAddress(peer)
	if err != nil {
		return BFDSessionState{}, fmt.Errorf("BFD session peer address: %w", err)
	}
	return BFDSessionState{
		BFDSession: BFDSession{
			BFDKey:        BFDKey{SwIfIndex: swIfIndex, Local: l, Peer: p},
			DesiredMinTx:  time.Duration(tx) * time.Microsecond,
			RequiredMinRx: time.Duration(rx) * time.Microsecond,
			DetectMult:    mult,
		},
		State: BFDState(state),
	}, nil
}

// mustAPIAddress converts an address already validated.
func mustAPIAddress(a netip.Addr) (out ip_types.Address) {
	out, _ = toAPIAddress(netaddr.CanonicalAddr(a))
	return out
}

// BFDEvents delivers the state changes VPP reports for every BFD session, in order, from every
// connection (each event names VPP's pid). It never blocks the client: when the consumer falls behind
// and the channel is full, the event is dropped, counted (BFDEventsLost) and BFDResync signalled.
func (c *Client) BFDEvents() <-chan BFDEvent { return c.bfd.events }

// BFDResync is signalled (coalesced: capacity one) whenever the consumer's picture of the sessions may be
// stale and it should read them again with DumpBFDSessions: after each new subscription on a
// (re)connection, and when an event was dropped. GoVPP itself drops an event when its own buffer is full
// (only logged, "Unable to deliver the notification"): that this package cannot see, which is why a
// consumer should also dump on a timer.
func (c *Client) BFDResync() <-chan struct{} { return c.bfd.resync }

// BFDEventsLost counts the events dropped because the BFDEvents channel was full (also the metric
// vpp_route_agent_bfd_events_lost_total).
func (c *Client) BFDEventsLost() uint64 { return c.bfd.lost.Load() }

// bfdEvents is the delivery of BFD events to the client's consumer.
type bfdEvents struct {
	events chan BFDEvent
	resync chan struct{}
	lost   atomic.Uint64
}

func newBFDEvents() bfdEvents {
	return bfdEvents{events: make(chan BFDEvent, bfdEventBuffer), resync: make(chan struct{}, 1)}
}

func (b *bfdEvents) signalResync() {
	select {
	case b.resync <- struct{}{}:
	default:
	}
}

// watchBFD subscribes to VPP's BFD events on sess (want_bfd_events, again on every connection: VPP
// forgets it with its client) and forwards them from a goroutine that ends with the session; the
// returned channel is closed then. A second registration by the same client is -31
// (INVALID_REGISTRATION) in VPP: the subscription stands, which is what was asked. Without it (no BFD, or
// refused) only dumps tell the state.
func (c *Client) watchBFD(ctx context.Context, sess *session) <-chan struct{} {
	done := make(chan struct{})
	if !sess.bfd {
		close(done)
		return done
	}
	w, err := sess.conn.WatchEventWithOptions(sess.ctx, (*bfd.BfdUDPSessionEvent)(nil),
		core.WithEventBufferSize(bfdEventBuffer), core.WithNotifBufferSize(bfdEventBuffer))
	if err == nil {
		_, err = c.callExpecting(ctx, sess, &bfd.WantBfdEvents{EnableDisable: true, PID: uint32(os.Getpid())}, api.INVALID_REGISTRATION)
		if errors.Is(err, api.INVALID_REGISTRATION) {
			err = nil
		}
		if err != nil {
			w.Close()
		}
	}
	if err != nil {
		c.log.Warn("subscribing to VPP's BFD events failed: BFD state is known only from dumps", "error", err)
		close(done)
		c.bfd.signalResync()
		return done
	}
	c.bfd.signalResync() // whatever changed while not subscribed is read by the consumer's dump
	go func() {
		defer close(done)
		defer w.Close()
		for m := range w.Events() { // closed when the session ends
			ev, ok := m.(*bfd.BfdUDPSessionEvent)
			if !ok {
				continue
			}
			st, err := bfdStateFromAPI(uint32(ev.SwIfIndex), ev.LocalAddr, ev.PeerAddr, ev.DesiredMinTx, ev.RequiredMinRx, ev.DetectMult, ev.State)
			if err != nil {
				c.log.Warn("malformed BFD event, reading the sessions again", "error", err)
				c.bfd.signalResync()
				continue
			}
			select {
			case c.bfd.events <- BFDEvent{BFDSessionState: st, PID: sess.pid}:
			default:
				c.bfd.lost.Add(1)
				c.metrics.bfdEventLost()
				c.bfd.signalResync()
			}
		}
	}()
	return done
}
