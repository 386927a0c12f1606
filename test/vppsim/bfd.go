package vppsim

import (
	"fmt"
	"net/netip"
	"slices"
	"time"

	"go.fd.io/govpp/api"
	"go.fd.io/govpp/binapi/bfd"
	"go.fd.io/govpp/binapi/fib_types"
	"go.fd.io/govpp/binapi/interface_types"
	"go.fd.io/govpp/binapi/ip_types"
)

// Single-hop BFD as VPP 26.06 answers it (VPP 26.06 src/vnet/bfd and adj_bfd.c, and its interface down/up defect: see agent/bfd.go):
//   - bfd_udp_add: an unknown sw_if_index -2; detect_mult 0, desired_min_tx 0 or local and peer of
//     different families -73; an existing (sw_if_index, local, peer) -101. A new session is Down, admin up,
//     and sends no event.
//   - bfd_udp_mod, bfd_udp_session_set_flags: a missing session -102 (checked after the -2/-73 ones).
//     mod keeps the state; admin down makes it AdminDown, admin up Down, each with an event.
//   - bfd_udp_del: a missing session -102; no event.
//   - bfd_udp_session_dump: every session in creation order, with its configured timers and state.
//   - want_bfd_events: registering twice or unregistering when not registered -31; the event's pid is 0.
//
// The peer model: there is no BFD on the wire. The test says which peer addresses answer
// (SetBFDPeerAnswering). A session is answered while its peer answers, the session is admin up and its
// interface's link is up; an answered Down session goes Init then Up at once (two events); a session in
// Init or Up that stops being answered goes Down (one event) after its detection time, DetectMult x
// max(desired_min_tx, required_min_rx) (the peer is taken to have the same timers).
//
// Forwarding (Forward): a path via (peer, interface) with a session forwards only while that session is
// Up, except after the interface came up again while the session was not Up: then it forwards (VPP's
// defect, §5.3) until the session's state next changes. Deleting the session gives the path back.

// Return values of the BFD messages.
const (
	rvInvalidArgument int32 = -73
	rvBFDExists       int32 = -101
	rvBFDNoSuchEntry  int32 = -102
)

type bfdKey struct {
	swIfIndex   uint32
	local, peer netip.Addr
}

type bfdSession struct {
	key        bfdKey
	tx, rx     uint32 // µs, as configured
	mult       uint8
	state      bfd.BfdState
	adminDown  bool
	timer      *time.Timer // pending detection-time expiry; nil when none
	defectLive bool        // forwards although not Up: interface came up while not Up (VPP's defect)
}

// BFDSession is a simulated session as the test sees it.
type BFDSession struct {
	SwIfIndex uint32     `json:"sw_if_index"`
	Local     netip.Addr `json:"local"`
	Peer      netip.Addr `json:"peer"`
	State     string     `json:"state"` // "admin-down", "down", "init", "up"
}

func bfdStateName(s bfd.BfdState) string {
	switch s {
	case bfd.BFD_STATE_API_ADMIN_DOWN:
		return "admin-down"
	case bfd.BFD_STATE_API_DOWN:
		return "down"
	case bfd.BFD_STATE_API_INIT:
		return "init"
	case bfd.BFD_STATE_API_UP:
		return "up"
	}
	return fmt.Sprintf("state(%d)", s)
}

// BFDSessions lists the sessions in creation order.
func (s *Sim) BFDSessions() []BFDSession {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]BFDSession, 0, len(s.bfdSessions))
	for _, b := range s.bfdSessions {
		out = append(out, BFDSession{SwIfIndex: b.key.swIfIndex, Local: b.key.local, Peer: b.key.peer, State: bfdStateName(b.state)})
	}
	return out
}

// SetBFDPeerAnswering says whether the simulated neighbour at addr runs BFD and answers (see the peer
// model above); it applies to every session to addr, now and later. A killed peer is
// SetBFDPeerAnswering(addr, false).
func (s *Sim) SetBFDPeerAnswering(addr netip.Addr, answering bool) {
	s.mu.Lock()
	if answering {
		s.bfdPeers[addr.Unmap()] = struct{}{}
	} else {
		delete(s.bfdPeers, addr.Unmap())
	}
	evs := s.bfdUpdateAll()
	s.mu.Unlock()
	s.sendBFDEvents(evs)
}

