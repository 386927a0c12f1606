package cni_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/internal/calicotest"
	"github.com/vpp-route-agent/vpp-route-agent/internal/etcdconfig"
	"github.com/vpp-route-agent/vpp-route-agent/internal/etcdtest"
	"github.com/vpp-route-agent/vpp-route-agent/internal/ipamcheck"
)

// hostLocalModule is the host-local plugin the benchmark compares against, built from the module
// proxy (or cache) with `go install`, which leaves this module's go.mod alone.
const hostLocalModule = "github.com/containernetworking/plugins/plugins/ipam/host-local@v1.9.1"

// benchSamples is the number of sequential ADDs (and DELs) measured per plugin.
const benchSamples = 200

// BenchmarkAddDel compares block-ipam with host-local on this machine, both called through libcni as a
// runtime does (one plugin process per call): sequential ADD and DEL latency (p50, p99), 100 concurrent
// ADDs on one node (wall time, duplicates), and block-ipam's etcd round trips per ADD, counted by the
// daemon and by etcd's own gRPC server metrics. block-ipam's daemon runs as its own process and
// reaches etcd over mutual TLS. Samples of the two plugins are interleaved so that both see the same
// background load. Run: make bench, or
//
//	go test -run '^$' -bench AddDel -benchtime 1x ./cni
func BenchmarkAddDel(b *testing.B) {
	tmp := b.TempDir()
	pki := etcdtest.NewPKI(b, tmp)
	ep := etcdtest.StartTLS(b, pki, tmp)
	etcdConf := etcdconfig.Config{Endpoints: []string{ep}, CACertFile: pki.CA, CertFile: pki.ClientCert, KeyFile: pki.ClientKey,
		DialTimeout: 5 * time.Second, RequestTimeout: 5 * time.Second}
	cli, err := etcdConf.Client()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cli.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	pool := calico.IPPool{Name: "default-ipv4-ippool", CIDR: netip.MustParsePrefix("10.244.0.0/16"), BlockSize: 26}
	if err := calicotest.PutPool(ctx, cli, pool); err != nil {
		b.Fatal(err)
	}
	sockDir, err := os.MkdirTemp("", "bi")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(sockDir) })
	startDaemon := func(node string) string {
		sock := filepath.Join(sockDir, node+".sock")
		cmd := exec.CommandContext(ctx, filepath.Join(pluginDir, "block-ipamd"), "--nodename", node, "--socket", sock,
			"--metrics-address", "", "--log-level", "warn",
			"--etcd-endpoints", ep, "--etcd-ca-cert-file", pki.CA, "--etcd-cert-file", pki.ClientCert, "--etcd-key-file", pki.ClientKey)
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { cmd.Process.Signal(syscall.SIGTERM); cmd.Wait() })
		if err := waitSocket(ctx, sock); err != nil {
			b.Fatal(err)
		}
		return sock
	}

	logFile := filepath.Join(tmp, "block-ipam.log")
	blockList := func(sock string) *libcni.NetworkConfigList {
		return confList(b, map[string]any{"type": "block-ipam", "ipam": map[string]any{
			"type": "block-ipam", "socket": sock, "log_file": logFile, "log_level": "info"}})
	}
	hlList := func(dir string) *libcni.NetworkConfigList {
		return confList(b, map[string]any{"type": "host-local", "ipam": map[string]any{
			"type": "host-local", "dataDir": filepath.Join(tmp, dir), "ranges": [][]map[string]string{{{"subnet": "10.244.0.0/16"}}}}})
	}
	hlBin, hlErr := buildHostLocal(tmp)
	if hlErr != nil {
		b.Logf("host-local unavailable, reporting block-ipam alone: %v", hlErr)
	}
	runtime := func(dir string) *libcni.CNIConfig {
		exec := &invoke.DefaultExec{RawExec: &invoke.RawExec{Stderr: os.Stderr}, PluginDecoder: version.PluginDecoder{}}
		return libcni.NewCNIConfigWithCacheDir([]string{dir}, filepath.Join(tmp, "cache-"+filepath.Base(dir)), exec)
	}
	blockRT := runtime(pluginDir)
	var hlRT *libcni.CNIConfig
	if hlBin != "" {
		hlRT = runtime(filepath.Dir(hlBin))
	}
	call := func(rt *libcni.CNIConfig, list *libcni.NetworkConfigList, cmd, cid string) (time.Duration, *current.Result, error) {
		conf := &libcni.RuntimeConf{ContainerID: cid, IfName: "eth0", NetNS: "/var/run/netns/" + cid}
		start := time.Now()
		var res types.Result
		var err error
		if cmd == "ADD" {
			res, err = rt.AddNetworkList(ctx, list, conf)
		} else {
			err = rt.DelNetworkList(ctx, list, conf)
		}
		d := time.Since(start)
		if err != nil {
			return d, nil, fmt.Errorf("%s %s %s: %w", list.Plugins[0].Network.Type, cmd, cid, err)
		}
		if res == nil {
			return d, nil, nil
		}
		r, err := current.NewResultFromResult(res)
		return d, r, err
	}

	seqSock := startDaemon("bench-node")
	blockSeq := blockList(seqSock)
	// Warm up both (page cache, the node's first block, host-local's data dir).
	if _, _, err := call(blockRT, blockSeq, "ADD", "warmup"); err != nil {
		b.Fatal(err)
	}
	if hlRT != nil {
		if _, _, err := call(hlRT, hlList("seq"), "ADD", "warmup"); err != nil {
			b.Fatal(err)
		}
	}
	rpcBefore := etcdKVRPCs(b)
	logBefore := logLines(logFile)

	b.ResetTimer()
	var blockAdd, blockDel, hlAdd, hlDel []time.Duration
	for _, cmd := range []string{"ADD", "DEL"} {
		for i := range benchSamples {
			cid := fmt.Sprintf("seq%04d", i)
			d, _, err := call(blockRT, blockSeq, cmd, cid)
			if err != nil {
				b.Fatal(err)
			}
			if cmd == "ADD" {
				blockAdd = append(blockAdd, d)
			} else {
				blockDel = append(blockDel, d)
			}
			if hlRT == nil {
				continue
			}
			d, _, err = call(hlRT, hlList("seq"), cmd, cid)
			if err != nil {
				b.Fatal(err)
			}
			if cmd == "ADD" {
				hlAdd = append(hlAdd, d)
			} else {
				hlDel = append(hlDel, d)
			}
		}
		// Round trips of this phase, counted by the daemon and by etcd's server.
		rpcAfter, logAfter := etcdKVRPCs(b), logLines(logFile)
		reportRoundTrips(b, cmd, roundTripsByVerb(logAfter[len(logBefore):], cmd), rpcAfter-rpcBefore)
		fmt.Printf("block-ipam %s: the plugin's request to the daemon (socket, daemon, etcd) p50 %.2f ms\n", cmd,
			pctFloat(callMillis(logAfter[len(logBefore):], cmd), 50))
		rpcBefore, logBefore = rpcAfter, logAfter
	}

	// 100 concurrent ADDs on a fresh node (block-ipam: its own daemon) and a fresh data dir (host-local).
	parList := blockList(startDaemon("par-node"))
	logBefore = logLines(logFile)
	blockWall, blockDup, err := concurrentAdds(100, func(i int) (*current.Result, error) {
		_, r, err := call(blockRT, parList, "ADD", fmt.Sprintf("par%03d", i))
		return r, err
	})
	if err != nil {
		b.Fatal(err)
	}
	parLines := logLines(logFile)[len(logBefore):]
	par, parRTs, served := callMillis(parLines, "ADD"), 0, 0
	for _, n := range roundTripsByVerb(parLines, "ADD") {
		parRTs += n
		if n == 0 {
			served++
		}
	}
	fmt.Printf("block-ipam 100 concurrent ADDs: the plugin's request to the daemon p50 %.2f ms, max %.2f ms; %d etcd round trips in all, %d ADDs served by another's transaction\n",
		pctFloat(par, 50), pctFloat(par, 100), parRTs, served)
	var hlWall time.Duration
	hlDup := -1
	if hlRT != nil {
		if hlWall, hlDup, err = concurrentAdds(100, func(i int) (*current.Result, error) {
			_, r, err := call(hlRT, hlList("par"), "ADD", fmt.Sprintf("par%03d", i))
			return r, err
		}); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if err := ipamcheck.Check(ctx, cli, ipamcheck.Options{}); err != nil {
		b.Errorf("invariants after the benchmark: %v", err)
	}

	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	row := func(name string, blk, hl float64, unit string) {
		ratio := "-"
		if hl > 0 {
			ratio = fmt.Sprintf("%.2fx", blk/hl)
		}
		fmt.Printf("  %-32s %12.2f %12.2f %8s  %s\n", name, blk, hl, ratio, unit)
	}
	fmt.Printf("\nblock-ipam (daemon, etcd over mTLS) vs host-local v1.9.1, %d sequential calls each (interleaved), through libcni:\n", benchSamples)
	fmt.Printf("  %-32s %12s %12s %8s\n", "", "block-ipam", "host-local", "ratio")
	row("ADD p50", ms(pct(blockAdd, 50)), ms(pct(hlAdd, 50)), "ms")
	row("ADD p99", ms(pct(blockAdd, 99)), ms(pct(hlAdd, 99)), "ms")
	row("DEL p50", ms(pct(blockDel, 50)), ms(pct(hlDel, 50)), "ms")
	row("DEL p99", ms(pct(blockDel, 99)), ms(pct(hlDel, 99)), "ms")
	row("100 concurrent ADDs, wall", blockWall.Seconds(), hlWall.Seconds(), "s")
	fmt.Printf("  %-32s %12d %12d\n", "duplicate addresses (100 conc.)", blockDup, hlDup)
	b.ReportMetric(ms(pct(blockAdd, 50)), "blockipam-add-p50-ms")
	b.ReportMetric(ms(pct(blockAdd, 99)), "blockipam-add-p99-ms")
	b.ReportMetric(ms(pct(blockDel, 50)), "blockipam-del-p50-ms")
	b.ReportMetric(ms(pct(blockDel, 99)), "blockipam-del-p99-ms")
	b.ReportMetric(blockWall.Seconds(), "blockipam-100conc-s")
	b.ReportMetric(float64(blockDup), "blockipam-dups")
	if hlRT != nil {
		b.ReportMetric(ms(pct(hlAdd, 50)), "hostlocal-add-p50-ms")
		b.ReportMetric(ms(pct(hlAdd, 99)), "hostlocal-add-p99-ms")
		b.ReportMetric(ms(pct(hlDel, 50)), "hostlocal-del-p50-ms")
		b.ReportMetric(ms(pct(hlDel, 99)), "hostlocal-del-p99-ms")
		b.ReportMetric(hlWall.Seconds(), "hostlocal-100conc-s")
		b.ReportMetric(ms(pct(blockAdd, 50))/ms(pct(hlAdd, 50)), "add-p50-ratio")
		b.ReportMetric(ms(pct(blockDel, 50))/ms(pct(hlDel, 50)), "del-p50-ratio")
		b.ReportMetric(blockWall.Seconds()/hlWall.Seconds(), "100conc-ratio")
	}
}

