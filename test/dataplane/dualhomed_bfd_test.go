package dataplane

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/internal/vpptopo"
)

// bfdFlags are the agents' BFD flags in these tests: what operators use, 300ms x 3 (900 ms detection).
var bfdFlags = []string{"--bfd", "--bfd-interval", "300ms", "--bfd-multiplier", "3"}

// Loss measurement: every pod flow pinged every echoInterval for echoCount echoes, the failure made
// failAfter into the run. A flow that does not fail over shows an outage of the rest of the run
// (4.5 s), so maxOutage (generous: a slow 2-core box stalls VPP's main thread, which runs BFD and ping)
// still tells fail-over from none.
const (
	echoInterval = 10 * time.Millisecond
	echoCount    = 500
	failAfter    = 500 * time.Millisecond
	maxOutage    = 3 * time.Second
)

// dualBFD is three dual-homed nodes whose agents run with bfdFlags and serve metrics.
type dualBFD struct {
	topo    *vpptopo.Topology
	c       *cluster
	metrics map[*vpptopo.Node]string // each agent's metrics address
	ctx     context.Context
}

// startDualBFD starts three dual-homed nodes, their agents with BFD, and waits until every route has
// both paths, every BFD session is Up and every pod of node-2 answers node-1 and node-3 (which also
// resolves the neighbours on both fabrics).
func startDualBFD(t testing.TB) *dualBFD {
	t.Helper()
	topo, c := startDualHomed(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	bc := &dualBFD{topo: topo, c: c, metrics: map[*vpptopo.Node]string{}, ctx: ctx}
	for _, n := range topo.Nodes {
		startDualHomedAgent(t, c.etcd.Endpoint(), n, append(slices.Clone(bfdFlags), "--metrics-address", "127.0.0.1:0")...)
	}
	for _, n := range topo.Nodes {
		bc.metrics[n] = metricsAddress(t, n)
	}
	waitECMP(t, topo, func(n *vpptopo.Node) pathsOf { return wantECMP(topo, n) })
	start := time.Now()
	bc.waitSessions(t, func(*vpptopo.Node, vpptopo.BFDSession) bool { return true }, time.Minute)
	t.Logf("every BFD session Up %s after the routes", time.Since(start).Round(time.Millisecond))
	checkForwardsOverBoth(t, topo, "every BFD session Up")
	for _, from := range []*vpptopo.Node{topo.Nodes[0], topo.Nodes[2]} {
		checkAllPodsAnswer(t, from, topo.Nodes[1], "every BFD session Up")
	}
	if t.Failed() {
		t.FailNow()
	}
	return bc
}

// wantSessions are the BFD sessions node n must have: one per (uplink, other node's address of each
// family on that uplink's fabric).
func wantSessions(topo *vpptopo.Topology, n *vpptopo.Node) []string {
	var want []string
	for _, m := range topo.Nodes {
		if m == n {
			continue
		}
		for k, u := range n.Uplinks {
			for _, ipv6 := range []bool{false, true} {
				want = append(want, fmt.Sprintf("%s %s->%s", u.Interface, u.Addr(ipv6), m.Uplinks[k].Addr(ipv6)))
			}
		}
	}
	slices.Sort(want)
	return want
}

// waitSessions waits until every node has exactly its wanted sessions (wantSessions), each Up if up
// says so for it and not Up otherwise.
func (bc *dualBFD) waitSessions(t testing.TB, up func(*vpptopo.Node, vpptopo.BFDSession) bool, within time.Duration) {
	t.Helper()
	for _, n := range bc.topo.Nodes {
		want := wantSessions(bc.topo, n)
		deadline := time.Now().Add(within)
		for {
			ss, err := n.BFDSessions(bc.ctx)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			ok := true
			for _, s := range ss {
				got = append(got, fmt.Sprintf("%s %s->%s", s.Interface, s.Local, s.Peer))
				ok = ok && s.Up == up(n, s)
			}
			slices.Sort(got)
			if ok && slices.Equal(got, want) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s's BFD sessions after %s: %v; want %v, each in its wanted state", n.Name, within, ss, want)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// waitForwarding waits until node n forwards block via exactly want (nil: drops), and returns how
// long that took.
func (bc *dualBFD) waitForwarding(t testing.TB, n *vpptopo.Node, block netip.Prefix, want []netip.Addr, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		got := forwarding(t, n, block)
		if slices.Equal(got, want) {
			return time.Since(start)
		}
		if time.Since(start) > within {
			t.Fatalf("%s forwards %s via %v after %s, want %v", n.Name, block, got, within, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// metricsAddrLine is the agent's log line with the address its metrics server listens on.
var metricsAddrLine = regexp.MustCompile(`"msg":"serving metrics and health".*"address":"([^"]+)"`)

// metricsAddress waits for node n's agent to log where it serves metrics (it was given port 0).
func metricsAddress(t testing.TB, n *vpptopo.Node) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, _ := os.ReadFile(filepath.Join(n.VPP.Dir(), "agent.log"))
		if m := metricsAddrLine.FindSubmatch(out); m != nil {
			return string(m[1])
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s's agent logged no metrics address in 30s", n.Name)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// routeWrites returns node n's agent's FIB writes so far: the sum of
// vpp_route_agent_route_operations_total over every op and result.
func (bc *dualBFD) routeWrites(t testing.TB, n *vpptopo.Node) float64 {
	t.Helper()
	return bc.metricSum(t, n, "vpp_route_agent_route_operations_total")
}

// metricSum returns the sum of every series of metric name on node n's agent's /metrics, failing t if
// it has none.
func (bc *dualBFD) metricSum(t testing.TB, n *vpptopo.Node, name string) float64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(bc.ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+bc.metrics[n]+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s's metrics: %v", n.Name, err)
	}
	defer resp.Body.Close()
	sum, found := 0.0, false
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		found = true
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			t.Fatalf("%s's metrics: %q: %v", n.Name, line, err)
		}
		sum += v
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("%s's metrics: %v", n.Name, err)
	}
	if !found {
		t.Fatalf("%s's metrics have no %s", n.Name, name)
	}
	return sum
}

// flow is one pod-to-pod echo stream.
type flow struct {
	from *vpptopo.Node
	dst  netip.Addr
}

func (f flow) String() string { return f.from.Name + " -> " + f.dst.String() }

// echoesDuring pings every flow at once (echoCount echoes every echoInterval, from the pod interface)
// and runs do failAfter into the run; it returns each flow's echoes once all have ended.
func (bc *dualBFD) echoesDuring(t testing.TB, flows []flow, do func()) map[flow]vpptopo.Echoes {
	t.Helper()
	var (
		mu   sync.Mutex
		out  = map[flow]vpptopo.Echoes{}
		errs []error
		wg   sync.WaitGroup
	)
	for _, f := range flows {
		wg.Go(func() {
			e, err := vpptopo.PingEvery(bc.ctx, f.from.VPP, vpptopo.PodInterface, f.dst, echoCount, echoInterval)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, fmt.Errorf("%v: %w", f, err))
			}
			out[f] = e
		})
	}
	time.Sleep(failAfter)
	do()
	wg.Wait()
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	return out
}

// lossSummary is what a loss measurement found over its flows.
type lossSummary struct {
	worst     time.Duration // the longest outage of any flow
	worstLost int           // that flow's echoes lost in a row
	lost      int           // echoes lost over every flow
	hit       int           // flows that lost any echo
}

func summarize(es map[flow]vpptopo.Echoes) lossSummary {
	var s lossSummary
	for _, e := range es {
		if e.Outage() > s.worst {
			s.worst, s.worstLost = e.Outage(), e.LongestLoss()
		}
		s.lost += e.Sent - e.Received
		if e.Received < e.Sent {
			s.hit++
		}
	}
	return s
}

// logEchoes logs each flow's result, sorted.
func logEchoes(t testing.TB, what string, es map[flow]vpptopo.Echoes) {
	t.Helper()
	var lines []string
	for f, e := range es {
		lines = append(lines, fmt.Sprintf("%v: %v, longest loss %d echoes (%s)", f, e.PingResult, e.LongestLoss(), e.Outage()))
	}
	slices.Sort(lines)
	t.Logf("%s:\n  %s", what, strings.Join(lines, "\n  "))
}

// podFlows are the IPv4 flows from node-1's and node-3's pod to every pod of node-2.
func podFlows(topo *vpptopo.Topology) []flow {
	var out []flow
	for _, from := range []*vpptopo.Node{topo.Nodes[0], topo.Nodes[2]} {
		for _, pod := range topo.Nodes[1].Pods4 {
			out = append(out, flow{from, pod})
		}
	}
	return out
}

// failOver takes node-2's fabric-A port down while pinging podFlows, and checks that every flow is
// answered again by the end of the run (fail-over to fabric B); it returns the loss, measured.
func (bc *dualBFD) failOver(t testing.TB) (lossSummary, map[flow]vpptopo.Echoes) {
	t.Helper()
	n2 := bc.topo.Nodes[1]
	es := bc.echoesDuring(t, podFlows(bc.topo), func() {
		if err := bc.topo.SetSwitchPort(bc.ctx, n2, 0, false); err != nil {
			t.Fatal(err)
		}
	})
	for f, e := range es {
		// The last second: at least half answered (a loaded box loses a few on its own).
		if last := e.AnsweredFrom(e.Sent - 99); last < 50 {
			t.Errorf("%v: %d of the last 100 echoes answered after node-2's fabric-A port went down: no fail-over (%v)", f, last, e.PingResult)
		}
	}
	return summarize(es), es
}

// restore brings node-2's fabric-A port back up while pinging podFlows, and waits until node-1 and
// node-3 forward node-2's blocks over both fabrics again (its sessions there Up again).
func (bc *dualBFD) restore(t testing.TB) (lossSummary, map[flow]vpptopo.Echoes) {
	t.Helper()
	n2 := bc.topo.Nodes[1]
	es := bc.echoesDuring(t, podFlows(bc.topo), func() {
		if err := bc.topo.SetSwitchPort(bc.ctx, n2, 0, true); err != nil {
			t.Fatal(err)
		}
	})
	for _, n := range []*vpptopo.Node{bc.topo.Nodes[0], bc.topo.Nodes[2]} {
		for _, ipv6 := range []bool{false, true} {
			bc.waitForwarding(t, n, block(n2, ipv6), peerAddrs(n2, ipv6), 30*time.Second)
		}
	}
	return summarize(es), es
}

// block returns node m's block of a family.
func block(m *vpptopo.Node, ipv6 bool) netip.Prefix {
	if ipv6 {
		return m.Block6
	}
	return m.Block4
}

// TestDualHomedBFDFailover: three dual-homed nodes, agents with --bfd at 300ms x 3. Every BFD session
// (each node to each other node's address of each family on each fabric) comes Up, the routes keep both
// paths. node-2's fabric-A port goes down while node-1's and node-3's pods ping every pod of node-2 every
// 10 ms: every flow is answered again before the run ends (the flows hashed onto fabric A fail over to
// fabric B; without BFD they are lost for good, TestDualHomedECMP), the longest outage is within
// maxOutage, and node-1 and node-3 forward node-2's blocks by fabric B alone, node-2 theirs likewise,
// while the routes as dumped keep both paths (VPP took the BFD-down paths out of forwarding; the agents
// rewrote nothing). Every pod of node-2 answers, IPv4 and IPv6. The port back up: the sessions come Up,
// both paths forward again and every pod answers. The outages are logged as figures.
func TestDualHomedBFDFailover(t *testing.T) {
	requireLab(t)
	bc := startDualBFD(t)
	n1, n2, n3 := bc.topo.Nodes[0], bc.topo.Nodes[1], bc.topo.Nodes[2]

	s, es := bc.failOver(t)
	logEchoes(t, "node-2's fabric-A port down, BFD 300ms x 3", es)
	t.Logf("FIGURE BFD 300ms x 3 fail-over (node-2's fabric-A port down): longest outage %s (%d echoes at %s), %d echoes lost over %d flows, %d flows hit",
		s.worst, s.worstLost, echoInterval, s.lost, len(es), s.hit)
	if s.worst > maxOutage {
		t.Errorf("longest outage %s at node-2's fabric-A port going down, want within %s (detection is 900 ms)", s.worst, maxOutage)
	}
	for _, n := range []*vpptopo.Node{n1, n3} {
		for _, ipv6 := range []bool{false, true} {
			bc.waitForwarding(t, n, block(n2, ipv6), []netip.Addr{n2.Uplinks[1].Addr(ipv6)}, 30*time.Second)
			bc.waitForwarding(t, n2, block(n, ipv6), []netip.Addr{n.Uplinks[1].Addr(ipv6)}, 30*time.Second)
		}
	}
	waitECMP(t, bc.topo, func(n *vpptopo.Node) pathsOf { return wantECMP(bc.topo, n) })
	bc.waitSessions(t, func(n *vpptopo.Node, s vpptopo.BFDSession) bool {
		// Down: node-2's sessions on fabric A, and the others' to node-2 there.
		return !(s.Interface == vpptopo.UplinkInterface && (n == n2 || s.Peer == n2.Uplinks[0].Addr(s.Peer.Is6())))
	}, 30*time.Second)
	for _, from := range []*vpptopo.Node{n1, n3} {
		checkAllPodsAnswer(t, from, n2, "BFD, node-2's fabric-A port down")
	}

	s, es = bc.restore(t)
	logEchoes(t, "node-2's fabric-A port up again, BFD 300ms x 3", es)
	t.Logf("FIGURE BFD 300ms x 3, node-2's fabric-A port up again: longest outage %s, %d echoes lost over %d flows", s.worst, s.lost, len(es))
	bc.waitSessions(t, func(*vpptopo.Node, vpptopo.BFDSession) bool { return true }, 30*time.Second)
	checkForwardsOverBoth(t, bc.topo, "node-2's fabric-A port up again")
	for _, from := range []*vpptopo.Node{n1, n3} {
		checkAllPodsAnswer(t, from, n2, "node-2's fabric-A port up again")
	}
}

// TestDualHomedBFDKill: agents with --bfd; node-2's VPP killed with SIGKILL. node-1 and node-3 stop
// forwarding node-2's blocks (every path BFD-down: the route drops, or is withdrawn), and its pods answer
// nobody, while node-1 and node-3's pods still answer each other. node-2's VPP started again (its agent,
// still running, reconnects and programs it): the sessions come Up, both paths forward again, and every
// pod of node-2 answers node-1 and node-3. The times are logged.
func TestDualHomedBFDKill(t *testing.T) {
	requireLab(t)
	bc := startDualBFD(t)
	n1, n2, n3 := bc.topo.Nodes[0], bc.topo.Nodes[1], bc.topo.Nodes[2]

	killed := time.Now()
	if err := n2.Kill(); err != nil {
		t.Fatal(err)
	}
	for _, n := range []*vpptopo.Node{n1, n3} {
		for _, ipv6 := range []bool{false, true} {
			bc.waitForwarding(t, n, block(n2, ipv6), nil, 30*time.Second)
		}
	}
	t.Logf("FIGURE BFD 300ms x 3: node-1 and node-3 stopped forwarding node-2's blocks %s after its VPP was killed (polled)", time.Since(killed).Round(time.Millisecond))
	for _, from := range []*vpptopo.Node{n1, n3} {
		for _, ipv6 := range []bool{false, true} {
			r, err := vpptopo.Ping(bc.ctx, from.VPP, vpptopo.PodInterface, n2.Pod(ipv6), pingCount)
			if err != nil {
				t.Fatal(err)
			}
			if r.Received != 0 {
				t.Errorf("%s's pod got answers from killed node-2's pod %s: %v", from.Name, n2.Pod(ipv6), r)
			}
		}
	}
	checkPairs(t, []*vpptopo.Node{n1, n3})

	restarted := time.Now()
	if err := n2.Restart(bc.ctx); err != nil {
		t.Fatal(err)
	}
	waitECMP(t, bc.topo, func(n *vpptopo.Node) pathsOf { return wantECMP(bc.topo, n) })
	bc.waitSessions(t, func(*vpptopo.Node, vpptopo.BFDSession) bool { return true }, time.Minute)
	checkForwardsOverBoth(t, bc.topo, "node-2's VPP restarted")
	for _, from := range []*vpptopo.Node{n1, n3} {
		checkAllPodsAnswer(t, from, n2, "node-2's VPP restarted")
	}
	t.Logf("FIGURE BFD 300ms x 3: node-2's pods answer again %s after its VPP was restarted (its agent reconnecting and programming it, sessions Up)",
		time.Since(restarted).Round(time.Millisecond))
}

// watchTransitions polls node n's BFD sessions every 50 ms until stop is called, which returns the state
// changes seen (Up to not Up and back; a change shorter than a poll can be missed). A poll is never cut
// short, and stop waits for the last one: the test's other VPP calls do not overlap it.
func (bc *dualBFD) watchTransitions(n *vpptopo.Node) (stop func() int) {
	quit, done := make(chan struct{}), make(chan int)
	go func() {
		last, changes := map[string]bool{}, 0
		for {
			ss, err := n.BFDSessions(bc.ctx)
			if err == nil {
				for _, s := range ss {
					key := s.Interface + " " + s.Peer.String()
					if up, ok := last[key]; ok && up != s.Up {
						changes++
					}
					last[key] = s.Up
				}
			}
			select {
			case <-quit:
				done <- changes
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	return func() int { close(quit); return <-done }
}

// flap toggles node-2's fabric-A port: cycles times down for period, then up for period.
func (bc *dualBFD) flap(t testing.TB, cycles int, period time.Duration) {
	t.Helper()
	for i := range 2 * cycles {
		if err := bc.topo.SetSwitchPort(bc.ctx, bc.topo.Nodes[1], 0, i%2 == 1); err != nil {
			t.Fatal(err)
		}
		time.Sleep(period)
	}
}

// TestDualHomedBFDFlap: agents with --bfd; node-2's fabric-A port flaps, down and up every 500 ms for 5 s
// (shorter than the 900 ms detection time: BFD may not notice), then every 1.5 s for 6 s (it does: the
// sessions go Down and Up). The agents' route writes (vpp_route_agent_route_operations_total) barely
// move through both (at most flapWriteBound each: no storm), and afterwards every session is Up, both
// paths forward and every pod of node-2 answers. The writes and the BFD state changes node-1 saw are
// logged.
func TestDualHomedBFDFlap(t *testing.T) {
	requireLab(t)
	bc := startDualBFD(t)
	n1, n2 := bc.topo.Nodes[0], bc.topo.Nodes[1]
	for _, phase := range []struct {
		cycles int
		period time.Duration
	}{{5, 500 * time.Millisecond}, {2, 1500 * time.Millisecond}} {
		before, transitions := map[*vpptopo.Node]float64{}, map[*vpptopo.Node]float64{}
		for _, n := range bc.topo.Nodes {
			before[n] = bc.routeWrites(t, n)
			transitions[n] = bc.metricSum(t, n, "vpp_route_agent_bfd_transitions_total")
		}
		stop := bc.watchTransitions(n1)
		bc.flap(t, phase.cycles, phase.period)
		changes := stop()
		bc.waitSessions(t, func(*vpptopo.Node, vpptopo.BFDSession) bool { return true }, time.Minute)
		what := fmt.Sprintf("node-2's fabric-A port flapping every %s for %s", phase.period, 2*time.Duration(phase.cycles)*phase.period)
		checkForwardsOverBoth(t, bc.topo, "after "+what)
		for _, from := range []*vpptopo.Node{n1, bc.topo.Nodes[2]} {
			checkAllPodsAnswer(t, from, n2, "after "+what)
		}
		var deltas []string
		for _, n := range bc.topo.Nodes {
			d := bc.routeWrites(t, n) - before[n]
			seen := bc.metricSum(t, n, "vpp_route_agent_bfd_transitions_total") - transitions[n]
			deltas = append(deltas, fmt.Sprintf("%s %g (its BFD transitions %g)", n.Name, d, seen))
			if d > flapWriteBound {
				t.Errorf("%s's agent wrote %g routes with %s, want at most %d", n.Name, d, what, flapWriteBound)
			}
		}
		t.Logf("FIGURE %s (BFD 300ms x 3): route writes %s; node-1's VPP polled during the flap: %d BFD session state changes", what, strings.Join(deltas, ", "), changes)
	}
}

// flapWriteBound is the most route writes an agent may make while a link flaps: a storm is a rewrite
// per BFD transition and route (each remote block, both families: 4 here).
const flapWriteBound = 4

// BenchmarkDualHomedBFDFailover measures, per iteration, the fail-over of TestDualHomedBFDFailover:
// node-2's fabric-A port down under 10 ms pings from node-1's and node-3's pods to node-2's 4 pods
// (IPv4), agents with --bfd at 300ms x 3. Reported: the longest outage of any flow (failover-ms: the
// detection time plus the time VPP takes the paths out), echoes lost over every flow, and flows hit (those
// VPP had hashed onto fabric A). Between iterations the port comes back and both paths forward again
// (not timed).
//
//	VPP_TEST_BACKEND=real VPP_LAB_PKG=/opt/vpp-v26.06-lab go test -run '^$' -bench DualHomedBFD -benchtime 3x ./test/dataplane
func BenchmarkDualHomedBFDFailover(b *testing.B) {
	requireLab(b)
	bc := startDualBFD(b)
	var worst time.Duration
	lost, hit := 0, 0
	b.ResetTimer()
	for range b.N {
		s, _ := bc.failOver(b)
		worst += s.worst
		lost += s.lost
		hit += s.hit
		b.StopTimer()
		bc.restore(b)
		b.StartTimer()
	}
	b.ReportMetric(float64(worst.Milliseconds())/float64(b.N), "failover-ms")
	b.ReportMetric(float64(lost)/float64(b.N), "echoes-lost")
	b.ReportMetric(float64(hit)/float64(b.N), "flows-hit")
	b.ReportMetric(0, "ns/op") // an iteration's time is the 5 s ping run, not a figure
}
