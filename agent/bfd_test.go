package agent_test

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/agent"
	"github.com/vpp-route-agent/vpp-route-agent/blockwatch"
	"github.com/vpp-route-agent/vpp-route-agent/internal/netaddr"
	"github.com/vpp-route-agent/vpp-route-agent/test/vppsim"
	"github.com/vpp-route-agent/vpp-route-agent/vppapi"
)

// BFD tests on the simulator: its peer model answers a session while the test says the peer answers
// (SetBFDPeerAnswering), and Forward says what VPP would really forward, BFD and VPP's interface
// down/up defect included.

// fastBFD is a BFD configuration whose sessions go down in 150 ms in the simulator.
var fastBFD = agent.BFDConfig{Enabled: true, Interval: 50 * time.Millisecond, Multiplier: 3}

// bfdSessions lists node name's simulated sessions as "local->peer@sw_if_index state", sorted.
func (c *cluster) bfdSessions(name string) []string {
	var out []string
	for _, s := range c.nodes[name].sim.BFDSessions() {
		out = append(out, fmt.Sprintf("%s->%s@%d %s", s.Local, s.Peer, s.SwIfIndex, s.State))
	}
	slices.Sort(out)
	return out
}

// forwards reports the next hops node name's VPP would really forward dst over (nil: drop).
func (c *cluster) forwards(name, dst string) []string {
	var out []string
	for _, p := range c.nodes[name].sim.Forward(0, netip.MustParseAddr(dst)) {
		out = append(out, fmt.Sprintf("%s@%d", p.NextHop, p.SwIfIndex))
	}
	slices.Sort(out)
	return out
}

// fibWrites counts node name's route writes of every kind and result.
func (c *cluster) fibWrites(name string) float64 {
	return c.metric(name, "vpp_route_agent_route_operations_total")
}

// answer makes node on's VPP see node peer's addresses answer BFD (or not).
func (c *cluster) answer(on, peer string, answering bool) {
	p := c.nodes[peer]
	for _, a := range []netip.Addr{p.peerV4, p.peerV6, p.peer2V4, p.peer2V6} {
		if a.IsValid() {
			c.nodes[on].sim.SetBFDPeerAnswering(a, answering)
		}
	}
}

