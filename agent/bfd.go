package agent

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/vppapi"
)

// BFD to the other nodes (--bfd). VPP ties a single-hop session to the adjacency (peer IP, uplink): while
// the session is not Up, every route path via that adjacency leaves forwarding, at once and without the
// agent (VPP 26.06 src/vnet/adj/adj_bfd.c). So the agent only keeps the sessions equal to what it wants, and
// never rewrites a route on a BFD transition: a flapping peer costs no FIB write.
//
// Wanted: one session per (ready uplink, its address of a family, a valid peer IP of another node of that
// family on that address's subnet) when the peer advertises BFD on that IP (blockwatch.Peer.BFD), with the
// configured timers. A peer that does not advertise gets none (VPP counts a session that was never Up as
// down: it would black-hole the peer). A refused peer IP (a duplicate, CheckNextHop) gets none either.
//
// Owned: a session in VPP is the agent's when its interface is one of the ready uplinks, its local address
// one of that uplink's addresses (--uplink-address), and its peer a peer IP another node registers (or
// one this agent made or adopted since it started). Those it does not want are deleted (a peer gone, or
// --bfd off); those it wants are adopted as they are when their timers match (an agent restart flaps
// nothing), modified in place when they do not (never deleted and added again for a timer change), and
// added when missing. Sessions of others (another local address, another interface, a peer no node
// registers: an operator's session to the top-of-rack router) are left alone.

// BFDConfig configures the BFD sessions to the other nodes.
type BFDConfig struct {
	// Enabled advertises BFD on this node's uplink addresses and opens a session to every peer IP that
	// advertises it.
	Enabled bool
	// Interval is the desired min TX and required min RX of every session.
	Interval time.Duration
	// Multiplier is the detect multiplier: a peer is down after Multiplier intervals without a packet.
	Multiplier uint8
}

// BFD defaults (MetalLB's and FRR's: 900 ms to detect) and ranges (MetalLB's BFDProfile).
const (
	DefaultBFDInterval   = 300 * time.Millisecond
	DefaultBFDMultiplier = 3
	MinBFDInterval       = 10 * time.Millisecond
	MaxBFDInterval       = 60 * time.Second
	MinBFDMultiplier     = 2
)

// validate fills in the defaults and checks the ranges, naming the flags.
func (c *BFDConfig) validate() error {
	if c.Interval == 0 {
		c.Interval = DefaultBFDInterval
	}
	if c.Multiplier == 0 {
		c.Multiplier = DefaultBFDMultiplier
	}
	if c.Interval < MinBFDInterval || c.Interval > MaxBFDInterval || c.Interval%time.Microsecond != 0 {
		return fmt.Errorf("--bfd-interval %s: want %s to %s, in whole microseconds", c.Interval, MinBFDInterval, MaxBFDInterval)
	}
	if c.Multiplier < MinBFDMultiplier {
		return fmt.Errorf("--bfd-multiplier %d: want %d to 255", c.Multiplier, MinBFDMultiplier)
	}
	return nil
}

// bfdState is what the agent knows of its sessions; owned by Run.
type bfdState struct {
	// sessions are the agent's sessions in VPP as last read or written, with their state.
	sessions map[vppapi.BFDKey]vppapi.BFDSessionState
	// nodeOf names the node of each wanted peer IP (for logs and /debug/routes).
	nodeOf map[netip.Addr]string
	// read says sessions were read from VPP since it (re)connected; dumpDue asks for a read at the next
	// sync (VPP's BFDResync: an event may be lost).
	read, dumpDue bool
	// unsupported says the connected VPP has no BFD API (logged once per connection).
	unsupported bool
	// noLocalLogged are the uplinks without an address of a family a BFD peer needs, as logged.
	noLocalLogged map[string]struct{}
}

func newBFDState() bfdState {
	return bfdState{sessions: map[vppapi.BFDKey]vppapi.BFDSessionState{}, nodeOf: map[netip.Addr]string{},
		noLocalLogged: map[string]struct{}{}}
}

// ownsBFD reports whether session key k is the agent's (see the top of the file); known are the peer IPs
// the other nodes register, had the sessions the agent knew before this read.
func (a *Agent) ownsBFD(k vppapi.BFDKey, known map[netip.Addr]struct{}, had map[vppapi.BFDKey]vppapi.BFDSessionState) bool {
	_, isPeer := known[k.Peer]
	_, mine := had[k]
	if !isPeer && !mine {
		return false
	}
	for _, u := range a.uplinks {
		if u.phase == uplinkReady && u.index == k.SwIfIndex &&
			slices.ContainsFunc(u.cfg.Addresses, func(p netip.Prefix) bool { return p.Addr() == k.Local }) {
			return true
		}
	}
	return false
}

