package vppapi_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/internal/vpptest"
	"github.com/vpp-route-agent/vpp-route-agent/internal/vpptopo"
	"github.com/vpp-route-agent/vpp-route-agent/vppapi"
)

// benchBFDSessions is how many sessions BenchmarkBFDSessionCreate creates, whatever b.N.
const benchBFDSessions = 2000

// BenchmarkBFDSessionCreate creates benchBFDSessions sessions (300ms x 3) on the uplink to distinct peer addresses,
// one call after the other, and reports sessions/s; then, as the floor, the rate of a request that
// changes nothing (noop-requests/s: admin up on each); then it deletes them and reports deleted/s. No peer
// answers: against a real VPP every session sends and ARPs once a second meanwhile.
//
//	go test -run '^$' -bench BFDSessionCreate -benchtime 1x ./vppapi/
//	VPP_TEST_BACKEND=real VPP_PKG=/opt/vpp-v26.06-minimal go test -run '^$' -bench BFDSessionCreate -benchtime 1x ./vppapi/
func BenchmarkBFDSessionCreate(b *testing.B) {
	v := vpptest.New(b, vpptest.Options{Uplink: uplinkName})
	h := start(b, v.Socket(), func(c *vppapi.Config) { c.ReplyTimeout = vppapi.DefaultReplyTimeout })
	h.expect(vppapi.Connected)
	ctx := ctxT(b)
	uplink, err := h.c.SetupUplink(ctx, vppapi.Uplink{Name: v.Uplink(), Addresses: []netip.Prefix{pfx("100.64.0.1/10")}})
	if err != nil {
		b.Fatal(err)
	}
	sessions := make([]vppapi.BFDSession, benchBFDSessions)
	for i := range sessions {
		n := 100<<24 | 64<<16 + uint32(i) + 2 // 100.64.0.2 on
		sessions[i] = vppapi.BFDSession{
			BFDKey:       vppapi.BFDKey{SwIfIndex: uplink, Local: addr("100.64.0.1"), Peer: netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)})},
			DesiredMinTx: labBFDInterval, RequiredMinRx: labBFDInterval, DetectMult: labBFDMult,
		}
	}
	b.ResetTimer()
	t0 := time.Now()
	for _, s := range sessions {
		if err := h.c.AddBFDSession(ctx, s); err != nil {
			b.Fatal(err)
		}
	}
	created := time.Since(t0)
	b.StopTimer()
	// The floor: one synchronous BFD request that changes nothing (admin up on an admin-up session).
	t0 = time.Now()
	for _, s := range sessions {
		if err := h.c.SetBFDAdminUp(ctx, s.BFDKey, true); err != nil {
			b.Fatal(err)
		}
	}
	noop := time.Since(t0)
	t0 = time.Now()
	for _, s := range sessions {
		if err := h.c.DeleteBFDSession(ctx, s.BFDKey); err != nil {
			b.Fatal(err)
		}
	}
	deleted := time.Since(t0)
	b.ReportMetric(benchBFDSessions/created.Seconds(), "sessions/s")
	b.ReportMetric(benchBFDSessions/deleted.Seconds(), "deleted/s")
	b.ReportMetric(benchBFDSessions/noop.Seconds(), "noop-requests/s")
	b.ReportMetric(0, "ns/op")
}

// benchBFDPeers is how many sessions BenchmarkBFDIdlePeers keeps Up.
const benchBFDPeers = 500

