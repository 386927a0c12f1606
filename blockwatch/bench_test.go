package blockwatch

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"testing"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/internal/calicotest"
	"github.com/vpp-route-agent/vpp-route-agent/internal/etcdtest"
)

// BenchmarkList100k puts 100,000 realistic /26 blocks (1,000 nodes) into an embedded etcd, then times a
// full list and decode into a Full snapshot and measures the heap the resulting view holds.
//
//	go test -run '^$' -bench List100k -benchtime 1x ./blockwatch/
func BenchmarkList100k(b *testing.B) {
	const n = 100000
	_, cli := etcdtest.Start(b)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	start := time.Now()
	if _, err := calicotest.PutBlocks(ctx, cli, n, func(i int) string { return fmt.Sprintf("node-%04d", i%1000) }); err != nil {
		b.Fatal(err)
	}
	b.Logf("put %d blocks in %s", n, time.Since(start).Round(time.Millisecond))

	var ms runtime.MemStats
	var took time.Duration
	var heap float64
	for b.Loop() {
		w, err := New(Config{Client: cli, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			b.Fatal(err)
		}
		t0 := time.Now()
		s, err := w.list(ctx, ReasonInitial, 0)
		if err != nil {
			b.Fatal(err)
		}
		took += time.Since(t0)
		if s.Blocks.Len() != n {
			b.Fatalf("listed %d blocks, want %d", s.Blocks.Len(), n)
		}
		// The view's size: the live heap with it minus the live heap once it is dropped (measured this
		// way round, the in-process etcd server's own heap cancels out).
		runtime.GC()
		runtime.ReadMemStats(&ms)
		withView := ms.HeapAlloc
		w.view, s = nil, nil
		runtime.GC()
		runtime.ReadMemStats(&ms)
		heap += float64(int64(withView)-int64(ms.HeapAlloc)) / (1 << 20)
	}
	b.ReportMetric(took.Seconds()/float64(b.N), "list-s")
	b.ReportMetric(heap/float64(b.N), "view-MB")
}
