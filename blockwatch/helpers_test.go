package blockwatch

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/internal/etcdtest"
	"github.com/vpp-route-agent/vpp-route-agent/internal/metricstest"
)

const waitLimit = 30 * time.Second

// addrs is p without its create revisions.
func addrs(p Peer) Peer { return Peer{IPv4: p.IPv4, IPv6: p.IPv6} }

func mustPrefix(s string) netip.Prefix { return netip.MustParsePrefix(s) }
func mustAddr(s string) netip.Addr     { return netip.MustParseAddr(s) }

// testCtx is a context bounded well within the test timeout.
func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// fastClient returns a client of endpoint whose gRPC reconnect backoff is short, so that tests that
// cut the connection do not wait for gRPC's default (up to two minutes).
func fastClient(t testing.TB, endpoint string) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{endpoint},
		DialTimeout: 2 * time.Second,
		Logger:      zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           grpcbackoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 300 * time.Millisecond},
			MinConnectTimeout: time.Second,
		})},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// testLogger logs to the test's output.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// harness is a Watcher under test with its registry.
type harness struct {
	t   testing.TB
	w   *Watcher
	reg *prometheus.Registry
}

func newHarness(t testing.TB, cli *clientv3.Client, mod func(*Config)) *harness {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg := Config{Client: cli, Logger: testLogger(t), Registerer: reg, RequestTimeout: 5 * time.Second,
		ProbeInterval: 200 * time.Millisecond}
	if mod != nil {
		mod(&cfg)
	}
	w, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &harness{t: t, w: w, reg: reg}
}

// run starts Run and returns a function that stops it and waits for it to return (also run at cleanup).
func (h *harness) run() (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.w.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					h.t.Errorf("Run returned %v", err)
				}
			case <-time.After(waitLimit):
				h.t.Errorf("Run did not return within %s of cancel", waitLimit)
			}
		})
	}
	h.t.Cleanup(stop)
	return stop
}

// next returns the next snapshot.
func (h *harness) next() *Snapshot {
	h.t.Helper()
	select {
	case s := <-h.w.Updates():
		checkSnapshot(h.t, s)
		return s
	case <-time.After(waitLimit):
		h.t.Fatalf("no snapshot within %s (status %+v)", waitLimit, h.w.Status())
		return nil
	}
}

// waitFor reads snapshots until cond holds for one and returns it, with every snapshot read.
func (h *harness) waitFor(what string, cond func(*Snapshot) bool) (*Snapshot, []*Snapshot) {
	h.t.Helper()
	deadline := time.After(waitLimit)
	var seen []*Snapshot
	for {
		select {
		case s := <-h.w.Updates():
			checkSnapshot(h.t, s)
			seen = append(seen, s)
			if cond(s) {
				return s, seen
			}
		case <-deadline:
			h.t.Fatalf("no snapshot with %s within %s (status %+v, %d snapshots seen)", what, waitLimit, h.w.Status(), len(seen))
			return nil, nil
		}
	}
}

// settled waits until the Watcher has applied revision rev and checks that no snapshot is waiting:
// the Watcher emits before it advances Status().Revision.
func (h *harness) settled(rev int64) {
	h.t.Helper()
	waitRevision(h.t, h.w, rev)
	select {
	case s := <-h.w.Updates():
		h.t.Fatalf("unexpected snapshot: rev %d full %v changed %v %v", s.Revision, s.Full, s.ChangedBlocks, s.ChangedPeers)
	default:
	}
}

func (h *harness) counter(name string, labels ...string) float64 {
	h.t.Helper()
	return metricstest.Value(h.t, h.reg, name, labels...)
}

// checkSnapshot checks the invariants every snapshot has.
func checkSnapshot(t testing.TB, s *Snapshot) {
	t.Helper()
	if s.Full != (s.RelistReason != "") {
		t.Errorf("snapshot rev %d: Full %v with reason %q", s.Revision, s.Full, s.RelistReason)
	}
	if s.ReceivedAt.IsZero() {
		t.Errorf("snapshot rev %d: no ReceivedAt", s.Revision)
	}
	for k, b := range s.Blocks.All() {
		if b == nil || b.CIDR != k {
			t.Errorf("snapshot rev %d: block %s holds %+v", s.Revision, k, b)
		}
	}
	for i := 1; i < len(s.ChangedBlocks); i++ {
		if s.ChangedBlocks[i-1].Compare(s.ChangedBlocks[i]) >= 0 {
			t.Errorf("ChangedBlocks not sorted and unique: %v", s.ChangedBlocks)
		}
	}
}

// testdataValue is one file of calico/testdata.
type testdataValue struct {
	Key   string          `json:"key"`
	Value json.RawMessage `json:"value"`
}

func loadTestdata(t testing.TB) map[string]testdataValue {
	t.Helper()
	files, err := filepath.Glob("../calico/testdata/*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("testdata: %v %v", files, err)
	}
	out := map[string]testdataValue{}
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var v testdataValue
		if err := json.Unmarshal(raw, &v); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		out[strings.TrimSuffix(filepath.Base(f), ".json")] = v
	}
	return out
}

func put(t testing.TB, cli *clientv3.Client, key, value string) int64 {
	t.Helper()
	resp, err := cli.Put(testCtx(t), key, value)
	if err != nil {
		t.Fatalf("put %s: %v", key, err)
	}
	return resp.Header.Revision
}

func del(t testing.TB, cli *clientv3.Client, key string) int64 {
	t.Helper()
	resp, err := cli.Delete(testCtx(t), key)
	if err != nil {
		t.Fatalf("delete %s: %v", key, err)
	}
	return resp.Header.Revision
}

func putBlock(t testing.TB, cli *clientv3.Client, b *calico.Block) int64 {
	t.Helper()
	v, err := calico.EncodeBlock(b)
	if err != nil {
		t.Fatal(err)
	}
	return put(t, cli, calico.BlockKey(b.CIDR), string(v))
}

// startEtcd starts an embedded etcd and returns it with a fast-reconnecting client.
func startEtcd(t testing.TB) (*etcdtest.Server, *clientv3.Client) {
	t.Helper()
	s, _ := etcdtest.Start(t)
	return s, fastClient(t, s.Endpoint())
}

// newProxy puts a TCP proxy in front of etcd, so that a test can cut a client's connections while
// others write and compact.
func newProxy(t testing.TB, targetURL string) *etcdtest.Proxy {
	t.Helper()
	p, err := etcdtest.NewProxy(strings.TrimPrefix(targetURL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}
