package etcdconfig

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

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