// TestBFDSessionsOnlyToAdvertisingPeers: a, b run --bfd, c does not. a opens sessions (both families, its
// uplink address as local) to b only: a session to c, which never answers, would black-hole c's blocks.
// When b stops answering, VPP (not the agent: no route write) takes the paths via b out of forwarding; the
// block then drops rather than leaking to a less specific route; /readyz notes b as down but a stays
// ready; b answering again brings the path back.
func TestBFDSessionsOnlyToAdvertisingPeers(t *testing.T) {
	c := newCluster(t, clusterOpts{bfd: fastBFD, noBFD: []string{"c"}}, "a", "b", "c")
	a, b := c.nodes["a"], c.nodes["b"]
	c.answer("a", "b", true)
	c.putBlock("10.244.2.0/26", "b", nil)
	c.putBlock("10.244.3.0/26", "c", nil)
	c.eventually("a", c.want(map[string]string{"10.244.2.0/26": "b", "10.244.3.0/26": "c"}), settle)
	want := []string{
		fmt.Sprintf("%s->%s@1 up", a.peerV4, b.peerV4),
		fmt.Sprintf("%s->%s@1 up", a.peerV6, b.peerV6),
	}
	c.waitFor("a's sessions to b up, none to c", settle, func() bool { return slices.Equal(c.bfdSessions("a"), want) })
	if got := c.forwards("a", "10.244.2.1"); !slices.Equal(got, []string{b.peerV4.String() + "@1"}) {
		t.Errorf("a forwards to b's block via %v", got)
	}
	if got := c.forwards("a", "10.244.3.1"); len(got) != 1 {
		t.Errorf("a forwards to c's block (no BFD) via %v", got)
	}
	c.waitFor("sessions gauge", 5*time.Second, func() bool {
		return c.metric("a", "vpp_route_agent_bfd_sessions", "state", "up") == 2
	})
	writes := c.fibWrites("a")

	c.answer("a", "b", false)
	c.waitFor("b's paths out of forwarding", settle, func() bool { return c.forwards("a", "10.244.2.1") == nil })
	c.waitFor("b noted as down", settle, func() bool {
		return slices.ContainsFunc(a.agent.Notes(), func(n string) bool { return strings.Contains(n, "BFD down") && strings.Contains(n, "b") })
	})
	if ok, missing := a.agent.Ready(); !ok {
		t.Errorf("a down peer made a unready: %v", missing)
	}
	d := c.debug("a")
	if !slices.Equal(d.BFDDown, []string{"b"}) || len(d.BFD) != 2 || d.BFD[0].Node != "b" {
		t.Errorf("/debug/routes BFD: %+v down %v", d.BFD, d.BFDDown)
	}
	i := slices.IndexFunc(d.Programmed, func(r agent.ProgrammedRoute) bool { return r.Prefix.String() == "10.244.2.0/26" })
	if i < 0 || len(d.Programmed[i].PathsDown) != 1 || d.Programmed[i].PathsUp != 0 {
		t.Errorf("/debug/routes route to b: %+v", d.Programmed)
	}
	if v := c.metric("a", "vpp_route_agent_bfd_peers_down"); v != 1 {
		t.Errorf("bfd_peers_down = %v", v)
	}
	if v := c.metric("a", "vpp_route_agent_bfd_transitions_total", "state", "down"); v < 2 {
		t.Errorf("transitions to down = %v, want both sessions", v)
	}

	c.answer("a", "b", true)
	c.waitFor("b forwarded again", settle, func() bool { return c.forwards("a", "10.244.2.1") != nil })
	c.waitFor("no note", settle, func() bool { return len(a.agent.Notes()) == 0 })
	if w := c.fibWrites("a"); w != writes {
		t.Errorf("route writes went from %v to %v on BFD transitions", writes, w)
	}
}

// TestBFDAgentRestartAdoptsAndTimerChangeIsModify: a restarted agent with the same timers adopts its
// sessions (no add, delete or modify: nothing flaps); one with other timers modifies them in place.
func TestBFDAgentRestartAdoptsAndTimerChangeIsModify(t *testing.T) {
	c := newCluster(t, clusterOpts{bfd: fastBFD}, "a", "b")
	c.answer("a", "b", true)
	sim := c.nodes["a"].sim
	c.waitFor("a's sessions up", settle, func() bool {
		s := c.bfdSessions("a")
		return len(s) == 2 && strings.HasSuffix(s[0], " up") && strings.HasSuffix(s[1], " up")
	})
	c.stop("a")
	sim.ResetRequests()
	c.start("a")
	c.waitFor("a resynced", settle, func() bool { return c.nodes["a"].agent.Resynced() })
	c.waitFor("the sessions read back", settle, func() bool {
		return c.metric("a", "vpp_route_agent_bfd_sessions", "state", "up") == 2
	})
	for _, m := range []string{"bfd_udp_add", "bfd_udp_del", "bfd_udp_mod"} {
		if n := sim.CountRequests(m); n != 0 {
			t.Errorf("restart with the same timers: %d %s", n, m)
		}
	}
	if v := c.metric("a", "vpp_route_agent_bfd_transitions_total"); v != 0 {
		t.Errorf("restart: %v transitions", v)
	}

	c.stop("a")
	c.opts.bfd.Interval = 100 * time.Millisecond
	c.start("a")
	c.waitFor("sessions modified", settle, func() bool { return sim.CountRequests("bfd_udp_mod") == 2 })
	if n := sim.CountRequests("bfd_udp_add") + sim.CountRequests("bfd_udp_del"); n != 0 {
		t.Errorf("a timer change added or deleted %d sessions", n)
	}
	if s := c.bfdSessions("a"); len(s) != 2 || !strings.HasSuffix(s[0], " up") {
		t.Errorf("after the timer change: %v", s)
	}
}