// bfdAnswered reports whether b's peer answers it now. Call with s.mu held.
func (s *Sim) bfdAnswered(b *bfdSession) bool {
	_, ok := s.bfdPeers[b.key.peer]
	ifc := s.ifaceAt(b.key.swIfIndex)
	return ok && !b.adminDown && ifc != nil && ifc.linkUp()
}

// bfdSetState changes b's state, ends the defect and returns the event. Call with s.mu held.
func (s *Sim) bfdSetState(b *bfdSession, st bfd.BfdState) []bfd.BfdUDPSessionEvent {
	if b.state == st {
		return nil
	}
	b.state = st
	b.defectLive = false
	return []bfd.BfdUDPSessionEvent{b.event()}
}

// bfdUpdate moves b by the peer model and returns the events. Call with s.mu held.
func (s *Sim) bfdUpdate(b *bfdSession) []bfd.BfdUDPSessionEvent {
	if b.adminDown {
		return nil
	}
	if s.bfdAnswered(b) {
		if b.timer != nil {
			b.timer.Stop()
			b.timer = nil
		}
		var evs []bfd.BfdUDPSessionEvent
		if b.state == bfd.BFD_STATE_API_DOWN {
			evs = s.bfdSetState(b, bfd.BFD_STATE_API_INIT)
		}
		return append(evs, s.bfdSetState(b, bfd.BFD_STATE_API_UP)...)
	}
	if (b.state == bfd.BFD_STATE_API_UP || b.state == bfd.BFD_STATE_API_INIT) && b.timer == nil {
		detect := time.Duration(b.mult) * time.Duration(max(b.tx, b.rx)) * time.Microsecond
		var t *time.Timer
		t = time.AfterFunc(detect, func() {
			s.mu.Lock()
			var evs []bfd.BfdUDPSessionEvent
			if b.timer == t && s.bfdSessions[b.key] == b {
				b.timer = nil
				if !s.bfdAnswered(b) {
					evs = s.bfdSetState(b, bfd.BFD_STATE_API_DOWN)
				}
			}
			s.mu.Unlock()
			s.sendBFDEvents(evs)
		})
		b.timer = t
	}
	return nil
}

// bfdUpdateAll applies the peer model to every session. Call with s.mu held.
func (s *Sim) bfdUpdateAll() []bfd.BfdUDPSessionEvent {
	var evs []bfd.BfdUDPSessionEvent
	for _, k := range s.bfdOrder {
		evs = append(evs, s.bfdUpdate(s.bfdSessions[k])...)
	}
	return evs
}

// bfdLinkChanged is called, with s.mu held, after interface idx's link may have changed from
// wasUp: coming up puts the paths of its sessions that are not Up back into forwarding (VPP's defect);
// then the peer model runs. It returns the events to send.
func (s *Sim) bfdLinkChanged(idx uint32, wasUp bool) []bfd.BfdUDPSessionEvent {
	ifc := s.ifaceAt(idx)
	if ifc != nil && !wasUp && ifc.linkUp() {
		for _, b := range s.bfdSessions {
			if b.key.swIfIndex == idx && b.state != bfd.BFD_STATE_API_UP {
				b.defectLive = true
			}
		}
	}
	return s.bfdUpdateAll()
}

// bfdStopTimers stops every pending detection timer (restart, close). Call with s.mu held.
func (s *Sim) bfdStopTimers() {
	for _, b := range s.bfdSessions {
		if b.timer != nil {
			b.timer.Stop()
			b.timer = nil
		}
	}
}

func (b *bfdSession) event() bfd.BfdUDPSessionEvent {
	return bfd.BfdUDPSessionEvent{
		SwIfIndex: interface_types.InterfaceIndex(b.key.swIfIndex),
		LocalAddr: addressToAPI(b.key.local), PeerAddr: addressToAPI(b.key.peer),
		State: b.state, RequiredMinRx: b.rx, DesiredMinTx: b.tx, DetectMult: b.mult,
	}
}

// sendBFDEvents sends each event to every client registered with want_bfd_events, outside s.mu.
func (s *Sim) sendBFDEvents(evs []bfd.BfdUDPSessionEvent) {
	if len(evs) == 0 || s.faults.Load().DropBFDEvents {
		return
	}
	s.mu.Lock()
	var targets []eventTarget
	for idx := range s.bfdEventRegs {
		if c := s.clients[idx]; c != nil {
			targets = append(targets, eventTarget{c: c, clientIndex: idx})
		}
	}
	s.mu.Unlock()
	for _, ev := range evs {
		for _, t := range targets {
			e := ev // pid stays 0, as VPP sends it
			t.c.sendEvent(&e, t.clientIndex)
		}
	}
}