// confList is a network configuration list with one plugin.
func confList(tb testing.TB, plugin map[string]any) *libcni.NetworkConfigList {
	tb.Helper()
	data, _ := json.Marshal(map[string]any{"cniVersion": "1.1.0", "name": "net1", "plugins": []any{plugin}})
	l, err := libcni.NetworkConfFromBytes(data)
	if err != nil {
		tb.Fatal(err)
	}
	return l
}

// waitSocket waits until a daemon listens on the unix socket.
func waitSocket(ctx context.Context, sock string) error {
	for {
		c, err := net.Dial("unix", sock)
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("daemon on %s: %w", sock, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// buildHostLocal installs host-local into dir/bin with this machine's toolchain and block-ipam's
// build flags (CGO off, -trimpath, stripped).
func buildHostLocal(dir string) (string, error) {
	bin := filepath.Join(dir, "bin")
	cmd := exec.Command("go", append(append([]string{"install"}, buildFlags...), hostLocalModule)...)
	cmd.Env = append(os.Environ(), "GOBIN="+bin, "CGO_ENABLED=0", "GOFLAGS=")
	cmd.Dir = dir // outside this module: go install pkg@version builds in its own module context
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go install %s: %v\n%s", hostLocalModule, err, out)
	}
	return filepath.Join(bin, "host-local"), nil
}

// concurrentAdds starts n ADDs at once and returns the wall time and the number of addresses handed
// out more than once.
func concurrentAdds(n int, add func(i int) (*current.Result, error)) (time.Duration, int, error) {
	outs := make([]*current.Result, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[i], errs[i] = add(i)
		}()
	}
	wg.Wait()
	wall := time.Since(start)
	seen := map[string]int{}
	dups := 0
	for i, out := range outs {
		if errs[i] != nil {
			return wall, 0, errs[i]
		}
		if out == nil || len(out.IPs) == 0 {
			return wall, 0, fmt.Errorf("ADD %d: no address in %v", i, out)
		}
		for _, ip := range out.IPs {
			if seen[ip.Address.String()]++; seen[ip.Address.String()] == 2 {
				dups++
			}
		}
	}
	return wall, dups, nil
}

func pct(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*p/100)]
}

