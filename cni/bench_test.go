package cni_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
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

// Sizes of the benchmark: sequential calls per plugin and verb, concurrent ADDs per burst, bursts,
// and plugin starts (VERSION) per plugin. About 10 s in all on a 2-core machine.
const (
	benchSamples  = 200
	burstSize     = 100
	burstRounds   = 5
	versionProbes = 60
)

// BenchmarkAddDel compares block-ipam with host-local on this machine, both called through libcni as a
// runtime does (one plugin process per call):
//
//   - sequential ADD and DEL latency (p50, p90, p99), split into the plugin process's lifetime and
//     libcni's own work around it, with the plugin process's CPU time;
//   - the plugin's start alone (VERSION, executed directly);
//   - burstRounds bursts of burstSize concurrent ADDs on one node, then as many concurrent DELs (wall
//     time of each, duplicates);
//   - block-ipam's etcd round trips per ADD and DEL, counted by the daemon and by etcd's own gRPC
//     server metrics, and the daemon's CPU time per call.
//
// block-ipam's daemon runs as its own process and reaches etcd over mutual TLS. Samples of the two
// plugins are interleaved, and which plugin goes first alternates from one sample (and burst) to the
// next: a call runs a little slower right after the other plugin's (the daemon's and etcd's work
// after a reply), and a fixed order would always hand that cost to the same plugin. Run: make bench, or
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
	startDaemon := func(node string) (string, int) {
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
		return sock, cmd.Process.Pid
	}

	logFile := filepath.Join(tmp, "block-ipam.log")
	blockPlugin := &benchPlugin{name: "block-ipam", exec: newTimedExec()}
	blockPlugin.rt = libcni.NewCNIConfigWithCacheDir([]string{pluginDir}, filepath.Join(tmp, "cache-block"), blockPlugin.exec)
	blockPlugin.list = func(sock string) *libcni.NetworkConfigList {
		return confList(b, map[string]any{"type": "block-ipam", "ipam": map[string]any{
			"type": "block-ipam", "socket": sock, "log_file": logFile, "log_level": "info"}})
	}
	plugins := []*benchPlugin{blockPlugin}
	hlBin, hlErr := buildHostLocal(tmp)
	if hlErr != nil {
		b.Logf("host-local unavailable, reporting block-ipam alone: %v", hlErr)
	} else {
		hl := &benchPlugin{name: "host-local", exec: newTimedExec()}
		hl.rt = libcni.NewCNIConfigWithCacheDir([]string{filepath.Dir(hlBin)}, filepath.Join(tmp, "cache-hl"), hl.exec)
		hl.list = func(dir string) *libcni.NetworkConfigList {
			return confList(b, map[string]any{"type": "host-local", "ipam": map[string]any{
				"type": "host-local", "dataDir": filepath.Join(tmp, dir), "ranges": [][]map[string]string{{{"subnet": "10.244.0.0/16"}}}}})
		}
		plugins = append(plugins, hl)
	}
	// The floor: a Go plugin that does no work (testdata/nullplugin), in the bursts only.
	floor := &benchPlugin{name: "nullplugin", exec: newTimedExec()}
	if dir, err := buildNullPlugin(tmp); err != nil {
		b.Logf("nullplugin unavailable, no floor reported: %v", err)
		floor = nil
	} else {
		floor.rt = libcni.NewCNIConfigWithCacheDir([]string{dir}, filepath.Join(tmp, "cache-null"), floor.exec)
		floor.par = confList(b, map[string]any{"type": "nullplugin", "ipam": map[string]any{"type": "nullplugin"}})
		if _, err := floor.call(ctx, floor.par, "ADD", "warmup"); err != nil {
			b.Fatal(err)
		}
	}

	seqSock, seqPid := startDaemon("bench-node")
	blockPlugin.seq = blockPlugin.list(seqSock)
	if len(plugins) > 1 {
		plugins[1].seq = plugins[1].list("seq")
	}
	// Warm up both (page cache, the node's first block, host-local's data dir).
	for _, p := range plugins {
		if _, err := p.call(ctx, p.seq, "ADD", "warmup"); err != nil {
			b.Fatal(err)
		}
	}
	rpcBefore := etcdKVRPCs(b)
	logBefore := logLines(logFile)

	b.ResetTimer()
	// Plugin start: VERSION executed directly, as libcni does it, without the daemon.
	for i := range versionProbes {
		for j := range plugins {
			p := plugins[(i+j)%len(plugins)]
			if err := p.version(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
	daemonCPU := map[string]time.Duration{}
	for _, cmd := range []string{"ADD", "DEL"} {
		cpu0 := processCPU(seqPid)
		for i := range benchSamples {
			cid := fmt.Sprintf("seq%04d", i)
			for j := range plugins {
				p := plugins[(i+j)%len(plugins)]
				if _, err := p.call(ctx, p.seq, cmd, cid); err != nil {
					b.Fatal(err)
				}
			}
		}
		daemonCPU[cmd] = (processCPU(seqPid) - cpu0) / benchSamples
		// Round trips of this phase, counted by the daemon and by etcd's server.
		rpcAfter, logAfter := etcdKVRPCs(b), logLines(logFile)
		reportRoundTrips(b, cmd, roundTripsByVerb(logAfter[len(logBefore):], cmd), rpcAfter-rpcBefore)
		fmt.Printf("block-ipam %s: the plugin's request to the daemon (socket, daemon, etcd) p50 %.2f ms; the daemon's CPU %.2f ms per call\n", cmd,
			pctFloat(callMillis(logAfter[len(logBefore):], cmd), 50), ms(daemonCPU[cmd]))
		rpcBefore, logBefore = rpcAfter, logAfter
	}

	// Bursts of concurrent ADDs on one node (block-ipam: a daemon of its own, a fresh node at the
	// first burst; host-local: a data dir of its own), each followed by as many concurrent DELs.
	parSock, parPid := startDaemon("par-node")
	blockPlugin.par, blockPlugin.daemonPid = blockPlugin.list(parSock), parPid
	if len(plugins) > 1 {
		plugins[1].par = plugins[1].list("par")
	}
	var parLines []string
	for round := range burstRounds {
		for j := range plugins {
			p := plugins[(round+j)%len(plugins)]
			before := len(logLines(logFile))
			if err := p.burst(ctx, round); err != nil {
				b.Fatal(err)
			}
			if p == blockPlugin {
				parLines = append(parLines, logLines(logFile)[before:]...)
			}
		}
		if floor != nil {
			if err := floor.burst(ctx, round); err != nil {
				b.Fatal(err)
			}
		}
	}
	par, parRTs, served, parADDs := callMillis(parLines, "ADD"), 0, 0, 0
	for _, n := range roundTripsByVerb(parLines, "ADD") {
		parRTs += n
		parADDs++
		if n == 0 {
			served++
		}
	}
	fmt.Printf("block-ipam %d bursts of %d concurrent ADDs: the plugin's request to the daemon p50 %.2f ms, max %.2f ms; %d etcd round trips for %d ADDs, %d ADDs served by another's transaction\n",
		burstRounds, burstSize, pctFloat(par, 50), pctFloat(par, 100), parRTs, parADDs, served)
	b.StopTimer()
	if err := ipamcheck.Check(ctx, cli, ipamcheck.Options{}); err != nil {
		b.Errorf("invariants after the benchmark: %v", err)
	}

	hlp := &benchPlugin{}
	if len(plugins) > 1 {
		hlp = plugins[1]
	}
	row := func(name string, blk, hl float64, unit string) {
		ratio := "-"
		if hl > 0 {
			ratio = fmt.Sprintf("%.2fx", blk/hl)
		}
		fmt.Printf("  %-40s %10.2f %10.2f %7s  %s\n", name, blk, hl, ratio, unit)
	}
	// The bursts are CPU-bound: how many CPUs this process tree may use (taskset) decides them.
	fmt.Printf("\nblock-ipam (daemon, etcd over mTLS) vs host-local v1.9.1 through libcni on %d CPUs, %d sequential calls each (interleaved):\n",
		runtime.NumCPU(), benchSamples)
	fmt.Printf("  %-40s %10s %10s %7s\n", "", "block-ipam", "host-local", "ratio")
	row("plugin start (VERSION, direct exec) p50", ms(pct(blockPlugin.versions, 50)), ms(pct(hlp.versions, 50)), "ms")
	// What a call costs the plugin beyond starting is its CPU less this.
	row("  VERSION plugin process CPU, mean", ms(mean(blockPlugin.versionCPU)), ms(mean(hlp.versionCPU)), "ms")
	for _, cmd := range []string{"ADD", "DEL"} {
		for _, q := range []int{50, 90, 99} {
			row(fmt.Sprintf("%s p%d", cmd, q), ms(pct(blockPlugin.total[cmd], q)), ms(pct(hlp.total[cmd], q)), "ms")
		}
		row("  "+cmd+" p50: plugin process", ms(pct(blockPlugin.proc[cmd], 50)), ms(pct(hlp.proc[cmd], 50)), "ms")
		row("  "+cmd+" p50: libcni around it", ms(pct(blockPlugin.overhead[cmd], 50)), ms(pct(hlp.overhead[cmd], 50)), "ms")
		row("  "+cmd+" plugin process CPU, mean", ms(mean(blockPlugin.cpu[cmd])), ms(mean(hlp.cpu[cmd])), "ms")
		fmt.Printf("  %-40s %10.2f %10s %7s  ms\n", "  "+cmd+" daemon CPU, mean", ms(daemonCPU[cmd]), "-", "")
	}
	burstRatio := map[string]float64{}
	for _, cmd := range []string{"ADD", "DEL"} {
		bw, hw := blockPlugin.bursts[cmd], hlp.bursts[cmd]
		row(fmt.Sprintf("%d concurrent %ss, wall, median", burstSize, cmd), med(bw).Seconds(), med(hw).Seconds(), "s")
		fmt.Printf("  %-40s %s\n", "  each burst, block-ipam", secs(bw))
		fmt.Printf("  %-40s %s\n", "  each burst, host-local", secs(hw))
		// The two plugins' bursts of one round run back to back, under about the same background load:
		// the median of the rounds' ratios is steadier than the ratio of the medians.
		var ratios []float64
		for i := range min(len(bw), len(hw)) {
			ratios = append(ratios, bw[i].Seconds()/hw[i].Seconds())
		}
		if len(ratios) > 0 {
			burstRatio[cmd] = pctFloat(ratios, 50)
			fmt.Printf("  %-40s %.2fx (rounds: %s)\n", "  ratio, median of the rounds'", burstRatio[cmd], floats(ratios))
		}
	}
	fmt.Printf("  %-40s %10d %10d\n", fmt.Sprintf("duplicate addresses (%d conc.)", burstSize), blockPlugin.dups, hlp.dups)
	// Where the bursts' CPU went, per call: what bounds them on a machine with few cores.
	perCall := func(p *benchPlugin, verb string) (float64, float64, float64) {
		u := p.burstCPU[verb]
		if u == nil {
			return 0, 0, 0
		}
		n := time.Duration(len(p.bursts[verb]) * burstSize)
		return ms(u.plugins / n), ms(u.self / n), ms(u.daemon / n)
	}
	for _, verb := range []string{"ADD", "DEL"} {
		bp, bs, bd := perCall(blockPlugin, verb)
		hp, hs, _ := perCall(hlp, verb)
		fmt.Printf("  %-40s plugin %.2f + libcni and etcd %.2f + daemon %.2f = %.2f ms; host-local %.2f + libcni %.2f = %.2f ms\n",
			"CPU per call in the "+verb+" bursts", bp, bs, bd, bp+bs+bd, hp, hs, hp+hs)
	}
	if floor != nil && len(plugins) > 1 {
		// The same bursts of a Go plugin that does nothing: no plugin executed per call and written in Go
		// can go below this ratio on this machine.
		fmt.Printf("\nthe floor, a Go plugin that does no work (testdata/nullplugin), same bursts through libcni:\n")
		for _, cmd := range []string{"ADD", "DEL"} {
			fw, hw := floor.bursts[cmd], hlp.bursts[cmd]
			var ratios []float64
			for i := range min(len(fw), len(hw)) {
				ratios = append(ratios, fw[i].Seconds()/hw[i].Seconds())
			}
			fp, fs, _ := perCall(floor, cmd)
			fmt.Printf("  %-40s %10.2f s, %.2fx host-local (rounds: %s); CPU per call: plugin %.2f + libcni %.2f ms\n", fmt.Sprintf("%d concurrent %ss, wall, median", burstSize, cmd),
				med(fw).Seconds(), pctFloat(ratios, 50), floats(ratios), fp, fs)
			if cmd == "ADD" {
				b.ReportMetric(pctFloat(ratios, 50), "100conc-floor-ratio")
			}
		}
	}

	b.ReportMetric(ms(pct(blockPlugin.total["ADD"], 50)), "blockipam-add-p50-ms")
	b.ReportMetric(ms(pct(blockPlugin.total["ADD"], 99)), "blockipam-add-p99-ms")
	b.ReportMetric(ms(pct(blockPlugin.total["DEL"], 50)), "blockipam-del-p50-ms")
	b.ReportMetric(ms(pct(blockPlugin.total["DEL"], 99)), "blockipam-del-p99-ms")
	b.ReportMetric(med(blockPlugin.bursts["ADD"]).Seconds(), "blockipam-100conc-s")
	b.ReportMetric(float64(blockPlugin.dups), "blockipam-dups")
	if len(plugins) > 1 {
		b.ReportMetric(ms(pct(hlp.total["ADD"], 50)), "hostlocal-add-p50-ms")
		b.ReportMetric(ms(pct(hlp.total["ADD"], 99)), "hostlocal-add-p99-ms")
		b.ReportMetric(ms(pct(hlp.total["DEL"], 50)), "hostlocal-del-p50-ms")
		b.ReportMetric(ms(pct(hlp.total["DEL"], 99)), "hostlocal-del-p99-ms")
		b.ReportMetric(med(hlp.bursts["ADD"]).Seconds(), "hostlocal-100conc-s")
		b.ReportMetric(ms(pct(blockPlugin.total["ADD"], 50))/ms(pct(hlp.total["ADD"], 50)), "add-p50-ratio")
		b.ReportMetric(ms(pct(blockPlugin.total["DEL"], 50))/ms(pct(hlp.total["DEL"], 50)), "del-p50-ratio")
		b.ReportMetric(burstRatio["ADD"], "100conc-ratio")
		b.ReportMetric(burstRatio["DEL"], "100conc-del-ratio")
	}
}

// benchPlugin is one plugin under benchmark: its runtime, its configurations and what was measured.
type benchPlugin struct {
	name     string
	exec     *timedExec
	rt       *libcni.CNIConfig
	list     func(string) *libcni.NetworkConfigList
	seq, par *libcni.NetworkConfigList
	// Sequential calls by verb: libcni's whole call, the plugin process within it, the rest, and the
	// plugin process's CPU time.
	total, proc, overhead, cpu map[string][]time.Duration
	versions, versionCPU       []time.Duration
	bursts                     map[string][]time.Duration
	dups                       int
	// daemonPid is the bursts' daemon (block-ipam); burstCPU the CPU the bursts of each verb used, by
	// whom, summed over the bursts.
	daemonPid int
	burstCPU  map[string]*burstCPU
}

// burstCPU is the CPU time bursts used: the plugin processes, this process (libcni's work around
// them, and the embedded etcd's for block-ipam) and the daemon.
type burstCPU struct{ plugins, self, daemon time.Duration }

// measure runs f and adds the CPU it used to p.burstCPU[verb].
func (p *benchPlugin) measure(verb string, f func()) {
	if p.burstCPU == nil {
		p.burstCPU = map[string]*burstCPU{"ADD": {}, "DEL": {}}
	}
	c, s0, d0 := childrenCPU(), selfCPU(), processCPU(p.daemonPid)
	f()
	u := p.burstCPU[verb]
	u.plugins += childrenCPU() - c
	u.self += selfCPU() - s0
	if p.daemonPid != 0 {
		u.daemon += processCPU(p.daemonPid) - d0
	}
}

// call runs one ADD or DEL through libcni; sequential calls record their figures.
func (p *benchPlugin) call(ctx context.Context, list *libcni.NetworkConfigList, cmd, cid string) (*current.Result, error) {
	if p.total == nil {
		p.total, p.proc, p.overhead, p.cpu = map[string][]time.Duration{}, map[string][]time.Duration{}, map[string][]time.Duration{}, map[string][]time.Duration{}
		p.bursts = map[string][]time.Duration{}
	}
	conf := &libcni.RuntimeConf{ContainerID: cid, IfName: "eth0", NetNS: "/var/run/netns/" + cid}
	start := time.Now()
	var res types.Result
	var err error
	if cmd == "ADD" {
		res, err = p.rt.AddNetworkList(ctx, list, conf)
	} else {
		err = p.rt.DelNetworkList(ctx, list, conf)
	}
	d := time.Since(start)
	if err != nil {
		return nil, fmt.Errorf("%s %s %s: %w", p.name, cmd, cid, err)
	}
	if list == p.seq {
		wall, cpu := p.exec.last()
		p.total[cmd] = append(p.total[cmd], d)
		p.proc[cmd] = append(p.proc[cmd], wall)
		p.overhead[cmd] = append(p.overhead[cmd], d-wall)
		p.cpu[cmd] = append(p.cpu[cmd], cpu)
	}
	if res == nil {
		return nil, nil
	}
	return current.NewResultFromResult(res)
}

// version executes the plugin's VERSION directly, as libcni does, and records its wall time.
func (p *benchPlugin) version(ctx context.Context) error {
	path, err := p.exec.FindInPath(p.seq.Plugins[0].Network.Type, p.rt.Path)
	if err != nil {
		return err
	}
	start := time.Now()
	if _, err := p.exec.ExecPlugin(ctx, path, []byte(`{"cniVersion":"1.1.0"}`), []string{"CNI_COMMAND=VERSION"}); err != nil {
		return fmt.Errorf("%s VERSION: %w", p.name, err)
	}
	p.versions = append(p.versions, time.Since(start))
	_, cpu := p.exec.last()
	p.versionCPU = append(p.versionCPU, cpu)
	return nil
}

// burst runs burstSize concurrent ADDs, then as many concurrent DELs of the same containers.
func (p *benchPlugin) burst(ctx context.Context, round int) error {
	cid := func(i int) string { return fmt.Sprintf("par%d-%03d", round, i) }
	var wall time.Duration
	var dups int
	var err error
	p.measure("ADD", func() {
		wall, dups, err = concurrentAdds(burstSize, func(i int) (*current.Result, error) { return p.call(ctx, p.par, "ADD", cid(i)) })
	})
	if err != nil {
		return err
	}
	p.bursts["ADD"] = append(p.bursts["ADD"], wall)
	p.dups += dups
	var errs []error
	p.measure("DEL", func() {
		_, errs, wall = concurrently(burstSize, func(i int) (*current.Result, error) { return p.call(ctx, p.par, "DEL", cid(i)) })
	})
	p.bursts["DEL"] = append(p.bursts["DEL"], wall)
	return errors.Join(errs...)
}

// timedExec is libcni's default exec, also recording the wall and CPU time of the last plugin process
// (meaningful for sequential calls only: the CPU time is this process's children's).
type timedExec struct {
	invoke.Exec
	mu        sync.Mutex
	wall, cpu time.Duration
}

func newTimedExec() *timedExec {
	return &timedExec{Exec: &invoke.DefaultExec{RawExec: &invoke.RawExec{Stderr: os.Stderr}, PluginDecoder: version.PluginDecoder{}}}
}

func (e *timedExec) ExecPlugin(ctx context.Context, path string, stdin []byte, environ []string) ([]byte, error) {
	cpu0 := childrenCPU()
	start := time.Now()
	out, err := e.Exec.ExecPlugin(ctx, path, stdin, environ)
	wall := time.Since(start)
	cpu := childrenCPU() - cpu0
	e.mu.Lock()
	e.wall, e.cpu = wall, cpu
	e.mu.Unlock()
	return out, err
}

func (e *timedExec) last() (time.Duration, time.Duration) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.wall, e.cpu
}

// selfCPU is the CPU time (user and system) this process has used so far.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// childrenCPU is the CPU time (user and system) of this process's children that have exited.
func childrenCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// processCPU is the CPU time (user and system) a running process has used so far, from /proc; 0 when
// it cannot be read.
func processCPU(pid int) time.Duration {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// Fields after the command name, which is in parentheses and may contain spaces.
	f := strings.Fields(string(data[bytes.LastIndexByte(data, ')')+1:]))
	if len(f) < 13 {
		return 0
	}
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * time.Second / clockTicks
}

// clockTicks is the kernel's USER_HZ, the unit of /proc/<pid>/stat times: 100 on every Linux
// architecture Go supports.
const clockTicks = 100

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func mean(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	var sum time.Duration
	for _, x := range d {
		sum += x
	}
	return sum / time.Duration(len(d))
}

func med(d []time.Duration) time.Duration { return pct(d, 50) }

// floats lists numbers with two decimals.
func floats(v []float64) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = fmt.Sprintf("%.2f", x)
	}
	return strings.Join(s, " ")
}

