package scale

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/vpp-route-agent/vpp-route-agent/blockwatch"
	"github.com/vpp-route-agent/vpp-route-agent/calico"
)

// BenchmarkFanout measures what one etcd sends, and what it costs, when M watchers of the real
// blockwatch code and a few real agents watch the blocks, directly or through one etcd gRPC proxy:
//
//	make bench-scale
//	go test -run '^$' -bench Fanout -benchtime 1x -timeout 30m ./test/scale/
//
// Each sub-benchmark starts its own etcd (in a child process, behind a relay that counts the bytes
// etcd sends on the wire), fills it with blocks, starts the proxy (Debian's `etcd grpc-proxy`, or
// etcd v3.6's grpcproxy package in a child process: SCALE_PROXY=debian|inprocess) and the watchers,
// then measures, in turn:
//
//   - idle: etcd's egress per node and second with nothing changing (progress probes, keep-alives);
//   - ADDs: SCALE_ADDS pod ADDs (block rewrites as Calico's IPAM does them), waiting until every
//     watcher and agent has applied them: etcd's egress per ADD, how many copies of the written value
//     that is, and the CPU per ADD of each watcher (this process, from getrusage, divided by M), of
//     each agent process, of etcd and of the proxy (from /proc);
//   - reconnect: etcd (direct) or the proxy (restarted on the same address) is cut off for a while and
//     20 more ADDs are written meanwhile: etcd's egress until every watcher is back in sync, in copies
//     of the whole data set (one list);
//   - the same with a compaction while cut off, so that every watch resumes at a compacted revision
//     and relists.
//
// SCALE_WATCHERS (default 1,10,100,500) and SCALE_AGENTS (default 2) set the fleet.
func BenchmarkFanout(b *testing.B) {
	kind := os.Getenv("SCALE_PROXY")
	if kind == "" {
		kind = "inprocess"
		if _, err := os.Stat(debianEtcd); err == nil {
			kind = "debian"
		}
	}
	for _, mode := range []string{"direct", "proxy"} {
		for _, m := range envInts(b, "SCALE_WATCHERS", "1,10,100,500") {
			name := fmt.Sprintf("%s/watchers=%d", mode, m)
			if mode == "proxy" {
				name = fmt.Sprintf("proxy-%s/watchers=%d", kind, m)
			}
			b.Run(name, func(b *testing.B) { runFanout(b, mode, kind, m) })
		}
	}
}

// The data set: blocks /26 blocks owned round-robin by nodes nodes, each holding pods pods to begin
// with (a realistic, half-full block: about 7 KB).
const (
	benchBlocks = 200
	benchNodes  = 100
	benchPods   = 28
	// idleWindow spans two progress-probe intervals (5s) of the watchers and agents.
	idleWindow = 11 * time.Second
	// recoveryAdds are written while the watchers are cut off.
	recoveryAdds = 20
)