// bfdKeyFrom checks the common fields of a request: -2 for an unknown interface, -73 for mixed families.
func (s *Sim) bfdKeyFrom(sw interface_types.InterfaceIndex, local, peer ip_types.Address) (bfdKey, int32) {
	if s.ifaceAt(uint32(sw)) == nil {
		return bfdKey{}, rvInvalidSwIfIndex
	}
	if local.Af != peer.Af {
		return bfdKey{}, rvInvalidArgument
	}
	ip6 := local.Af == ip_types.ADDRESS_IP6
	return bfdKey{uint32(sw), addrFromUnion(local.Un, ip6), addrFromUnion(peer.Un, ip6)}, rvOK
}

func handleBFDUDPAdd(s *Sim, c *conn, ctx uint32, msg api.Message) {
	m := msg.(*bfd.BfdUDPAdd)
	s.mu.Lock()
	k, rv := s.bfdKeyFrom(m.SwIfIndex, m.LocalAddr, m.PeerAddr)
	switch {
	case rv != rvOK:
	case m.DetectMult == 0 || m.DesiredMinTx == 0:
		rv = rvInvalidArgument
	case s.bfdSessions[k] != nil:
		rv = rvBFDExists
	default:
		b := &bfdSession{key: k, tx: m.DesiredMinTx, rx: m.RequiredMinRx, mult: m.DetectMult, state: bfd.BFD_STATE_API_DOWN}
		s.bfdSessions[k] = b
		s.bfdOrder = append(s.bfdOrder, k)
	}
	var evs []bfd.BfdUDPSessionEvent
	if rv == rvOK {
		evs = s.bfdUpdate(s.bfdSessions[k])
	}
	s.mu.Unlock()
	c.reply(ctx, &bfd.BfdUDPAddReply{Retval: rv})
	s.sendBFDEvents(evs)
}

func handleBFDUDPMod(s *Sim, c *conn, ctx uint32, msg api.Message) {
	m := msg.(*bfd.BfdUDPMod)
	s.mu.Lock()
	k, rv := s.bfdKeyFrom(m.SwIfIndex, m.LocalAddr, m.PeerAddr)
	switch {
	case rv != rvOK:
	case m.DetectMult == 0 || m.DesiredMinTx == 0:
		rv = rvInvalidArgument
	case s.bfdSessions[k] == nil:
		rv = rvBFDNoSuchEntry
	default:
		b := s.bfdSessions[k]
		b.tx, b.rx, b.mult = m.DesiredMinTx, m.RequiredMinRx, m.DetectMult
	}
	s.mu.Unlock()
	c.reply(ctx, &bfd.BfdUDPModReply{Retval: rv})
}

func handleBFDUDPDel(s *Sim, c *conn, ctx uint32, msg api.Message) {
	m := msg.(*bfd.BfdUDPDel)
	s.mu.Lock()
	k, rv := s.bfdKeyFrom(m.SwIfIndex, m.LocalAddr, m.PeerAddr)
	if rv == rvOK {
		if b := s.bfdSessions[k]; b == nil {
			rv = rvBFDNoSuchEntry
		} else {
			if b.timer != nil {
				b.timer.Stop()
			}
			delete(s.bfdSessions, k)
			s.bfdOrder = slices.DeleteFunc(s.bfdOrder, func(o bfdKey) bool { return o == k })
		}
	}
	s.mu.Unlock()
	c.reply(ctx, &bfd.BfdUDPDelReply{Retval: rv})
}

func handleBFDUDPSessionSetFlags(s *Sim, c *conn, ctx uint32, msg api.Message) {
	m := msg.(*bfd.BfdUDPSessionSetFlags)
	s.mu.Lock()
	k, rv := s.bfdKeyFrom(m.SwIfIndex, m.LocalAddr, m.PeerAddr)
	var evs []bfd.BfdUDPSessionEvent
	if rv == rvOK {
		b := s.bfdSessions[k]
		switch up := m.Flags&interface_types.IF_STATUS_API_FLAG_ADMIN_UP != 0; {
		case b == nil:
			rv = rvBFDNoSuchEntry
		case !up && !b.adminDown:
			b.adminDown = true
			if b.timer != nil {
				b.timer.Stop()
				b.timer = nil
			}
			evs = s.bfdSetState(b, bfd.BFD_STATE_API_ADMIN_DOWN)
		case up && b.adminDown:
			b.adminDown = false
			evs = append(s.bfdSetState(b, bfd.BFD_STATE_API_DOWN), s.bfdUpdate(b)...)
		}
	}
	s.mu.Unlock()
	c.reply(ctx, &bfd.BfdUDPSessionSetFlagsReply{Retval: rv})
	s.sendBFDEvents(evs)
}