// secs lists durations in seconds.
func secs(d []time.Duration) string {
	v := make([]float64, len(d))
	for i, x := range d {
		v[i] = x.Seconds()
	}
	return floats(v)
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
// build flags (CGO off, -trimpath, stripped), rewritten as buildPlugin rewrites block-ipam.
func buildHostLocal(dir string) (string, error) {
	bin := filepath.Join(dir, "bin")
	cmd := exec.Command("go", append(append([]string{"install"}, buildFlags...), hostLocalModule)...)
	cmd.Env = append(os.Environ(), "GOBIN="+bin, "CGO_ENABLED=0", "GOFLAGS=")
	cmd.Dir = dir // outside this module: go install pkg@version builds in its own module context
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go install %s: %v\n%s", hostLocalModule, err, out)
	}
	path := filepath.Join(bin, "host-local")
	return path, rewrite(path)
}

// buildNullPlugin builds testdata/nullplugin with block-ipam's build flags into dir/null, rewritten as
// the other plugins are, and returns that directory.
func buildNullPlugin(dir string) (string, error) {
	out := filepath.Join(dir, "null")
	cmd := exec.Command("go", append(append([]string{"build"}, buildFlags...), "-o", out+"/", "./testdata/nullplugin")...)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if msg, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build nullplugin: %v\n%s", err, msg)
	}
	return out, rewrite(filepath.Join(out, "nullplugin"))
}

// concurrentAdds starts n ADDs at once and returns the wall time and the number of addresses handed
// out more than once.
func concurrentAdds(n int, add func(i int) (*current.Result, error)) (time.Duration, int, error) {
	outs, errs, wall := concurrently(n, add)
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

// concurrently runs f(0) ... f(n-1) at once and returns their results and errors by index, and the
// wall time until the last returned.
func concurrently(n int, f func(i int) (*current.Result, error)) ([]*current.Result, []error, time.Duration) {
	res := make([]*current.Result, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[i], errs[i] = f(i)
		}()
	}
	wg.Wait()
	return res, errs, time.Since(start)
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