func runFanout(b *testing.B, mode, kind string, m int) {
	adds := envInts(b, "SCALE_ADDS", "100")[0]
	k := envInts(b, "SCALE_AGENTS", "2")[0]
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()

	e := startEtcd(b)
	wcli, err := newClient(e.direct)
	if err != nil {
		b.Fatal(err)
	}
	defer wcli.Close()
	w, err := newWriter(ctx, wcli, benchBlocks, benchNodes, benchPods)
	if err != nil {
		b.Fatal(err)
	}
	dataBytes := dataSetBytes(ctx, b, wcli)
	endpoint := e.relay
	var px *proxyProc
	if mode == "proxy" {
		px = startProxy(b, kind, e.relay, "")
		endpoint = px.addr
	}
	nodes := float64(m + k)

	// Start-up: every watcher and agent lists.
	s0 := e.stats()
	agents := make([]*agentProc, k)
	for i := range agents {
		agents[i] = startAgent(b, i, endpoint)
	}
	fl := startFleet(b, endpoint, m, nil)
	if err := fl.waitRevision(w.revs[len(w.revs)-1], 5*time.Minute); err != nil {
		b.Fatal(err)
	}
	for _, a := range agents {
		if err := a.waitReady(time.Minute); err != nil {
			b.Fatal(err)
		}
	}
	s1 := e.stats()

	// Idle.
	time.Sleep(idleWindow)
	s2 := e.stats()
	unsynced := 0
	for _, wt := range fl.ws {
		if !wt.Status().Synced {
			unsynced++
		}
	}
	notReady := 0
	for _, a := range agents {
		if ok, _ := a.ready(); !ok {
			notReady++
		}
	}

	// ADDs.
	var addCPU, etcdCPU, proxyCPU, agentCPU time.Duration
	var addDown int64
	var addGRPC float64
	var valueBytes int64
	for b.Loop() {
		ev0 := make([]float64, k)
		for i, a := range agents {
			if ev0[i], err = a.blockEvents(); err != nil {
				b.Fatal(err)
			}
		}
		st := e.stats()
		cpu0, ecpu0 := selfCPU(), e.cpu()
		var pcpu0 time.Duration
		if px != nil {
			pcpu0 = px.cpu()
		}
		acpu0 := make([]time.Duration, k)
		for i, a := range agents {
			acpu0[i] = a.cpu()
		}
		wb0 := w.bytes
		var last int64
		for range adds {
			if last, err = w.add(ctx); err != nil {
				b.Fatal(err)
			}
		}
		if err := fl.waitRevision(last, 5*time.Minute); err != nil {
			b.Fatal(err)
		}
		for i, a := range agents {
			if err := a.waitBlockEvents(ev0[i]+float64(adds), time.Minute); err != nil {
				b.Fatal(err)
			}
		}
		addCPU += selfCPU() - cpu0
		etcdCPU += e.cpu() - ecpu0
		if px != nil {
			proxyCPU += px.cpu() - pcpu0
		}
		for i, a := range agents {
			agentCPU += a.cpu() - acpu0[i]
		}
		st1 := e.stats()
		addDown += st1.down - st.down
		addGRPC += st1.grpcSent - st.grpcSent
		valueBytes += w.bytes - wb0
	}
	n := float64(b.N * adds)
	perAdd := float64(addDown) / n
	value := float64(valueBytes) / n

	// Recovery: cut off (etcd for direct watchers, the proxy for the others), write, reconnect;
	// then again with a compaction while they are cut off.
	cut := func(compact bool) (lists float64, relisted uint64, took time.Duration) {
		if px != nil {
			px.stop()
		} else {
			e.command("pause")
		}
		var last int64
		for range recoveryAdds {
			if last, err = w.add(ctx); err != nil {
				b.Fatal(err)
			}
		}
		if compact {
			if _, err := wcli.Compact(ctx, last); err != nil {
				b.Fatal(err)
			}
		}
		s0 := e.stats()
		relists0 := fl.relists()
		start := time.Now()
		if px != nil {
			px = startProxy(b, kind, e.relay, px.addr)
		} else {
			e.command("resume")
		}
		if err := fl.waitRevision(last, 5*time.Minute); err != nil {
			b.Fatal(err)
		}
		took = time.Since(start)
		for _, a := range agents {
			if err := a.waitReady(time.Minute); err != nil {
				b.Fatal(err)
			}
		}
		if errs := fl.errors(); len(errs) > 0 {
			b.Logf("watchers' last errors after the cut-off (compaction %v): %v", compact, errs)
		}
		return float64(e.stats().down-s0.down) / float64(dataBytes), fl.relists() - relists0, took
	}
	blipLists, blipRelists, blipTook := cut(false)
	compLists, compRelists, compTook := cut(true)

	b.ReportMetric(perAdd, "etcd-B/add")
	b.ReportMetric(perAdd/value, "value-copies/add")
	b.ReportMetric(float64(addCPU.Microseconds())/n/float64(m), "watcher-cpu-us/add")
	b.ReportMetric(float64(agentCPU.Microseconds())/n/float64(k), "agent-cpu-us/add")
	b.ReportMetric(float64(etcdCPU.Microseconds())/n, "etcd-cpu-us/add")
	if px != nil {
		b.ReportMetric(float64(proxyCPU.Microseconds())/n, "proxy-cpu-us/add")
	}
	b.ReportMetric(float64(s2.down-s1.down)/idleWindow.Seconds()/nodes, "idle-B/s/node")
	b.ReportMetric(float64(s1.down-s0.down)/float64(dataBytes), "start-lists")
	b.ReportMetric(blipLists, "reconnect-lists")
	b.ReportMetric(compLists, "compacted-lists")
	b.Logf("%s, %d watchers + %d agents, %d blocks (%d KB of data): per ADD (value %.0f B) etcd sent %.0f B = %.2f values "+
		"(etcd_network_client_grpc_sent_bytes_total says %.0f B); idle %.1f B/s a node, %d/%d watchers and %d/%d agents not in sync after %s idle; "+
		"start-up: etcd sent %.2f data sets; reconnect after a cut-off: %d relists, %.2f data sets, in sync after %s; "+
		"the same with a compaction: %d relists, %.2f data sets, in sync after %s",
		mode, m, k, benchBlocks, dataBytes/1000, value, perAdd, perAdd/value, addGRPC/n,
		float64(s2.down-s1.down)/idleWindow.Seconds()/nodes, unsynced, m, notReady, k, idleWindow,
		float64(s1.down-s0.down)/float64(dataBytes), blipRelists, blipLists, blipTook.Round(time.Millisecond),
		compRelists, compLists, compTook.Round(time.Millisecond))
}

// dataSetBytes is the size of the keys and values one complete list of the watched prefixes returns.
func dataSetBytes(ctx context.Context, tb testing.TB, cli *clientv3.Client) int64 {
	tb.Helper()
	var n int64
	for _, prefix := range []string{calico.BlockPrefix, blockwatch.DefaultHostsPrefix, calico.IPPoolPrefix} {
		resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix())
		if err != nil {
			tb.Fatal(err)
		}
		for _, kv := range resp.Kvs {
			n += int64(len(kv.Key) + len(kv.Value))
		}
	}
	return n
}

// envInts reads a comma-separated list of positive integers from the environment, or def.
func envInts(tb testing.TB, name, def string) []int {
	tb.Helper()
	v := os.Getenv(name)
	if v == "" {
		v = def
	}
	var out []int
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			tb.Fatalf("%s=%q: want positive integers, comma-separated", name, v)
		}
		out = append(out, n)
	}
	return out
}