func handleBFDUDPSessionDump(s *Sim, c *conn, ctx uint32, _ api.Message) {
	s.mu.Lock()
	out := make([]*bfd.BfdUDPSessionDetails, 0, len(s.bfdOrder))
	for _, k := range s.bfdOrder {
		b := s.bfdSessions[k]
		out = append(out, &bfd.BfdUDPSessionDetails{
			SwIfIndex: interface_types.InterfaceIndex(k.swIfIndex),
			LocalAddr: addressToAPI(k.local), PeerAddr: addressToAPI(k.peer),
			State: b.state, RequiredMinRx: b.rx, DesiredMinTx: b.tx, DetectMult: b.mult,
		})
	}
	s.mu.Unlock()
	for _, d := range out {
		c.send(d, ctx)
	}
}

// handleWantBFDEvents registers or unregisters the client for bfd_udp_session_event; enabling twice or
// disabling when not enabled is -31.
func handleWantBFDEvents(s *Sim, c *conn, ctx uint32, msg api.Message) {
	m := msg.(*bfd.WantBfdEvents)
	s.mu.Lock()
	_, registered := s.bfdEventRegs[c.index]
	rv := rvOK
	switch {
	case m.EnableDisable && registered, !m.EnableDisable && !registered:
		rv = rvInvalidRegistration
	case m.EnableDisable:
		s.bfdEventRegs[c.index] = struct{}{}
	default:
		delete(s.bfdEventRegs, c.index)
	}
	s.mu.Unlock()
	c.reply(ctx, &bfd.WantBfdEventsReply{Retval: rv})
}

// Forward returns the paths of table tableID's longest match for dst that carry traffic, as VPP's
// load-balance would have them: the resolved paths of the best preference that has any. A normal path
// via (next hop, interface) is resolved while the interface's link is up and, when a BFD session tracks
// that adjacency, while the session is Up (or VPP's defect holds, see the top of bfd.go); a recursive path
// while its next hop forwards. Nil means drop (no route, or no path resolved: VPP does not fall back to
// a less specific route).
func (s *Sim) Forward(tableID uint32, dst netip.Addr) []Path {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.forward(tableID, dst.Unmap(), 0)
}

func (s *Sim) forward(tableID uint32, dst netip.Addr, depth int) []Path {
	t := s.tables[tableKey{tableID, dst.Is6()}]
	if t == nil || depth > 8 {
		return nil
	}
	var e *entry
	for b := dst.BitLen(); b >= 0 && e == nil; b-- {
		e = t.entries[netip.PrefixFrom(dst, b).Masked()]
	}
	if e == nil {
		return nil
	}
	_, paths := e.best()
	if e.apiDead && e.api != nil {
		return nil
	}
	best := -1
	var out []Path
	for _, p := range paths {
		if best >= 0 && int(p.preference) > best {
			continue
		}
		if !s.pathResolved(p, depth) {
			continue
		}
		if best < 0 || int(p.preference) < best {
			best, out = int(p.preference), nil
		}
		out = append(out, p.export())
	}
	return out
}

// pathResolved says whether path p contributes forwarding. Call with s.mu held.
func (s *Sim) pathResolved(p fibPath, depth int) bool {
	switch p.typ {
	case fib_types.FIB_API_PATH_TYPE_NORMAL:
	case fib_types.FIB_API_PATH_TYPE_DROP, fib_types.FIB_API_PATH_TYPE_ICMP_UNREACH, fib_types.FIB_API_PATH_TYPE_ICMP_PROHIBIT:
		return false
	default:
		return true
	}
	if p.swIfIndex == ^uint32(0) {
		return p.nh.IsValid() && s.forward(p.tableID, p.nh, depth+1) != nil
	}
	ifc := s.ifaceAt(p.swIfIndex)
	if ifc == nil || !ifc.linkUp() {
		return false
	}
	if !p.nh.IsValid() || p.attached {
		return true
	}
	for _, b := range s.bfdSessions {
		if b.key.swIfIndex == p.swIfIndex && b.key.peer == p.nh {
			return b.state == bfd.BFD_STATE_API_UP || b.defectLive
		}
	}
	return true
}