// wantedBFD returns the sessions the agent wants now, and records the node of each peer IP.
func (a *Agent) wantedBFD() map[vppapi.BFDKey]vppapi.BFDSession {
	want := map[vppapi.BFDKey]vppapi.BFDSession{}
	if !a.cfg.BFD.Enabled {
		return want
	}
	clear(a.bfd.nodeOf)
	for node, p := range a.desired.peers {
		if node == a.cfg.NodeName || p.BFD.Len() == 0 {
			continue
		}
		advertised := p.BFD.All()
		for _, ip := range append(p.IPv4s(), p.IPv6s()...) {
			if !slices.Contains(advertised, ip) {
				continue
			}
			on := false
			for _, u := range a.uplinks {
				for _, pf := range u.cfg.Addresses {
					if pf.Addr().Is6() != ip.Is6() || !pf.Contains(ip) || pf.Addr() == ip {
						continue
					}
					on = true
					if u.phase != uplinkReady {
						continue
					}
					k := vppapi.BFDKey{SwIfIndex: u.index, Local: pf.Addr(), Peer: ip}
					want[k] = vppapi.BFDSession{BFDKey: k, DesiredMinTx: a.cfg.BFD.Interval, RequiredMinRx: a.cfg.BFD.Interval,
						DetectMult: a.cfg.BFD.Multiplier}
					a.bfd.nodeOf[ip] = node
				}
			}
			if !on {
				a.noteOffUplink(node, ip) // logged once and counted, as for its routes
			}
		}
	}
	return want
}

// syncBFD brings the agent's sessions to those it wants, reading them from VPP first when they were not
// read since VPP connected or when asked (readBack, or a lost event). It writes nothing to routes.
func (a *Agent) syncBFD(ctx context.Context, readBack bool) {
	if !a.vppUp || a.cfg.DryRun || a.vppStalled() || !a.uplinksReady() || a.rebinding() {
		return
	}
	if !a.cfg.BFD.Enabled && a.bfd.read && len(a.bfd.sessions) == 0 && !readBack {
		return // nothing to do until the next read (a resync) finds sessions left by an earlier run
	}
	if !a.dp.HasBFD() {
		if !a.bfd.unsupported && a.cfg.BFD.Enabled {
			a.log.Warn("VPP has no (compatible) BFD API: no BFD sessions; routes go on without peer failure detection")
		}
		a.bfd.unsupported = true
		a.m.bfdUnsupported.Set(b2f(a.cfg.BFD.Enabled))
		return
	}
	a.bfd.unsupported = false
	a.m.bfdUnsupported.Set(0)
	if readBack || !a.bfd.read || a.bfd.dumpDue {
		if err := a.readBFD(ctx); err != nil {
			a.log.Warn("cannot read VPP's BFD sessions; retrying", "err", err)
			a.scheduleRetry()
			return
		}
	}
	want := a.wantedBFD()
	for _, k := range sortedBFDKeys(want) {
		w := want[k]
		have, ok := a.bfd.sessions[k]
		switch {
		case !ok:
			err := a.dp.AddBFDSession(ctx, w)
			if errors.Is(err, vppapi.ErrBFDExists) {
				err = a.dp.ModifyBFDSession(ctx, w) // made by a request whose reply was lost: take its timers
			}
			a.m.bfdOps.WithLabelValues("add", result(err)).Inc()
			if err != nil {
				a.log.Warn("cannot create a BFD session; retrying", "node", a.bfd.nodeOf[k.Peer], "err", err)
				a.scheduleRetry()
				continue
			}
			a.log.Info("BFD session created", "node", a.bfd.nodeOf[k.Peer], "peer", k.Peer, "local", k.Local, "sw_if_index", k.SwIfIndex)
			a.bfd.sessions[k] = vppapi.BFDSessionState{BFDSession: w, State: vppapi.BFDDown}
		case have.BFDSession != w:
			err := a.dp.ModifyBFDSession(ctx, w)
			a.m.bfdOps.WithLabelValues("modify", result(err)).Inc()
			if err != nil {
				a.log.Warn("cannot change a BFD session's timers", "node", a.bfd.nodeOf[k.Peer], "err", err)
				if errors.Is(err, vppapi.ErrBFDNotFound) {
					delete(a.bfd.sessions, k) // added at the next sync
				}
				continue
			}
			have.BFDSession = w
			a.bfd.sessions[k] = have
		}
	}
	for _, k := range sortedBFDKeys(a.bfd.sessions) {
		if _, ok := want[k]; ok {
			continue
		}
		err := a.dp.DeleteBFDSession(ctx, k)
		a.m.bfdOps.WithLabelValues("delete", result(err)).Inc()
		if err != nil {
			a.log.Warn("cannot delete a BFD session", "err", err)
			continue
		}
		a.log.Info("BFD session deleted", "peer", k.Peer, "local", k.Local, "sw_if_index", k.SwIfIndex)
		delete(a.bfd.sessions, k)
	}
	a.bfdGauges()
}

