package release

import (
	"encoding/json"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/cni/ipamd"
	"github.com/vpp-route-agent/vpp-route-agent/internal/etcdtest"
	"github.com/vpp-route-agent/vpp-route-agent/internal/metricstest"
)

// fakeClock is a settable clock.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func newReaper(t *testing.T, cli *clientv3.Client, clock *fakeClock) (*Reaper, *prometheus.Registry) {
	reg := prometheus.NewRegistry()
	r, err := NewReaper(ReaperConfig{Client: cli, Node: "n2", After: time.Minute, Leader: func() bool { return true },
		CallTimeout: 3 * time.Second, Now: clock.now}, reg)
	if err != nil {
		t.Fatal(err)
	}
	return r, reg
}

func track(t *testing.T, cli *clientv3.Client, node string) *Track {
	t.Helper()
	resp, err := cli.Get(t.Context(), TrackPrefix+node)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return nil
	}
	var tr Track
	if err := json.Unmarshal(resp.Kvs[0].Value, &tr); err != nil {
		t.Fatal(err)
	}
	return &tr
}

// TestReaperReleasesAfterDeadline: a node seen alive, then dead, is released only once it has been
// dead longer than After, counted, recorded and no longer tracked; a node that comes back before the
// deadline restarts its clock; a node never seen alive (a calico-ipam node) is never released.
func TestReaperReleasesAfterDeadline(t *testing.T) {
	_, cli := etcdtest.Start(t)
	seedCluster(t, cli)
	// n3: blocks, but never a liveness key nor a registration.
	putBlock(t, cli, "10.0.9.0/26", "host:n3", alloc{0, "calico.x", "n3"})
	clock := &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	r, reg := newReaper(t, cli, clock)
	pass := func() {
		t.Helper()
		if err := r.Pass(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	mustPut(t, cli, ipamd.AliveKey("n1"), "x")
	pass()
	if tr := track(t, cli, "n1"); tr == nil || tr.DeadSince != nil {
		t.Fatalf("n1 alive, tracked %+v", tr)
	}
	cli.Delete(t.Context(), ipamd.AliveKey("n1"))
	clock.add(time.Second)
	pass()
	dead := clock.now()
	if tr := track(t, cli, "n1"); tr == nil || tr.DeadSince == nil || !tr.DeadSince.Equal(dead) {
		t.Fatalf("n1 dead, tracked %+v", tr)
	}
	// Back before the deadline: the clock starts again when it dies again.
	clock.add(50 * time.Second)
	mustPut(t, cli, ipamd.DefaultHostsPrefix+"n1/peerip/ipv4/1", "192.0.2.1")
	pass()
	cli.Delete(t.Context(), ipamd.DefaultHostsPrefix+"n1/peerip/ipv4/1")
	clock.add(time.Second)
	pass()
	dead = clock.now()
	clock.add(time.Minute) // exactly After: not yet
	pass()
	if b := readBlock(t, cli, "10.0.0.0/26"); b.Allocated() != 3 {
		t.Fatal("released at the deadline, not after it")
	}
	if tr := track(t, cli, "n1"); !tr.DeadSince.Equal(dead) {
		t.Fatalf("first time seen dead not kept: %v, want %v", tr.DeadSince, dead)
	}
	clock.add(time.Second)
	pass()
	if exists(t, cli, calico.BlockKey(netip.MustParsePrefix("10.0.0.0/26"))) {
		t.Fatal("n1 not released after the deadline")
	}
	if v := metricstest.Value(t, reg, "block_ipam_node_releases_total", "result", ResultReleased); v != 1 {
		t.Fatalf("releases counted: %v", v)
	}
	if track(t, cli, "n1") != nil {
		t.Fatal("n1 still tracked after its release")
	}
	if countPrefix(t, cli, RecordPrefix+"n1/") != 1 {
		t.Fatal("no release record")
	}
	// n3 was never seen alive: an hour later its block is still there.
	clock.add(time.Hour)
	pass()
	if b := readBlock(t, cli, "10.0.9.0/26"); b.Allocated() != 1 {
		t.Fatal("released a node never seen alive")
	}
}

// TestReaperRaceNodeComesBack: the node's liveness key reappears between the release's plan and its
// commit: the conditional transaction aborts, nothing is released, the abort is counted, and the
// next pass tracks the node alive again.
func TestReaperRaceNodeComesBack(t *testing.T) {
	_, cli := etcdtest.Start(t)
	seedCluster(t, cli)
	clock := &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	r, reg := newReaper(t, cli, clock)
	r.beforeCommit = func(node string) { mustPut(t, cli, ipamd.AliveKey(node), "back") }
	mustPut(t, cli, ipamd.AliveKey("n1"), "x")
	for _, step := range []func(){
		func() {}, func() { cli.Delete(t.Context(), ipamd.AliveKey("n1")) }, func() { clock.add(2 * time.Minute) },
	} {
		step()
		if err := r.Pass(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	if v := metricstest.Value(t, reg, "block_ipam_node_releases_total", "result", ResultAborted); v != 1 {
		t.Fatalf("aborted releases counted: %v", v)
	}
	if b := readBlock(t, cli, "10.0.0.0/26"); b.Allocated() != 3 || *b.Affinity != "host:n1" {
		t.Fatal("released a node that came back")
	}
	if h := readHandle(t, cli, "net.dual"); h == nil || h.Count() != 2 {
		t.Fatalf("handle of a node that came back: %+v", h)
	}
	if err := r.Pass(t.Context()); err != nil {
		t.Fatal(err)
	}
	if tr := track(t, cli, "n1"); tr == nil || tr.DeadSince != nil {
		t.Fatalf("n1 back, tracked %+v", tr)
	}
}

// TestReaperNewLeaderKeepsClock: the daemon elected after another keeps the first time the node was
// seen dead (from etcd): it releases the node once that time is older than After, not After after
// its own election.
func TestReaperNewLeaderKeepsClock(t *testing.T) {
	_, cli := etcdtest.Start(t)
	seedCluster(t, cli)
	clock := &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	old, _ := newReaper(t, cli, clock)
	mustPut(t, cli, ipamd.AliveKey("n1"), "x")
	if err := old.Pass(t.Context()); err != nil {
		t.Fatal(err)
	}
	cli.Delete(t.Context(), ipamd.AliveKey("n1"))
	if err := old.Pass(t.Context()); err != nil {
		t.Fatal(err)
	}
	// The old leader is gone; the new one first passes 61 s after the node was seen dead.
	clock.add(61 * time.Second)
	next, reg := newReaper(t, cli, clock)
	if err := next.Pass(t.Context()); err != nil {
		t.Fatal(err)
	}
	if exists(t, cli, calico.BlockKey(netip.MustParsePrefix("10.0.0.0/26"))) {
		t.Fatal("the new leader restarted the clock")
	}
	if v := metricstest.Value(t, reg, "block_ipam_node_releases_total", "result", ResultReleased); v != 1 {
		t.Fatalf("releases counted: %v", v)
	}
}
