package etcdconfig

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/vpp-route-agent/vpp-route-agent/internal/etcdtest"
)

// TestGuardLeavesAFrozenMember: a member that keeps its connections open but stops answering is
// taken out of the client's endpoints within GuardInterval+GuardTimeout and put back when it answers.
func TestGuardLeavesAFrozenMember(t *testing.T) {
	cl := etcdtest.StartCluster(t, 3)
	cfg := Config{Endpoints: cl.Endpoints(), DialTimeout: 2 * time.Second, RequestTimeout: 2 * time.Second}
	cli, err := cfg.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	g := NewGuard(&cfg, cli, slog.New(slog.DiscardHandler))
	var mu sync.Mutex
	var changes [][]string
	g.onChange = func(h []string) { mu.Lock(); changes = append(changes, h); mu.Unlock() }
	last := func() []string {
		mu.Lock()
		defer mu.Unlock()
		if len(changes) == 0 {
			return nil
		}
		return changes[len(changes)-1]
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- g.Run(ctx) }()
	defer func() { cancel(); <-done }()

	cl.Proxies[1].Freeze()
	start := time.Now()
	want := []string{cl.Endpoints()[0], cl.Endpoints()[2]}
	for !slices.Equal(last(), want) {
		if time.Since(start) > 10*time.Second {
			t.Fatalf("frozen member not left: %v", last())
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("frozen member left after %s", time.Since(start).Round(time.Millisecond))
	if !slices.Equal(cli.Endpoints(), want) {
		t.Errorf("client endpoints %v, want %v", cli.Endpoints(), want)
	}
	cl.Proxies[1].Thaw()
	thawed := time.Now()
	defer func() { t.Logf("taken back after %s", time.Since(thawed).Round(time.Millisecond)) }()
	for !slices.Equal(last(), cl.Endpoints()) {
		if time.Since(start) > 20*time.Second {
			t.Fatalf("thawed member not taken back: %v", last())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitProblem polls g.Problem until match holds, failing after 20 s.
func waitProblem(t *testing.T, g *Guard, what string, match func(string) bool) {
	t.Helper()
	start := time.Now()
	for p := g.Problem(); !match(p); p = g.Problem() {
		if time.Since(start) > 20*time.Second {
			t.Fatalf("%s: problem %q after %s", what, p, time.Since(start))
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("%s after %s", what, time.Since(start).Round(time.Millisecond))
}

// runGuard runs a guard of cfg's endpoints, checking every 200 ms with a 500 ms deadline, until the
// test ends.
func runGuard(t *testing.T, cfg *Config) *Guard {
	cli, err := cfg.Client()
	if err != nil {
		t.Fatal(err)
	}
	g := NewGuard(cfg, cli, slog.New(slog.DiscardHandler))
	g.interval, g.timeout = 200*time.Millisecond, 500*time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- g.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done; cli.Close() })
	return g
}

// TestGuardReportsAFrozenEtcd: with its only member frozen (connections open, nothing answers: a
// SIGSTOPped etcd), Problem says etcd does not answer; once it answers again, Problem is empty.
func TestGuardReportsAFrozenEtcd(t *testing.T) {
	srv, _ := etcdtest.Start(t)
	p, err := etcdtest.NewProxy(strings.TrimPrefix(srv.Endpoint(), "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	cfg := Config{Endpoints: []string{p.Endpoint()}, DialTimeout: 2 * time.Second, RequestTimeout: 2 * time.Second}
	g := runGuard(t, &cfg)
	time.Sleep(time.Second) // several rounds with etcd answering
	if p := g.Problem(); p != "" {
		t.Fatalf("etcd answers, problem %q", p)
	}
	p.Freeze()
	waitProblem(t, g, "frozen etcd reported", func(s string) bool { return strings.Contains(s, "does not answer") })
	p.Thaw()
	waitProblem(t, g, "thawed etcd serves again", func(s string) bool { return s == "" })
}

// TestGuardReportsNoSpace: an etcd out of space (its NOSPACE alarm raised) is reported as such, and no
// longer once the alarm is disarmed.
func TestGuardReportsNoSpace(t *testing.T) {
	srv, cli := etcdtest.StartWith(t, etcdtest.Options{QuotaBackendBytes: 2 << 20})
	cfg := Config{Endpoints: []string{srv.Endpoint()}, DialTimeout: 2 * time.Second, RequestTimeout: 2 * time.Second}
	g := runGuard(t, &cfg)
	if err := etcdtest.Fill(t.Context(), cli); err != nil {
		t.Fatal(err)
	}
	waitProblem(t, g, "NOSPACE reported", func(s string) bool {
		return strings.Contains(s, "out of space (alarm NOSPACE)") && strings.Contains(s, "database space exceeded")
	})
	if _, err := cli.Delete(t.Context(), "/fill/", clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	resp, err := cli.Get(t.Context(), "x")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Compact(t.Context(), resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Defragment(t.Context(), srv.Endpoint()); err != nil {
		t.Fatal(err)
	}
	// The zero AlarmMember disarms every alarm of every member.
	if _, err := cli.AlarmDisarm(t.Context(), &clientv3.AlarmMember{}); err != nil {
		t.Fatal(err)
	}
	waitProblem(t, g, "disarmed alarm cleared", func(s string) bool { return s == "" })
}