// readBFD replaces the agent's picture of its sessions with VPP's.
func (a *Agent) readBFD(ctx context.Context) error {
	all, err := a.dp.DumpBFDSessions(ctx)
	if err != nil {
		return err
	}
	old := a.bfd.sessions
	known := a.knownPeerIPs()
	a.bfd.sessions = map[vppapi.BFDKey]vppapi.BFDSessionState{}
	for _, s := range all {
		if !a.ownsBFD(s.BFDKey, known, old) {
			continue
		}
		if prev, ok := old[s.BFDKey]; ok && prev.State != s.State && a.bfd.read {
			a.bfdTransition(s.BFDKey, prev.State, s.State) // an event lost, or missed while not subscribed
		}
		a.bfd.sessions[s.BFDKey] = s
	}
	a.bfd.read, a.bfd.dumpDue = true, false
	return nil
}

// knownPeerIPs are every address another node registers (refused ones too), from the latest snapshot
// (or, while the first list goes on, the peers it brought).
func (a *Agent) knownPeerIPs() map[netip.Addr]struct{} {
	peers := a.desired.peers
	if a.snap != nil {
		peers = a.snap.Peers
	}
	out := map[netip.Addr]struct{}{}
	for node, p := range peers {
		if node == a.cfg.NodeName {
			continue
		}
		for _, ip := range append(p.IPv4s(), p.IPv6s()...) {
			out[ip] = struct{}{}
		}
	}
	return out
}

// onBFDEvent records a state change VPP reported. It changes no route: VPP itself takes the paths via a
// session that is not Up out of forwarding, and puts them back when it is Up.
func (a *Agent) onBFDEvent(ev vppapi.BFDEvent) {
	if st := a.dp.Status(); !a.vppUp || ev.PID != st.PID {
		return // from a VPP before a restart: the read after the connect tells the truth
	}
	have, ok := a.bfd.sessions[ev.BFDKey]
	if !ok {
		return // not the agent's, or deleted since
	}
	if have.State != ev.State {
		a.bfdTransition(ev.BFDKey, have.State, ev.State)
	}
	have.State = ev.State
	a.bfd.sessions[ev.BFDKey] = have
	a.bfdGauges()
}

// bfdTransition logs and counts a session's change of state.
func (a *Agent) bfdTransition(k vppapi.BFDKey, from, to vppapi.BFDState) {
	a.m.bfdTransitions.WithLabelValues(to.String()).Inc()
	attrs := []any{"node", a.bfd.nodeOf[k.Peer], "peer", k.Peer, "sw_if_index", k.SwIfIndex, "from", from.String(), "to", to.String()}
	switch {
	case to == vppapi.BFDUp:
		a.log.Info("BFD session up: VPP forwards via this peer IP", attrs...)
	case from == vppapi.BFDUp:
		a.log.Info("BFD session down: VPP takes the paths via this peer IP out of forwarding", attrs...)
	default:
		a.log.Debug("BFD session state changed (not up: no forwarding via this peer IP)", attrs...)
	}
}

