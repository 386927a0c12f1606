package vppapi_test

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/test/vppsim"
	"github.com/vpp-route-agent/vpp-route-agent/vppapi"
)

// benchRoutes is how many routes BenchmarkApply programs: a large cluster's worth of /26 blocks.
const benchRoutes = 20000

// BenchmarkApply programs 20,000 routes into the simulator over its socket, pipelined (Apply) and one
// request at a time (ApplySync), and dumps them back. It reports routes/s for each, the speed-up, and the
// dump's duration. cpu-ns/route is the CPU time of client and simulator together per route.
//
//	go test -run '^$' -bench Apply -benchtime 1x ./vppapi/
func BenchmarkApply(b *testing.B) {
	sim := startSim(b, "it measures the client against the simulator", vppsim.Config{})
	h := start(b, sim.SocketPath(), func(c *vppapi.Config) {
		c.ReplyTimeout = vppapi.DefaultReplyTimeout
		c.HealthInterval = vppapi.DefaultHealthInterval
	})
	h.expect(vppapi.Connected)
	routes := blockRoutes(benchRoutes, "192.0.2.7", 0)
	ctx := context.Background()

	// program times apply over the routes, starting from an empty FIB each time.
	program := func(b *testing.B, apply func(context.Context, []vppapi.Route, []vppapi.Route) vppapi.Result) float64 {
		var elapsed, cpu time.Duration
		for range b.N {
			b.StopTimer()
			if res := h.c.Apply(ctx, nil, routes); res.Err() != nil {
				b.Fatal(res.Err())
			}
			b.StartTimer()
			t0 := time.Now()
			c0 := cpuTime()
			res := apply(ctx, routes, nil)
			elapsed += time.Since(t0)
			cpu += cpuTime() - c0
			if res.Err() != nil || res.Added != len(routes) {
				b.Fatalf("added %d of %d: %v", res.Added, len(routes), res.Err())
			}
		}
		rate := float64(len(routes)*b.N) / elapsed.Seconds()
		b.ReportMetric(rate, "routes/s")
		b.ReportMetric(float64(cpu.Nanoseconds())/float64(len(routes)*b.N), "cpu-ns/route")
		b.ReportMetric(0, "ns/op") // the per-route rate is the figure; ns per 20k-route batch is noise
		return rate
	}

	// Warm up once, untimed, so that neither variant pays for the first growth of the simulator's FIB
	// and of the heap.
	if res := h.c.Apply(ctx, routes, nil); res.Err() != nil {
		b.Fatal(res.Err())
	}

	var pipelined, sync float64
	b.Run("pipelined", func(b *testing.B) { pipelined = program(b, h.c.Apply) })
	b.Run("sync", func(b *testing.B) {
		sync = program(b, h.c.ApplySync)
		if pipelined > 0 {
			b.ReportMetric(pipelined/sync, "pipelined/sync")
		}
	})
	b.Run("dump", func(b *testing.B) {
		if res := h.c.Apply(ctx, routes, nil); res.Err() != nil {
			b.Fatal(res.Err())
		}
		var elapsed time.Duration
		for range b.N {
			t0 := time.Now()
			fib, err := h.c.DumpRoutes(ctx, 0)
			elapsed += time.Since(t0)
			if err != nil {
				b.Fatal(err)
			}
			if len(fib) < len(routes) {
				b.Fatalf("dumped %d entries, want at least %d", len(fib), len(routes))
			}
		}
		b.ReportMetric(elapsed.Seconds()/float64(b.N), "dump-seconds")
		b.ReportMetric(0, "ns/op")
	})
}

// cpuTime is the CPU time this process (client and simulator) has used: a figure less sensitive than
// routes/s to other load on the machine.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