// BenchmarkBFDIdlePeers: two lab VPPs over memif; node-2 holds benchBFDPeers more addresses on its
// uplink (10.50.1.0/16 ...), node-1 opens a session to each from 10.50.0.1 and node-2 mirrors them, all
// at 300ms x 3. It reports the time from the first session added to all Up, then watches the idle pair
// for holdFor and reports the sessions that left Up meanwhile (flaps, from node-1's events: want 0).
//
//	VPP_TEST_BACKEND=real VPP_LAB_PKG=/opt/vpp-v26.06-lab go test -run '^$' -bench BFDIdlePeers -benchtime 1x ./vppapi/
func BenchmarkBFDIdlePeers(b *testing.B) {
	requireLab(b)
	const holdFor = 10 * time.Second
	bin, _ := vpptopo.FindLab()
	dir, err := os.MkdirTemp("", "bp")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	topo, err := vpptopo.Start(ctx, bin, vpptopo.Config{Kind: vpptopo.Fabric, Nodes: 2, Dir: dir, HeapMB: 256})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(topo.Stop)
	var clients [2]*vppapi.Client
	var uplinks [2]uint32
	for i, n := range topo.Nodes {
		h := start(b, n.VPP.Socket(), func(c *vppapi.Config) { c.ReplyTimeout = vppapi.DefaultReplyTimeout })
		h.expect(vppapi.Connected)
		clients[i] = h.c
		if uplinks[i], err = h.c.LookupUplink(ctx, vppapi.Uplink{Name: vpptopo.UplinkInterface}); err != nil {
			b.Fatal(err)
		}
	}
	local := addr("10.50.0.1")
	peers := make([]netip.Addr, benchBFDPeers)
	if _, err := topo.Nodes[0].VPP.CLI(ctx, "set interface ip address "+vpptopo.UplinkInterface+" 10.50.0.1/16"); err != nil {
		b.Fatal(err)
	}
	for i := range peers {
		peers[i] = netip.AddrFrom4([4]byte{10, 50, byte(1 + i/250), byte(1 + i%250)})
		if _, err := topo.Nodes[1].VPP.CLI(ctx, fmt.Sprintf("set interface ip address %s %v/16", vpptopo.UplinkInterface, peers[i])); err != nil {
			b.Fatal(err)
		}
	}
	session := func(i int, l, p netip.Addr) vppapi.BFDSession {
		return vppapi.BFDSession{BFDKey: vppapi.BFDKey{SwIfIndex: uplinks[i], Local: l, Peer: p},
			DesiredMinTx: labBFDInterval, RequiredMinRx: labBFDInterval, DetectMult: labBFDMult}
	}
	b.ResetTimer()
	t0 := time.Now()
	for _, p := range peers {
		if err := clients[0].AddBFDSession(ctx, session(0, local, p)); err != nil {
			b.Fatal(err)
		}
		if err := clients[1].AddBFDSession(ctx, session(1, p, local)); err != nil {
			b.Fatal(err)
		}
	}
	up := func() int {
		ss, err := clients[0].DumpBFDSessions(ctx)
		if err != nil {
			b.Fatal(err)
		}
		n := 0
		for _, s := range ss {
			if s.State == vppapi.BFDUp {
				n++
			}
		}
		return n
	}
	for n := up(); n < benchBFDPeers; n = up() {
		if time.Since(t0) > time.Minute {
			b.Fatalf("%d of %d sessions Up after a minute", n, benchBFDPeers)
		}
		time.Sleep(100 * time.Millisecond)
	}
	allUp := time.Since(t0)
	b.StopTimer()
	for len(clients[0].BFDEvents()) > 0 {
		<-clients[0].BFDEvents()
	}
	flaps := 0
	hold := time.After(holdFor)
watch:
	for {
		select {
		case ev := <-clients[0].BFDEvents():
			if ev.State != vppapi.BFDUp {
				flaps++
			}
		case <-hold:
			break watch
		}
	}
	if n := up(); n != benchBFDPeers {
		b.Errorf("%d of %d sessions Up after %v idle", n, benchBFDPeers, holdFor)
	}
	b.ReportMetric(allUp.Seconds()*1000, "ms-to-all-up")
	b.ReportMetric(float64(flaps), "flaps")
	b.ReportMetric(float64(clients[0].BFDEventsLost()), "events-lost")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkBFDFailover: the three-VPP lab of TestBFDDataPlane at 300ms x 3. node-1's pod pings the pod
// of backup4 every 10 ms, through node-2 (preference 0); node-2's VPP is killed (kill -9) 0.5 s in.
// It reports the time from the kill to node-1's Down event (detect-ms), the echoes lost until the
// backup path via node-3 carried them (lost-packets) and that loss as time (lost-ms, 10 ms each).
//
//	VPP_TEST_BACKEND=real VPP_LAB_PKG=/opt/vpp-v26.06-lab go test -run '^$' -bench BFDFailover -benchtime 1x ./vppapi/
func BenchmarkBFDFailover(b *testing.B) {
	l := startBFDLab(b)
	node2 := l.topo.Nodes[1]
	l.waitState(node2, vppapi.BFDUp, 20*time.Second)
	l.waitState(l.topo.Nodes[2], vppapi.BFDUp, 20*time.Second)
	dst := backup4.Addr().Next()
	if r, ok, err := vpptopo.PingUntil(l.ctx, l.topo.Nodes[0].VPP, vpptopo.PodInterface, dst, 3, 2, 5); err != nil || !ok {
		b.Fatalf("node-1 -> backup pod: %v %v", r, err)
	}
	for len(l.clients[0].BFDEvents()) > 0 {
		<-l.clients[0].BFDEvents()
	}
	b.ResetTimer()
	type pingResult struct {
		out string
		err error
	}
	pinged := make(chan pingResult, 1)
	go func() {
		out, err := l.topo.Nodes[0].VPP.CLI(l.ctx, fmt.Sprintf("ping %v source %s repeat 300 interval 0.01", dst, vpptopo.PodInterface))
		pinged <- pingResult{out, err}
	}()
	time.Sleep(500 * time.Millisecond)
	killed := time.Now()
	if err := node2.VPP.Signal(syscall.SIGKILL); err != nil {
		b.Fatal(err)
	}
	var detect time.Duration
	for detect == 0 {
		select {
		case ev := <-l.clients[0].BFDEvents():
			if ev.Peer == node2.Addr4.Addr() && ev.State != vppapi.BFDUp {
				detect = time.Since(killed)
			}
		case <-time.After(10 * time.Second):
			b.Fatal("no Down event within 10s of the kill")
		}
	}
	res := <-pinged
	b.StopTimer()
	if res.err != nil {
		b.Fatal(res.err)
	}
	r, err := vpptopo.ParsePing(res.out)
	if err != nil {
		b.Fatal(err)
	}
	lost := r.Sent - r.Received
	b.ReportMetric(detect.Seconds()*1000, "detect-ms")
	b.ReportMetric(float64(lost), "lost-packets")
	b.ReportMetric(float64(lost)*10, "lost-ms")
	b.ReportMetric(0, "ns/op")
}