// reassertBFD deletes and adds again every session of the agent on interface swIfIndex that is not Up:
// after an interface comes up, VPP 26.06 forwards over the paths of such a session until its state next
// changes (VPP 26.06 fib_path.c: its interface-up back-walk resolves the path without asking the adjacency); a new session takes them out of forwarding again.
func (a *Agent) reassertBFD(ctx context.Context, swIfIndex uint32) {
	if !a.vppUp || a.cfg.DryRun || a.vppStalled() || !a.dp.HasBFD() {
		return
	}
	n := 0
	for _, k := range sortedBFDKeys(a.bfd.sessions) {
		s := a.bfd.sessions[k]
		if k.SwIfIndex != swIfIndex || s.State == vppapi.BFDUp {
			continue
		}
		err := a.dp.DeleteBFDSession(ctx, k)
		if err == nil {
			err = a.dp.AddBFDSession(ctx, s.BFDSession)
		}
		a.m.bfdOps.WithLabelValues("reassert", result(err)).Inc()
		if err != nil {
			a.log.Warn("cannot re-create a BFD session after its uplink came up", "peer", k.Peer, "err", err)
			a.bfd.dumpDue = true
			continue
		}
		s.State = vppapi.BFDDown
		a.bfd.sessions[k] = s
		n++
	}
	if n > 0 {
		a.log.Info("an uplink came up: re-created its BFD sessions that are not up (VPP would forward via them otherwise)",
			"sw_if_index", swIfIndex, "sessions", n)
		a.bfdGauges()
	}
}

// bfdGauges sets the session gauges from the agent's picture.
func (a *Agent) bfdGauges() {
	var by [4]int
	for _, s := range a.bfd.sessions {
		if int(s.State) < len(by) {
			by[s.State]++
		}
	}
	for st := vppapi.BFDAdminDown; st <= vppapi.BFDUp; st++ {
		a.m.bfdSessions.WithLabelValues(st.String()).Set(float64(by[st]))
	}
	a.m.bfdPeersDown.Set(float64(len(a.bfdDownPeers())))
}

// bfdDownPeers names the nodes whose every BFD session is not Up: all their paths are out of
// forwarding (their routes drop, see docs/routing.md), sorted.
func (a *Agent) bfdDownPeers() []string {
	up := map[string]bool{}
	for k, s := range a.bfd.sessions {
		node := a.bfd.nodeOf[k.Peer]
		if node == "" {
			continue
		}
		up[node] = up[node] || s.State == vppapi.BFDUp
	}
	var down []string
	for node, u := range up {
		if !u {
			down = append(down, node)
		}
	}
	slices.Sort(down)
	return down
}

// DebugBFD is one BFD session of the agent, for /debug/routes.
type DebugBFD struct {
	Node      string     `json:"node"`
	Peer      netip.Addr `json:"peer"`
	Local     netip.Addr `json:"local"`
	SwIfIndex uint32     `json:"sw_if_index"`
	State     string     `json:"state"`
}

// debugBFD lists the agent's sessions.
func (a *Agent) debugBFD() []DebugBFD {
	out := make([]DebugBFD, 0, len(a.bfd.sessions))
	for _, k := range sortedBFDKeys(a.bfd.sessions) {
		out = append(out, DebugBFD{Node: a.bfd.nodeOf[k.Peer], Peer: k.Peer, Local: k.Local, SwIfIndex: k.SwIfIndex,
			State: a.bfd.sessions[k].State.String()})
	}
	return out
}

// bfdNotes are the lines /readyz shows about BFD; they never make the node unready (a dead peer is
// not this node's fault, and VPP without BFD still routes).
func (a *Agent) bfdNotes() []string {
	var notes []string
	if a.cfg.BFD.Enabled && a.bfd.unsupported {
		notes = append(notes, "VPP has no BFD API: no peer failure detection (routing goes on)")
	}
	if down := a.bfdDownPeers(); len(down) > 0 {
		notes = append(notes, "BFD down (every path out of forwarding): "+strings.Join(down, ", "))
	}
	return notes
}

func sortedBFDKeys[V any](m map[vppapi.BFDKey]V) []vppapi.BFDKey {
	return slices.SortedFunc(maps.Keys(m), func(x, y vppapi.BFDKey) int {
		if c := x.Peer.Compare(y.Peer); c != 0 {
			return c
		}
		if x.SwIfIndex != y.SwIfIndex {
			return int(x.SwIfIndex) - int(y.SwIfIndex)
		}
		return x.Local.Compare(y.Local)
	})
}

func result(err error) string {
	if err != nil {
		return "error"
	}
	return "ok"
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// bfdDownAdjacencies returns the adjacencies (peer IP, uplink) of the agent's sessions that are not Up:
// VPP ties a session to that adjacency, whatever the local address, and forwards over no path via it.
func (a *Agent) bfdDownAdjacencies() map[vppapi.Hop]struct{} {
	out := map[vppapi.Hop]struct{}{}
	for k, s := range a.bfd.sessions {
		if s.State != vppapi.BFDUp {
			out[vppapi.Hop{NextHop: k.Peer, SwIfIndex: k.SwIfIndex}] = struct{}{}
		}
	}
	return out
}
