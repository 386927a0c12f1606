package ipamd

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/vpp-route-agent/vpp-route-agent/cni"
	"github.com/vpp-route-agent/vpp-route-agent/internal/etcdconfig"
	"github.com/vpp-route-agent/vpp-route-agent/internal/etcdtest"
	"github.com/vpp-route-agent/vpp-route-agent/internal/ipamcall"
)

// guarded runs a daemon for node1 whose etcd client and etcdconfig.Guard (the daemon's wiring) reach
// etcd at endpoint; test is a client of the same etcd for the test's own reads and writes.
func guarded(t *testing.T, endpoint string, test *clientv3.Client) *testServer {
	t.Helper()
	ecfg := etcdconfig.Config{Endpoints: []string{endpoint}, DialTimeout: 2 * time.Second, RequestTimeout: 2 * time.Second}
	cli, err := ecfg.Client()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	g := etcdconfig.NewGuard(&ecfg, cli, slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- g.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	srv := startServerOn(t, Config{Client: cli, EtcdHealth: g}, test, nil)
	if !srv.Synced() {
		t.Fatal("the daemon did not sync")
	}
	return srv
}

// plugin calls the daemon as the plugin does with the given timeout: the reply, or an error reply
// (code 999) when none came before the plugin gave up; and how long it took.
func plugin(srv *testServer, r *cni.Request) (*cni.Reply, time.Duration) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), r.Timeout)
	defer cancel()
	reply, err := ipamcall.Call(ctx, srv.sock, r)
	if err != nil {
		reply = &cni.Reply{Code: 999, Msg: err.Error()}
	}
	return reply, time.Since(start)
}

func statusRequest() *cni.Request {
	return &cni.Request{Verb: "STATUS", Network: "net1", Assign: [2]bool{true, false}, Timeout: 2 * time.Second}
}

func readyz(srv *testServer) (int, string) {
	rec := httptest.NewRecorder()
	srv.HealthHandler(nil).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	return rec.Code, rec.Body.String()
}

// waitNotReady polls STATUS and /readyz until both say not ready naming want, within 30 s.
func waitNotReady(t *testing.T, srv *testServer, want string) {
	t.Helper()
	start := time.Now()
	for {
		r, _ := plugin(srv, statusRequest())
		code, body := readyz(srv)
		if r.Code == cni.ErrPluginNotAvailable && strings.Contains(r.Msg, want) && code == http.StatusServiceUnavailable && strings.Contains(body, want) {
			t.Logf("STATUS and /readyz not ready after %s: %s", time.Since(start).Round(time.Millisecond), r.Msg)
			return
		}
		if time.Since(start) > 30*time.Second {
			t.Fatalf("after %s: STATUS %d %q, /readyz %d %q; want both not ready naming %q", time.Since(start), r.Code, r.Msg, code, body, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestFrozenEtcdIsReported: etcd frozen (its connections open, nothing answering: a SIGSTOPped
// member, modelled by a proxy that stops forwarding). An ADD under way and one queued behind it are
// answered with code 11 before the plugin's timeout; STATUS and /readyz say not ready, naming it,
// within seconds; every new request is refused at once; all is well again once etcd answers.
func TestFrozenEtcdIsReported(t *testing.T) {
	srv0, direct := etcdtest.Start(t)
	proxy, err := etcdtest.NewProxy(strings.TrimPrefix(srv0.Endpoint(), "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	srv := guarded(t, proxy.Endpoint(), direct)
	if r, _ := plugin(srv, addRequest("warm", 10*time.Second)); r.Err() != nil {
		t.Fatal(r.Err())
	}
	if r, _ := plugin(srv, statusRequest()); r.Err() != nil {
		t.Fatalf("STATUS before the freeze: %v", r.Err())
	}

	proxy.Freeze()
	type result struct {
		r *cni.Reply
		d time.Duration
	}
	results := make(chan result, 2)
	for _, cid := range []string{"a", "b"} {
		req := addRequest(cid, 10*time.Second)
		if cid == "b" {
			req.Network = "net2" // not batched with a: queued behind it
		}
		go func() {
			r, d := plugin(srv, req)
			results <- result{r, d}
		}()
	}
	for range 2 {
		res := <-results
		if res.r.Code != 11 {
			t.Errorf("ADD with etcd frozen: %+v after %s, want code 11 before the plugin's 10 s", res.r, res.d)
		} else {
			t.Logf("ADD answered after %s: %s", res.d.Round(time.Millisecond), res.r.Msg)
		}
	}
	waitNotReady(t, srv, "does not answer")
	if r, d := plugin(srv, addRequest("c", 10*time.Second)); r.Code != 11 || !strings.Contains(r.Msg, "does not answer") || d > 2*time.Second {
		t.Errorf("ADD once etcd is known frozen: %+v after %s, want code 11 naming it at once", r, d)
	}

	proxy.Thaw()
	start := time.Now()
	for {
		r, _ := plugin(srv, statusRequest())
		if r.Err() == nil {
			break
		}
		if time.Since(start) > 30*time.Second {
			t.Fatalf("STATUS after the thaw: %v", r.Err())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if r, _ := plugin(srv, addRequest("d", 10*time.Second)); r.Err() != nil {
		t.Errorf("ADD after the thaw: %v", r.Err())
	}
}

// TestEtcdOutOfSpaceIsReported: etcd out of space (NOSPACE) refuses every write: STATUS and /readyz
// say not ready naming it (the node's blocks have room, so STATUS sends no request of its own), and
// ADD fails with code 11 naming it.
func TestEtcdOutOfSpaceIsReported(t *testing.T) {
	srv0, direct := etcdtest.StartWith(t, etcdtest.Options{QuotaBackendBytes: 2 << 20})
	srv := guarded(t, srv0.Endpoint(), direct)
	if r, _ := plugin(srv, addRequest("warm", 10*time.Second)); r.Err() != nil {
		t.Fatal(r.Err())
	}
	if err := etcdtest.Fill(t.Context(), direct); err != nil {
		t.Fatal(err)
	}
	waitNotReady(t, srv, "out of space")
	if r, d := plugin(srv, addRequest("a", 10*time.Second)); r.Code != 11 || !strings.Contains(r.Msg, "out of space") {
		t.Errorf("ADD with etcd out of space: %+v after %s, want code 11 naming it", r, d)
	}
}
