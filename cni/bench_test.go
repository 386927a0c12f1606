package cni_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/internal/calicotest"
	"github.com/vpp-route-agent/vpp-route-agent/internal/etcdtest"
	"github.com/vpp-route-agent/vpp-route-agent/internal/ipamcheck"
)

// hostLocalModule is the host-local plugin the benchmark compares against, built from the module
// proxy (or cache) with `go install`, which leaves this module's go.mod alone.
const hostLocalModule = "github.com/containernetworking/plugins/plugins/ipam/host-local@v1.9.1"

// benchSamples is the number of sequential ADDs (and DELs) measured per plugin.
const benchSamples = 200

// BenchmarkAddDel compares block-ipam with host-local on this machine, both exec'd as a runtime
// does (environment and stdin, one process per call): sequential ADD and DEL latency (p50, p99),
// 100 concurrent ADDs on one node (wall time, duplicates), and block-ipam's etcd round trips per ADD,
// counted by the plugin's client and by etcd's own gRPC server metrics. Samples of the two plugins
// are interleaved so that both see the same background load. Run: make bench, or
//
//	go test -run '^$' -bench AddDel -benchtime 1x ./cni
func BenchmarkAddDel(b *testing.B) {
	tmp := b.TempDir()
	srv, err := etcdtest.New(etcdtest.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(srv.Close)
	cli, err := srv.Client()
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

	logFile := filepath.Join(tmp, "block-ipam.log")
	blockConf := func(node string) []byte {
		c, _ := json.Marshal(map[string]any{"cniVersion": "1.1.0", "name": "net1", "type": "block-ipam", "ipam": map[string]any{
			"type": "block-ipam", "etcd_endpoints": srv.Endpoint(), "nodename": node,
			"lock_file": filepath.Join(tmp, node+".lock"), "log_file": logFile, "log_level": "info"}})
		return c
	}
	hlConf := func(dir string) []byte {
		c, _ := json.Marshal(map[string]any{"cniVersion": "1.1.0", "name": "net1", "type": "host-local", "ipam": map[string]any{
			"type": "host-local", "dataDir": filepath.Join(tmp, dir), "ranges": [][]map[string]string{{{"subnet": "10.244.0.0/16"}}}}})
		return c
	}
	blockBin := filepath.Join(pluginDir, "block-ipam")
	hlBin, hlErr := buildHostLocal(tmp)
	if hlErr != nil {
		b.Logf("host-local unavailable, reporting block-ipam alone: %v", hlErr)
	}
	execOnce := func(bin, cmd, cid string, conf []byte) (time.Duration, []byte, error) {
		c := exec.CommandContext(ctx, bin)
		c.Env = []string{"CNI_COMMAND=" + cmd, "CNI_CONTAINERID=" + cid, "CNI_IFNAME=eth0", "CNI_NETNS=/var/run/netns/" + cid, "CNI_PATH=" + filepath.Dir(bin)}
		c.Stdin = bytes.NewReader(conf)
		start := time.Now()
		out, err := c.Output()
		d := time.Since(start)
		if err != nil {
			return d, out, fmt.Errorf("%s %s %s: %v: %s", filepath.Base(bin), cmd, cid, err, out)
		}
		return d, out, nil
	}

	// Warm up both (page cache, the node's first block, host-local's data dir).
	if _, _, err := execOnce(blockBin, "ADD", "warmup", blockConf("bench-node")); err != nil {
		b.Fatal(err)
	}
	if hlBin != "" {
		if _, _, err := execOnce(hlBin, "ADD", "warmup", hlConf("seq")); err != nil {
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
			d, _, err := execOnce(blockBin, cmd, cid, blockConf("bench-node"))
			if err != nil {
				b.Fatal(err)
			}
			if cmd == "ADD" {
				blockAdd = append(blockAdd, d)
			} else {
				blockDel = append(blockDel, d)
			}
			if hlBin == "" {
				continue
			}
			d, _, err = execOnce(hlBin, cmd, cid, hlConf("seq"))
			if err != nil {
				b.Fatal(err)
			}
			if cmd == "ADD" {
				hlAdd = append(hlAdd, d)
			} else {
				hlDel = append(hlDel, d)
			}
		}
		// Round trips of this phase, counted by the plugin and by etcd's server.
		rpcAfter, logAfter := etcdKVRPCs(b), logLines(logFile)
		reportRoundTrips(b, cmd, roundTripsByVerb(logAfter[len(logBefore):], cmd), rpcAfter-rpcBefore)
		rpcBefore, logBefore = rpcAfter, logAfter
	}

	// 100 concurrent ADDs on a fresh node (block-ipam) and a fresh data dir (host-local).
	blockWall, blockDup, err := concurrentAdds(100, func(i int) ([]byte, error) {
		_, out, err := execOnce(blockBin, "ADD", fmt.Sprintf("par%03d", i), blockConf("par-node"))
		return out, err
	})
	if err != nil {
		b.Fatal(err)
	}
	var hlWall time.Duration
	hlDup := -1
	if hlBin != "" {
		if hlWall, hlDup, err = concurrentAdds(100, func(i int) ([]byte, error) {
			_, out, err := execOnce(hlBin, "ADD", fmt.Sprintf("par%03d", i), hlConf("par"))
			return out, err
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
	fmt.Printf("\nblock-ipam vs host-local v1.9.1, %d sequential calls each (interleaved), exec'd with env+stdin:\n", benchSamples)
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
	if hlBin != "" {
		b.ReportMetric(ms(pct(hlAdd, 50)), "hostlocal-add-p50-ms")
		b.ReportMetric(ms(pct(hlAdd, 99)), "hostlocal-add-p99-ms")
		b.ReportMetric(ms(pct(hlDel, 50)), "hostlocal-del-p50-ms")
		b.ReportMetric(ms(pct(hlDel, 99)), "hostlocal-del-p99-ms")
		b.ReportMetric(hlWall.Seconds(), "hostlocal-100conc-s")
		b.ReportMetric(ms(pct(blockAdd, 50))/ms(pct(hlAdd, 50)), "add-p50-ratio")
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
func concurrentAdds(n int, add func(i int) ([]byte, error)) (time.Duration, int, error) {
	outs := make([][]byte, n)
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
		var res struct {
			IPs []struct {
				Address string `json:"address"`
			} `json:"ips"`
		}
		if err := json.Unmarshal(out, &res); err != nil || len(res.IPs) == 0 {
			return wall, 0, fmt.Errorf("ADD %d: result %q: %v", i, out, err)
		}
		for _, ip := range res.IPs {
			if seen[ip.Address]++; seen[ip.Address] == 2 {
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

// etcdKVRPCs sums the KV RPCs etcd's gRPC server has handled in this process (the JSON gateway
// forwards each HTTP request as one gRPC call, so this counts the plugin's requests on the server
// side, independently of the plugin's own count).
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
	fmt.Printf("block-ipam etcd round trips per %s over %d calls: common path %d, mean %.2f (plugin's count), %.2f (etcd server's count); histogram %v\n",
		verb, len(rts), common, float64(total)/n, serverRPCs/n, hist)
	b.ReportMetric(float64(common), "etcd-rtt/"+strings.ToLower(verb)+"-common")
	b.ReportMetric(serverRPCs/n, "etcd-rpcs/"+strings.ToLower(verb)+"-server")
}