// etcdKVRPCs sums the KV RPCs etcd's gRPC server has handled in this process: the daemon's requests
// counted on the server side, independently of the daemon's own count.
func etcdKVRPCs(b *testing.B) float64 {
	mfs, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		b.Fatal(err)
	}
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() != "grpc_server_handled_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "grpc_service" && l.GetValue() == "etcdserverpb.KV" {
					total += m.GetCounter().GetValue()
				}
			}
		}
	}
	return total
}

var callDuration = regexp.MustCompile(`msg=(\w+) .*duration_ms=([0-9.]+)`)

// callMillis returns the durations of the daemon requests the plugin logged for the verb.
func callMillis(lines []string, verb string) []float64 {
	var out []float64
	for _, l := range lines {
		if m := callDuration.FindStringSubmatch(l); m != nil && m[1] == verb {
			f, _ := strconv.ParseFloat(m[2], 64)
			out = append(out, f)
		}
	}
	return out
}

func pctFloat(v []float64, p int) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*p/100)]
}

var verbRoundTrips = regexp.MustCompile(`msg=(\w+) .*etcd_round_trips=(\d+)`)

func logLines(path string) []string {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		out = append(out, sc.Text())
	}
	return out
}

// roundTripsByVerb returns the round trips the plugin logged for each call of the verb.
func roundTripsByVerb(lines []string, verb string) []int {
	var out []int
	for _, l := range lines {
		if m := verbRoundTrips.FindStringSubmatch(l); m != nil && m[1] == verb {
			n, _ := strconv.Atoi(m[2])
			out = append(out, n)
		}
	}
	return out
}

func reportRoundTrips(b *testing.B, verb string, rts []int, serverRPCs float64) {
	hist := map[int]int{}
	total := 0
	for _, n := range rts {
		hist[n]++
		total += n
	}
	common := 0
	for n, c := range hist {
		if c > hist[common] {
			common = n
		}
	}
	n := float64(max(1, len(rts)))
	fmt.Printf("block-ipam etcd round trips per %s over %d calls: common path %d, mean %.2f (daemon's count), %.2f (etcd server's count); histogram %v\n",
		verb, len(rts), common, float64(total)/n, serverRPCs/n, hist)
	b.ReportMetric(float64(common), "etcd-rtt/"+strings.ToLower(verb)+"-common")
	b.ReportMetric(serverRPCs/n, "etcd-rpcs/"+strings.ToLower(verb)+"-server")
}