// TestBFDSessionsFollowPeers: a peer that withdraws its advertisement loses its sessions (its routes
// stay); a VPP restart gets them back; --bfd off deletes the agent's sessions, leaving others' alone.
func TestBFDSessionsFollowPeers(t *testing.T) {
	c := newCluster(t, clusterOpts{bfd: fastBFD}, "a", "b")
	c.answer("a", "b", true)
	c.putBlock("10.244.2.0/26", "b", nil)
	c.waitFor("a's sessions", settle, func() bool { return len(c.bfdSessions("a")) == 2 })
	sim := c.nodes["a"].sim
	if err := sim.Restart(); err != nil {
		t.Fatal(err)
	}
	c.waitFor("sessions rebuilt after VPP restart", settle, func() bool {
		s := c.bfdSessions("a")
		return len(s) == 2 && strings.HasSuffix(s[0], " up")
	})
	c.waitFor("route back", settle, func() bool { return c.forwards("a", "10.244.2.1") != nil })

	c.stop("b") // its lease lives on: its keys stay, as an agent's restart leaves them
	c.del(blockwatch.PeerBFDKeyAt(hosts, "b", netaddr.V4, 1))
	c.waitFor("the IPv4 session deleted", settle, func() bool { return len(c.bfdSessions("a")) == 1 })
	c.del(blockwatch.PeerBFDKeyAt(hosts, "b", netaddr.V6, 1))
	c.waitFor("the IPv6 session deleted", settle, func() bool { return len(c.bfdSessions("a")) == 0 })
	if got := c.forwards("a", "10.244.2.1"); len(got) != 1 {
		t.Errorf("b's block without BFD forwards via %v", got)
	}
}

// TestBFDOffDeletesOwnSessions: an agent restarted without --bfd deletes the sessions it made (the peers
// no longer see it advertise, so they would go down and drop its routes), not an operator's session from
// the same uplink address to an address no node registers (its top-of-rack router, say).
func TestBFDOffDeletesOwnSessions(t *testing.T) {
	c := newCluster(t, clusterOpts{bfd: fastBFD}, "a", "b")
	a := c.nodes["a"]
	c.waitFor("a's sessions", settle, func() bool { return len(c.bfdSessions("a")) == 2 })
	tor := vppapi.BFDSession{BFDKey: vppapi.BFDKey{SwIfIndex: 1, Local: a.peerV4, Peer: netip.MustParseAddr("192.168.100.254")},
		DesiredMinTx: time.Second, RequiredMinRx: time.Second, DetectMult: 3}
	operatorSession(t, a.sock, tor)
	c.stop("a")
	c.opts.noBFD = []string{"a"}
	c.start("a")
	want := []string{fmt.Sprintf("%s->192.168.100.254@1 down", a.peerV4)}
	c.waitFor("a's sessions deleted, the operator's kept", settle, func() bool { return slices.Equal(c.bfdSessions("a"), want) })
	c.waitFor("a resynced", settle, func() bool { return a.agent.Resynced() })
	if got := c.bfdSessions("a"); !slices.Equal(got, want) {
		t.Errorf("sessions %v, want the operator's %v", got, want)
	}
}

