package e2e

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/vpp-route-agent/vpp-route-agent/blockwatch"
	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/internal/calicotest"
	"github.com/vpp-route-agent/vpp-route-agent/internal/vpptest"
	"github.com/vpp-route-agent/vpp-route-agent/test/vppsim"
)

// The benchmarks run the real daemon binary as a child process, the simulator and etcd in-process.
// They report their figures with b.ReportMetric and log one summary line each (b.Logf: a line printed
// to stdout would land in the middle of the benchmark's result line):
//
//	go test -run '^$' -bench . -benchtime 1x ./test/e2e/

// benchCluster fills an embedded etcd with the 10.0.0.0/8 pool (blockSize 26), the peer IPs of nodes
// remote nodes and n blocks owned round-robin by them (none by the benchmark's own node).
func benchCluster(b *testing.B, n, nodes int) *cluster {
	b.Helper()
	c := newCluster(b)
	c.putPool("default-ipv4-ippool", pool.String(), 26)
	start := time.Now()
	ops := make([]clientv3.Op, 0, calicotest.TxnOps)
	for i := range nodes {
		a := remotePeer(i)
		ops = append(ops, clientv3.OpPut(calicotest.PeerKey(hostsPrefix, remoteNode(i), a), a.String()))
		if len(ops) == cap(ops) || i == nodes-1 {
			if _, err := c.cli.Txn(c.ctx()).Then(ops...).Commit(); err != nil {
				b.Fatal(err)
			}
			ops = ops[:0]
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if _, err := calicotest.PutBlocks(ctx, c.cli, n, func(i int) string { return remoteNode(i % nodes) }); err != nil {
		b.Fatal(err)
	}
	b.Logf("put %d blocks of %d nodes in %s", n, nodes, time.Since(start).Round(time.Millisecond))
	return c
}

// benchAgent is the daemon's configuration in the benchmarks.
func benchAgent(c *cluster, sock string) agentConfig {
	return agentConfig{node: "bench-node", etcd: c.etcd.Endpoint(), socket: sock, uplink: selfAddr, logLevel: "debug"}
}

// waitRoutes waits, polling the simulator's request count every interval (a cheap check that takes
// one mutex), until it has received n ip_route_add_del, then checks that its FIB holds n routes in the
// pool. It returns when the count was seen reaching n: the simulator applies each request right after
// counting it, on the same goroutine, and the check of the whole FIB (a copy and sort of every route,
// about 10ms for 20,000) is not part of the time. If the FIB is not complete yet it keeps polling
// the FIB and returns when it is.
func waitRoutes(b *testing.B, sim *vppsim.Sim, p *proc, n int, interval, within time.Duration) time.Time {
	b.Helper()
	deadline := time.Now().Add(within)
	late := false // the count reached n before the FIB was complete: time the FIB itself
	for {
		if sim.CountRequests("ip_route_add_del") >= n {
			counted := time.Now()
			got := len(fibIn(sim, pool))
			if got == n && !late {
				return counted
			}
			if got == n {
				return time.Now()
			}
			if got > n {
				b.Fatalf("%d routes in the FIB, want %d", got, n)
			}
			late = true
		}
		if p.exited() {
			b.Fatalf("%s exited", p.name)
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d routes in the FIB after %s, want %d", len(fibIn(sim, pool)), within, n)
		}
		time.Sleep(interval)
	}
}

// BenchmarkColdStart100k measures the time from exec of the daemon to all 100,000 routes of 100,000
// remote blocks of 1,000 nodes in VPP's FIB (etcd already holds the blocks and the peers, VPP is up and empty), next
// to the time a bare blockwatch.List of the same etcd takes. With VPP_TEST_BACKEND=real the VPP is a
// real one (VPP_PKG). It prints where the cold start's time goes, from the daemon's log.
//
// With VPP_ROUTE_AGENT_BENCH_COMPARE naming another build of the daemon, every iteration also starts
// that one (the two in turns, each first every other iteration), on the same etcd, and reports its
// figures as cmp-*: a before/after comparison under the same conditions of a noisy machine.
func BenchmarkColdStart100k(b *testing.B) {
	const n, nodes = 100000, 1000
	c := benchCluster(b, n, nodes)
	bins := []string{agentBin}
	if other := os.Getenv("VPP_ROUTE_AGENT_BENCH_COMPARE"); other != "" {
		bins = append(bins, other)
	}
	var raw, list time.Duration
	cold := make([]time.Duration, len(bins))
	cpu := make([]float64, len(bins))
	iter := 0
	for b.Loop() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		t0, cpu0 := time.Now(), selfCPU(b)
		if got := rawList(ctx, b, c.cli, calico.BlockPrefix, blockwatch.DefaultHostsPrefix, calico.IPPoolPrefix); got < n {
			b.Fatalf("raw list read %d keys, want at least %d", got, n)
		}
		raw += time.Since(t0)
		b.Logf("raw list: %.3fs, %.2fs of CPU (etcd serving it and this process reading it)", time.Since(t0).Seconds(), selfCPU(b)-cpu0)
		t0 = time.Now()
		snap, err := blockwatch.List(ctx, blockwatch.Config{Client: c.cli, LegacyHostAffinity: true, Logger: slog.New(slog.DiscardHandler)})
		list += time.Since(t0)
		cancel()
		if err != nil {
			b.Fatal(err)
		}
		if snap.Blocks.Len() != n {
			b.Fatalf("listed %d blocks, want %d", snap.Blocks.Len(), n)
		}
		snap = nil
		for j := range bins {
			i := (j + iter) % len(bins)
			d, used, _ := coldStart(b, c, bins[i], n)
			cold[i] += d
			cpu[i] += used
		}
		iter++
	}
	listS, rawS := list.Seconds()/float64(b.N), raw.Seconds()/float64(b.N)
	b.ReportMetric(listS, "list-s")
	b.ReportMetric(rawS, "raw-list-s")
	for i, bin := range bins {
		unit := ""
		if i > 0 {
			unit = "cmp-"
		}
		coldS := cold[i].Seconds() / float64(b.N)
		b.ReportMetric(coldS, unit+"coldstart-s")
		b.ReportMetric(coldS/rawS, unit+"x-raw-list")
		b.ReportMetric(cpu[i]/float64(b.N), unit+"agent-cpu-s")
		b.Logf("%s: exec -> %d routes in the FIB %.3fs; the raw etcd list of the same data %.3fs (%.2fx, target <= 1.5x); blockwatch.List (list and decode) %.3fs",
			bin, n, coldS, rawS, coldS/rawS, listS)
	}
}

// coldStart starts the daemon bin against c and an empty VPP, and returns the time from its exec to
// all n routes in VPP's FIB, the CPU it used by then and its peak RSS (MB).
func coldStart(b *testing.B, c *cluster, bin string, n int) (time.Duration, float64, float64) {
	var p *proc
	var done time.Time
	others := "etcd and the simulator"
	self0, vpp0 := selfCPU(b), 0.0
	vppCPU := func() float64 { return 0 }
	if vpptest.Real() {
		// A real VPP: its uplink exists before the daemon starts; done is when the daemon logged its
		// first full resync complete (every add acknowledged by VPP), then checked with a dump.
		v := vpptest.New(b, vpptest.Options{})
		defer v.Stop()
		others = "etcd"
		vppCPU = func() float64 { return procCPU(b, int(v.PID())) }
		vpp0 = vppCPU()
		cfg := benchAgent(c, v.Socket())
		cfg.uplinkIf = v.Uplink()
		p = startProc(b, "agent", bin, profileEnv(), nil, cfg.args()...)
		done = p.waitLog("full resync done", time.Minute).time()
		if got := len(v.APIRoutes(pool)); got != n {
			b.Fatalf("%d routes in VPP's FIB after the first resync, want %d", got, n)
		}
	} else {
		sim, sock := startSim(b)
		defer sim.Close()
		p = startProc(b, "agent", bin, profileEnv(), nil, benchAgent(c, sock).args()...)
		done = waitRoutes(b, sim, p, n, time.Millisecond, time.Minute)
	}
	b.StopTimer()
	defer b.StartTimer()
	used := procCPU(b, p.cmd.Process.Pid)
	peak := procStatus(b, p.cmd.Process.Pid)["VmHWM"]
	// The CPU the rest used meanwhile, measured after done: an upper bound (a few ms more).
	self, vpp := selfCPU(b)-self0, vppCPU()-vpp0
	b.Logf("%s: %s; by then the agent used %.2fs of CPU (peak RSS %.0f MB), this process (%s) %.2fs, VPP %.2fs, in %.2fs on %d CPUs",
		bin, coldStartBreakdown(p, done), used, peak, others, self, vpp, done.Sub(p.started).Seconds(), runtime.NumCPU())
	p.stop()
	return done.Sub(p.started), used, peak
}

// profileEnv passes VPP_ROUTE_AGENT_STARTUP_CPUPROFILE on to the daemon: with it set, the daemon of
// BenchmarkColdStart100k writes a CPU profile of its cold start there (the last run's stays).
func profileEnv() []string {
	if f := os.Getenv("VPP_ROUTE_AGENT_STARTUP_CPUPROFILE"); f != "" {
		return []string{"VPP_ROUTE_AGENT_STARTUP_CPUPROFILE=" + f}
	}
	return nil
}

// rawList reads every key of the prefixes in pages of blockwatch.DefaultPageSize, as the agent's list
// does, decoding nothing, and returns the number of keys read.
func rawList(ctx context.Context, b *testing.B, cli *clientv3.Client, prefixes ...string) int {
	b.Helper()
	keys := 0
	for _, prefix := range prefixes {
		key, end := prefix, clientv3.GetPrefixRangeEnd(prefix)
		for {
			resp, err := cli.Get(ctx, key, clientv3.WithRange(end), clientv3.WithLimit(blockwatch.DefaultPageSize),
				clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
			if err != nil {
				b.Fatal(err)
			}
			keys += len(resp.Kvs)
			if !resp.More || len(resp.Kvs) == 0 {
				break
			}
			key = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
		}
	}
	return keys
}

// BenchmarkRestartLateUplink20k measures, with the daemon converged on 20,000 remote blocks, the time
// from a restarted VPP's uplink appearing (VPP creates it from its startup-config 2 s after it starts)
// to the daemon's first full resync after the restart being done: every route acknowledged by VPP. The
// uplink is looked for every 10ms over the API; the daemon looks for it every 100ms.
func BenchmarkRestartLateUplink20k(b *testing.B) {
	const n, nodes = 20000, 200
	c := benchCluster(b, n, nodes)
	v := vpptest.New(b, vpptest.Options{LateUplink: true})
	cfg := benchAgent(c, v.Socket())
	cfg.uplinkIf = v.Uplink()
	p := startProc(b, "agent", agentBin, nil, nil, cfg.args()...)
	v.ReleaseUplink()
	p.waitLog("full resync done", time.Minute)
	var total time.Duration
	for b.Loop() {
		b.StopTimer()
		seen := len(p.records())
		v.Restart()
		if v.UplinkGated() { // as a real VPP's startup-config does
			time.Sleep(vpptest.StartupDelay)
			v.ReleaseUplink()
		}
		appeared := v.WaitUplink(30 * time.Second)
		var done time.Time
		for deadline := time.Now().Add(time.Minute); done.IsZero(); time.Sleep(5 * time.Millisecond) {
			for _, r := range p.records()[seen:] {
				if r.str("msg") == "full resync done" && r.str("kind") == "vpp-restart" {
					done = r.time()
				}
			}
			if time.Now().After(deadline) {
				b.Fatal("no full resync after the VPP restart within a minute")
			}
		}
		if got := len(v.APIRoutes(pool)); got != n {
			b.Fatalf("%d routes after the restart, want %d", got, n)
		}
		total += done.Sub(appeared)
		b.StartTimer()
	}
	avg := total.Seconds() / float64(b.N)
	b.ReportMetric(avg, "uplink-to-routes-s")
	b.Logf("VPP restart, uplink 2s late: all %d routes back %.3fs after the uplink appeared", n, avg)
}

// coldStartBreakdown reads the daemon's log and says when, after exec, each stage of the cold start
// ended.
func coldStartBreakdown(p *proc, done time.Time) string {
	var parts []string
	at := func(t time.Time) string { return t.Sub(p.started).Round(time.Millisecond).String() }
	for _, r := range p.records() {
		switch r.str("msg") {
		case "starting vpp-route-agent":
			parts = append(parts, "main() "+at(r.time()))
		case "connected to VPP":
			parts = append(parts, "VPP connected "+at(r.time()))
		case "listed etcd":
			d, _ := r["duration"].(float64)
			parts = append(parts, fmt.Sprintf("etcd listed %s (list %s)", at(r.time()), time.Duration(d).Round(time.Millisecond)))
		case "full resync done":
			d, _ := r["took"].(float64)
			parts = append(parts, fmt.Sprintf("first full resync (%s) done %s (took %s: dump, diff, %s adds)",
				r.str("kind"), at(r.time()), time.Duration(d).Round(time.Millisecond), strconv.FormatFloat(r["programmed"].(float64), 'f', 0, 64)))
		}
	}
	parts = append(parts, "FIB complete "+at(done))
	return "cold start after exec: " + strings.Join(parts, ", ")
}

// BenchmarkEventToFIB measures, with the daemon converged on 1,000 blocks, the latency from issuing an
// etcd put of a new remote block to VPP receiving the route for it, 1,000 times, one at a time. The
// poller checks the simulator's ip_route_add_del count (one mutex, no copy) every 100µs; the route's
// presence in the FIB is then confirmed (a lookup of the one route), outside the timing. It prints the daemon's own
// vpp_route_agent_event_to_fib_seconds (watch response received -> VPP acknowledged) next to it.
func BenchmarkEventToFIB(b *testing.B) { benchEventToFIB(b, 1000, 50, 0) }

// BenchmarkEventToFIB100k is BenchmarkEventToFIB with 100,000 blocks of 1,000 nodes present: the
// work per event must not grow with the number of blocks.
func BenchmarkEventToFIB100k(b *testing.B) { benchEventToFIB(b, 100000, 1000, 0) }

// BenchmarkEventToFIBDebugPolled is BenchmarkEventToFIB while 8 clients each fetch /debug/routes
// every 50ms (160 documents a second): the document is served from a state the loop publishes, so the
// polling must not slow event handling. (Clients polling back to back would measure nothing but the
// CPU they take from etcd and the simulator, which run in this benchmark's process.)
func BenchmarkEventToFIBDebugPolled(b *testing.B) { benchEventToFIB(b, 1000, 50, 8) }

func benchEventToFIB(b *testing.B, base, nodes, pollers int) {
	const events = 1000
	const poll = 100 * time.Microsecond
	c := benchCluster(b, base, nodes)
	sim, sock := startSim(b)
	a := startAgent(b, benchAgent(c, sock))
	a.waitReady(time.Minute)
	waitRoutes(b, sim, a.proc, base, time.Millisecond, time.Minute)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var polls atomic.Int64
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	for range pollers {
		wg.Go(func() {
			tick := time.NewTicker(50 * time.Millisecond)
			defer tick.Stop()
			for ctx.Err() == nil {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, a.url+"/debug/routes", nil)
				resp, err := httpClient.Do(req)
				if err != nil {
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				polls.Add(1)
			}
		})
	}
	var lat []time.Duration
	next := base
	for b.Loop() {
		for range events {
			i := next
			next++
			cidr, via := calicotest.BlockCIDR(i), remotePeer(i%nodes)
			v, err := calico.EncodeBlock(calicotest.Block(cidr, remoteNode(i%nodes), i))
			if err != nil {
				b.Fatal(err)
			}
			before := sim.CountRequests("ip_route_add_del")
			t0 := time.Now()
			if _, err := c.cli.Put(ctx, calico.BlockKey(cidr), string(v)); err != nil {
				b.Fatal(err)
			}
			deadline := t0.Add(10 * time.Second)
			for sim.CountRequests("ip_route_add_del") == before {
				if time.Now().After(deadline) {
					b.Fatalf("no route for %s within 10s", cidr)
				}
				time.Sleep(poll)
			}
			lat = append(lat, time.Since(t0))
			if r, _ := sim.APIRoute(0, cidr); len(r.Paths) != 1 || r.Paths[0].NextHop != via {
				b.Fatalf("route of %s in the FIB: %v, want via %s", cidr, r.Paths, via)
			}
		}
	}
	b.StopTimer()
	slices.Sort(lat)
	q := func(f float64) float64 { return float64(lat[int(f*float64(len(lat)-1))].Microseconds()) / 1000 }
	var sum time.Duration
	for _, d := range lat {
		sum += d
	}
	m := a.metrics()
	count := m.value(b, "vpp_route_agent_event_to_fib_seconds_count")
	agentSum := m.value(b, "vpp_route_agent_event_to_fib_seconds_sum")
	b.ReportMetric(q(0.50), "p50-ms")
	b.ReportMetric(q(0.99), "p99-ms")
	if pollers > 0 {
		b.Logf("%d clients fetched /debug/routes %d times meanwhile", pollers, polls.Load())
	}
	b.Logf("%d puts, put issued -> route in VPP: p50 %.2fms p90 %.2fms p99 %.2fms max %.2fms mean %.2fms (target p99 < 10ms); "+
		"agent's vpp_route_agent_event_to_fib_seconds: count %.0f, mean %.2fms",
		len(lat), q(0.5), q(0.9), q(0.99), q(1), float64(sum.Microseconds())/1000/float64(len(lat)), count, agentSum/count*1000)
	a.stop()
}

// BenchmarkMemory100k measures the daemon's memory with 100,000 blocks of 1,000 nodes in etcd and
// 100,000 routes in the FIB: its resident set (VmRSS, and the peak VmHWM, from /proc) and its Go heap in use (its own
// go_memstats_heap_inuse_bytes).
func BenchmarkMemory100k(b *testing.B) {
	const n, nodes = 100000, 1000
	c := benchCluster(b, n, nodes)
	var rss, hwm, heap float64
	for b.Loop() {
		sim, sock := startSim(b)
		a := startAgent(b, benchAgent(c, sock))
		waitRoutes(b, sim, a.proc, n, 10*time.Millisecond, 2*time.Minute)
		a.waitReady(time.Minute)
		b.StopTimer()
		status := procStatus(b, a.cmd.Process.Pid)
		rss += status["VmRSS"]
		hwm += status["VmHWM"]
		m := a.metrics()
		heap += m.value(b, "go_memstats_heap_inuse_bytes") / (1 << 20)
		mb := func(name string) float64 { return m.value(b, name) / (1 << 20) }
		b.Logf("agent runtime: heap in use %.1f MB, heap idle not yet returned to the OS %.1f MB, stacks %.1f MB, other runtime %.1f MB, %.0f GC cycles",
			mb("go_memstats_heap_inuse_bytes"), mb("go_memstats_heap_idle_bytes")-mb("go_memstats_heap_released_bytes"),
			mb("go_memstats_stack_sys_bytes"), mb("go_memstats_sys_bytes")-mb("go_memstats_heap_sys_bytes")-mb("go_memstats_stack_sys_bytes"),
			m.value(b, "go_gc_duration_seconds_count"))
		b.Logf("converged %s after exec", time.Since(a.started).Round(time.Millisecond))
		a.stop()
		sim.Close()
		b.StartTimer()
	}
	nf := float64(b.N)
	b.ReportMetric(rss/nf, "rss-MB")
	b.ReportMetric(hwm/nf, "peak-rss-MB")
	b.ReportMetric(heap/nf, "heap-inuse-MB")
	b.Logf("%d blocks, %d routes: agent VmRSS %.1f MB (peak VmHWM %.1f MB), Go heap in use %.1f MB (target < 120 MB)",
		n, n, rss/nf, hwm/nf, heap/nf)
}

// procCPU returns the CPU time, user and system, process pid has used, in seconds (read from
// /proc/PID/stat, in the kernel's USER_HZ of 100 a second).
func procCPU(b *testing.B, pid int) float64 {
	b.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// The fields after the command name, which is in parentheses and may hold spaces: state is the
	// first (field 3), utime and stime fields 14 and 15.
	_, rest, _ := strings.Cut(string(raw), ") ")
	f := strings.Fields(rest)
	if len(f) < 13 {
		b.Fatalf("/proc/%d/stat: %q", pid, raw)
	}
	utime, _ := strconv.ParseFloat(f[11], 64)
	stime, _ := strconv.ParseFloat(f[12], 64)
	return (utime + stime) / 100
}

// selfCPU returns the CPU seconds this process has used.
func selfCPU(b *testing.B) float64 {
	b.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// procStatus returns the kB fields of /proc/PID/status, in MB.
func procStatus(b *testing.B, pid int) map[string]float64 {
	b.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	out := map[string]float64{}
	for _, line := range strings.Split(string(raw), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if fields := strings.Fields(v); ok && len(fields) == 2 && fields[1] == "kB" {
			kb, _ := strconv.ParseFloat(fields[0], 64)
			out[k] = kb / 1024
		}
	}
	return out
}