// operatorSession creates session s in the VPP at sock through a client of its own, as an operator would.
func operatorSession(t *testing.T, sock string, s vppapi.BFDSession) {
	t.Helper()
	cl, err := vppapi.New(vppapi.Config{Socket: sock, ReplyTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- cl.Run(ctx) }()
	defer func() { cancel(); <-done }()
	for !cl.Status().Connected {
		if ctx.Err() != nil {
			t.Fatal("operator's client: not connected")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := cl.AddBFDSession(ctx, s); err != nil {
		t.Fatal(err)
	}
}

// TestBFDUplinkDownUpReasserts: b is dead (its session on a is Down, its block drops). a's uplink goes
// down and up: VPP would forward to b again (the defect the simulator reproduces); the agent re-creates
// the sessions that are not up, and the block drops again. A session that is up is left alone.
func TestBFDUplinkDownUpReasserts(t *testing.T) {
	c := newCluster(t, clusterOpts{bfd: fastBFD}, "a", "b", "c")
	c.answer("a", "c", true)
	c.putBlock("10.244.2.0/26", "b", nil)
	c.putBlock("10.244.3.0/26", "c", nil)
	c.waitFor("a's sessions", settle, func() bool { return len(c.bfdSessions("a")) == 4 })
	c.waitFor("b's block drops, c's forwards", settle, func() bool {
		return c.forwards("a", "10.244.2.1") == nil && c.forwards("a", "10.244.3.1") != nil
	})
	sim := c.nodes["a"].sim
	if err := sim.SetLinkState(1, false); err != nil {
		t.Fatal(err)
	}
	if err := sim.SetLinkState(1, true); err != nil {
		t.Fatal(err)
	}
	c.waitFor("b's sessions re-created", settle, func() bool {
		return c.metric("a", "vpp_route_agent_bfd_session_operations_total", "op", "reassert", "result", "ok") >= 2
	})
	c.waitFor("b's block drops again, c's forwards", settle, func() bool {
		return c.forwards("a", "10.244.2.1") == nil && c.forwards("a", "10.244.3.1") != nil
	})
	for _, s := range c.bfdSessions("a") {
		if strings.Contains(s, "->"+c.nodes["c"].peerV4.String()+"@") && !strings.HasSuffix(s, " up") {
			t.Errorf("c's session: %s", s)
		}
	}
}

// TestBFDFlappingPeerWritesNoRoute: b's answers toggle every 500 ms for 3 s (each toggle a transition at
// 50 ms x 3): the sessions follow, the agent writes no route.
func TestBFDFlappingPeerWritesNoRoute(t *testing.T) {
	c := newCluster(t, clusterOpts{bfd: fastBFD}, "a", "b")
	c.answer("a", "b", true)
	c.putBlock("10.244.2.0/26", "b", nil)
	c.waitFor("route via b forwarded", settle, func() bool { return c.forwards("a", "10.244.2.1") != nil })
	writes := c.fibWrites("a")
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for i := range 6 {
		<-tick.C
		c.answer("a", "b", i%2 == 1)
	}
	c.waitFor("transitions seen", settle, func() bool {
		return c.metric("a", "vpp_route_agent_bfd_transitions_total", "state", "down") >= 2
	})
	c.waitFor("up at the end", settle, func() bool { return c.forwards("a", "10.244.2.1") != nil })
	if w := c.fibWrites("a"); w != writes {
		t.Errorf("a flapping peer cost %v route writes", w-writes)
	}
}

// TestBFDECMPSurvivingPath: two uplinks; b's second peer IP stops answering: VPP forwards b's block over
// the first path only, the route (both paths) untouched; /debug/routes shows one path up, one down.
func TestBFDECMPSurvivingPath(t *testing.T) {
	c := newCluster(t, clusterOpts{bfd: fastBFD, twoUplinks: true}, "a", "b")
	b := c.nodes["b"]
	c.answer("a", "b", true)
	c.putBlock("10.244.2.0/26", "b", nil)
	both := []string{b.peerV4.String() + "@1", b.peer2V4.String() + "@2"}
	// A path with no session yet forwards too: wait for the sessions (one per uplink and family) first.
	c.waitFor("a's sessions, one per uplink and family", settle, func() bool { return len(c.bfdSessions("a")) == 4 })
	c.waitFor("both paths forward", settle, func() bool { return slices.Equal(c.forwards("a", "10.244.2.1"), both) })
	// The count from which no write may come: once the agent's start (its first full resync after the
	// list may write again what the list's turn wrote) is over.
	writes := c.fibWrites("a")
	c.waitFor("a's route writes settled", settle, func() bool {
		time.Sleep(300 * time.Millisecond)
		w := c.fibWrites("a")
		defer func() { writes = w }()
		return w == writes
	})
	c.nodes["a"].sim.SetBFDPeerAnswering(b.peer2V4, false)
	c.waitFor("only the first path forwards", settle, func() bool { return slices.Equal(c.forwards("a", "10.244.2.1"), both[:1]) })
	c.waitFor("debug shows one path down", settle, func() bool {
		d := c.debug("a")
		i := slices.IndexFunc(d.Programmed, func(r agent.ProgrammedRoute) bool { return r.Prefix.String() == "10.244.2.0/26" })
		return i >= 0 && d.Programmed[i].PathsUp == 1 && len(d.Programmed[i].PathsDown) == 1
	})
	if len(c.nodes["a"].agent.Notes()) != 0 {
		t.Errorf("b still has a path: %v", c.nodes["a"].agent.Notes())
	}
	if w := c.fibWrites("a"); w != writes {
		t.Errorf("%v route writes", w-writes)
	}
}

// TestBFDConfigRanges: out-of-range timers are refused at start, naming the flag.
func TestBFDConfigRanges(t *testing.T) {
	for _, tc := range []struct {
		cfg  agent.BFDConfig
		want string
	}{
		{agent.BFDConfig{Enabled: true, Interval: 5 * time.Millisecond}, "--bfd-interval"},
		{agent.BFDConfig{Enabled: true, Interval: 61 * time.Second}, "--bfd-interval"},
		{agent.BFDConfig{Enabled: true, Multiplier: 1}, "--bfd-multiplier"},
	} {
		cfg := agent.Config{NodeName: "a", Uplink: vppapi.Uplink{Name: uplinkName}, BFD: tc.cfg}
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %s", tc.cfg, err, tc.want)
		}
	}
	cfg := agent.Config{NodeName: "a", Uplink: vppapi.Uplink{Name: uplinkName}, BFD: agent.BFDConfig{Enabled: true}}
	if err := cfg.Validate(); err != nil || cfg.BFD.Interval != 300*time.Millisecond || cfg.BFD.Multiplier != 3 {
		t.Errorf("defaults: %v %+v", err, cfg.BFD)
	}
}

// TestBFDAgentStartsAfterPeers: an agent that starts when its peers are already registered (its first
// full resync is the one after the first list) opens their sessions at once, not at the periodic resync.
func TestBFDAgentStartsAfterPeers(t *testing.T) {
	c := newCluster(t, clusterOpts{bfd: fastBFD}, "a", "b")
	c.waitFor("a's sessions", settle, func() bool { return len(c.bfdSessions("a")) == 2 })
	c.stop("a")
	if err := c.nodes["a"].sim.Restart(); err != nil { // no sessions left
		t.Fatal(err)
	}
	c.start("a")
	c.waitFor("a's sessions made again", settle, func() bool { return len(c.bfdSessions("a")) == 2 })
}

// TestBFDBadPeers: peers written by hand, each advertising BFD: one off every uplink subnet gets no
// session (logged once, counted with the off-uplink peer IPs); an address a second node registers too is
// refused for that node (the holder, registered first, keeps it: one session, to the holder's address);
// a node advertising BFD on an address it did not register as a peer IP gets none.
func TestBFDBadPeers(t *testing.T) {
	c := newCluster(t, clusterOpts{bfd: fastBFD}, "a")
	key := func(node string) string { return blockwatch.PeerKeyAt(hosts, node, netaddr.V4, 1) }
	bfdKey := func(node string) string { return blockwatch.PeerBFDKeyAt(hosts, node, netaddr.V4, 1) }
	c.put(key("far"), "203.0.113.20")
	c.put(bfdKey("far"), "203.0.113.20")
	c.put(key("holder"), "192.168.100.30")
	c.put(bfdKey("holder"), "192.168.100.30")
	c.put(key("dup"), "192.168.100.30")
	c.put(bfdKey("dup"), "192.168.100.30")
	c.put(key("odd"), "192.168.100.31")
	c.put(bfdKey("odd"), "192.168.100.99")
	want := []string{fmt.Sprintf("%s->192.168.100.30@1 down", c.nodes["a"].peerV4)}
	c.waitFor("one session, to the holder", settle, func() bool { return slices.Equal(c.bfdSessions("a"), want) })
	c.waitFor("the off-uplink peer IP counted", settle, func() bool {
		return c.metric("a", "vpp_route_agent_peer_ips_off_uplinks_total") == 1
	})
	c.put(key("other"), "192.168.100.32") // another snapshot: nothing logged or counted again
	c.waitFor("settled", settle, func() bool { return c.debug("a").Revision > 0 })
	time.Sleep(200 * time.Millisecond)
	if n := c.nodes["a"].logs.count("203.0.113.20"); n != 1 {
		t.Errorf("the off-uplink peer IP was logged %d times, want once", n)
	}
	if d := c.debug("a"); len(d.BFD) != 1 || d.BFD[0].Node != "holder" {
		t.Errorf("/debug/routes BFD: %+v", d.BFD)
	}
}

// TestBFDLostEventsReadBack: VPP's events are lost (the simulator sends none, as when GoVPP's buffer is
// full: only logged there): b's sessions go down unheard, and the periodic full resync's read of the
// sessions brings the agent's picture to VPP's (transitions counted, b noted down); likewise back up.
func TestBFDLostEventsReadBack(t *testing.T) {
	c := newCluster(t, clusterOpts{bfd: fastBFD, resync: 300 * time.Millisecond}, "a", "b")
	a := c.nodes["a"]
	c.answer("a", "b", true)
	c.waitFor("sessions up", settle, func() bool {
		return c.metric("a", "vpp_route_agent_bfd_sessions", "state", "up") == 2
	})
	a.sim.SetFaults(vppsim.Faults{DropBFDEvents: true})
	c.answer("a", "b", false)
	c.waitFor("b read back as down", settle, func() bool {
		return slices.ContainsFunc(a.agent.Notes(), func(n string) bool { return strings.Contains(n, "b") })
	})
	if v := c.metric("a", "vpp_route_agent_bfd_transitions_total", "state", "down"); v != 2 {
		t.Errorf("transitions to down = %v, want 2 (found by the read)", v)
	}
	c.answer("a", "b", true)
	c.waitFor("b read back as up", settle, func() bool { return len(a.agent.Notes()) == 0 })
}

// TestBFDWithoutVPPSupport: a VPP without (compatible) BFD messages: the agent says so in /readyz's notes
// and the metric, opens no session, and routes as without --bfd; the node stays ready.
func TestBFDWithoutVPPSupport(t *testing.T) {
	c := newCluster(t, clusterOpts{bfd: fastBFD, sim: func(cfg *vppsim.Config) {
		cfg.CRCOverrides = map[string]string{"bfd_udp_add": "deadbeef"}
	}}, "a", "b")
	c.putBlock("10.244.2.0/26", "b", nil)
	c.eventually("a", c.want(map[string]string{"10.244.2.0/26": "b"}), settle)
	a := c.nodes["a"]
	c.waitFor("the missing BFD API noted", settle, func() bool {
		return slices.ContainsFunc(a.agent.Notes(), func(n string) bool { return strings.Contains(n, "no BFD API") })
	})
	if v := c.metric("a", "vpp_route_agent_bfd_unsupported"); v != 1 {
		t.Errorf("bfd_unsupported = %v", v)
	}
	if ok, missing := a.agent.Ready(); !ok {
		t.Errorf("not ready: %v", missing)
	}
	if s := c.bfdSessions("a"); len(s) != 0 {
		t.Errorf("sessions %v", s)
	}
	if got := c.forwards("a", "10.244.2.1"); len(got) != 1 {
		t.Errorf("b's block forwards via %v", got)
	}
}
