package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/sirupsen/logrus"
	"go.fd.io/govpp/core"

	"github.com/vpp-route-agent/vpp-route-agent/blockwatch"
	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/internal/calicotest"
	"github.com/vpp-route-agent/vpp-route-agent/internal/etcdtest"
	"github.com/vpp-route-agent/vpp-route-agent/internal/vpptest"
	"github.com/vpp-route-agent/vpp-route-agent/test/vppsim"
	clientv3 "go.etcd.io/etcd/client/v3"
)

const (
	modulePath  = "github.com/vpp-route-agent/vpp-route-agent"
	uplinkName  = "GigabitEthernet0/8/0"
	hostsPrefix = blockwatch.DefaultHostsPrefix
	// buildVersion is stamped into the binaries, so that build_info can be checked.
	buildVersion = "e2e-test"
)

// agentBin is the daemon's binary, built by TestMain.
var agentBin string

// TestMain builds the daemon once (with the race detector when the tests have it, so
// that a race in the real process fails the test that provoked it), then runs the tests.
func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	dir, err := os.MkdirTemp("", "e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	if err := build(dir); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	agentBin = filepath.Join(dir, "vpp-route-agent")
	core.SetLogLevel(logrus.ErrorLevel) // the test's own GoVPP clients
	return m.Run()
}

func build(dir string) error {
	goTool, err := exec.LookPath("go")
	if err != nil {
		return fmt.Errorf("build the binaries: %w", err)
	}
	// Without -trimpath: the packages are then the ones the test binaries were compiled with, from the
	// build cache, and only the link is new.
	args := []string{"build", "-ldflags", "-X " + modulePath + "/internal/buildinfo.Version=" + buildVersion,
		"-o", dir + string(os.PathSeparator)}
	if raceEnabled {
		args = append(args, "-race")
	}
	args = append(args, modulePath+"/cmd/vpp-route-agent")
	start := time.Now()
	out, err := exec.Command(goTool, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	if testing.Verbose() {
		fmt.Fprintf(os.Stderr, "e2e: built the binaries (race %v) in %s\n", raceEnabled, time.Since(start).Round(time.Millisecond))
	}
	return nil
}

// childEnv is the whole environment of a child process: nothing from the caller's environment (say
// ETCD_ENDPOINTS or NODENAME) leaks into the flags' environment fall-backs.
func childEnv(extra ...string) []string {
	return append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.TempDir()}, extra...)
}

// --- the agent process ---

// proc is a child process whose stderr is kept, line by line.
type proc struct {
	t    testing.TB
	name string
	cmd  *exec.Cmd
	done chan struct{} // closed once the process has exited and its output is read
	// started is when exec was called.
	started time.Time

	mu    sync.Mutex // guards the fields below
	lines []string
	state *os.ProcessState
}

// startProc runs bin with args and the clean environment plus env, its stdout going to stdout (nil:
// discarded). The process is killed at the end of the test if it is still running; its stderr is
// logged if the test failed.
func startProc(t testing.TB, name, bin string, env []string, stdout io.Writer, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = childEnv(env...)
	cmd.Stdout = stdout
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &proc{t: t, name: name, cmd: cmd, done: make(chan struct{})}
	p.started = time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		for sc.Scan() {
			p.mu.Lock()
			p.lines = append(p.lines, sc.Text())
			p.mu.Unlock()
		}
		_, _ = io.Copy(io.Discard, stderr)
		_ = cmd.Wait()
		p.mu.Lock()
		p.state = cmd.ProcessState
		p.mu.Unlock()
	}()
	t.Cleanup(func() {
		if !p.exited() {
			_ = cmd.Process.Kill()
			<-p.done
		}
		if raceEnabled && strings.Contains(p.output(), "WARNING: DATA RACE") {
			t.Errorf("%s: the race detector found a data race:\n%s", name, p.output())
		} else if t.Failed() {
			t.Logf("%s stderr:\n%s", name, p.output())
		}
	})
	return p
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// output returns everything the process wrote to stderr so far.
func (p *proc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.lines, "\n")
}

func (p *proc) signal(sig os.Signal) {
	p.t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.t.Fatalf("%s: signal %v: %v", p.name, sig, err)
	}
}

// wait waits for the process to exit and returns its exit code and how long it took from the call.
func (p *proc) wait(within time.Duration) (int, time.Duration) {
	p.t.Helper()
	start := time.Now()
	select {
	case <-p.done:
	case <-time.After(within):
		p.t.Fatalf("%s did not exit within %s", p.name, within)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.state.ExitCode(), time.Since(start)
}

// stop sends SIGTERM and checks that the process exits with status 0 within a few seconds.
func (p *proc) stop() {
	p.t.Helper()
	p.signal(syscall.SIGTERM)
	if code, took := p.wait(8 * time.Second); code != 0 {
		p.t.Fatalf("%s exited with status %d after SIGTERM (%s)", p.name, code, took)
	}
}

// logRecord is one line of the agent's --log-format json output.
type logRecord map[string]any

func (r logRecord) str(k string) string {
	s, _ := r[k].(string)
	return s
}

func (r logRecord) time() time.Time {
	t, _ := time.Parse(time.RFC3339Nano, r.str("time"))
	return t
}

// records returns the JSON log records written so far (other lines are skipped).
func (p *proc) records() []logRecord {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []logRecord
	for _, l := range p.lines {
		var r logRecord
		if json.Unmarshal([]byte(l), &r) == nil {
			out = append(out, r)
		}
	}
	return out
}

// waitLog waits for a JSON log record with the given msg and returns it.
func (p *proc) waitLog(msg string, within time.Duration) logRecord {
	p.t.Helper()
	deadline := time.Now().Add(within)
	for {
		for _, r := range p.records() {
			if r.str("msg") == msg {
				return r
			}
		}
		if p.exited() {
			p.t.Fatalf("%s exited before logging %q", p.name, msg)
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("%s did not log %q within %s", p.name, msg, within)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// agent is a running vpp-route-agent daemon.
type agent struct {
	*proc
	// url is the base URL of its metrics and health server.
	url string
}

// agentConfig are the usual flags of a test agent; extra flags are appended to them.
type agentConfig struct {
	node   string
	etcd   string
	socket string
	// uplink is the address configured on the uplink and registered; invalid: none (dry runs).
	uplink netip.Prefix
	// logLevel defaults to info.
	logLevel string
	// uplinkIf is the uplink interface's name; default uplinkName.
	uplinkIf string
	extra    []string
}

func (c agentConfig) args() []string {
	lvl := c.logLevel
	if lvl == "" {
		lvl = "info"
	}
	ifName := c.uplinkIf
	if ifName == "" {
		ifName = uplinkName
	}
	args := []string{
		"--nodename", c.node,
		"--etcd-endpoints", c.etcd,
		"--etcd-dial-timeout", "2s",
		"--vpp-api-socket", c.socket,
		"--uplink-interface", ifName,
		"--metrics-address", "127.0.0.1:0",
		"--log-format", "json",
		"--log-level", lvl,
		"--registration-ttl", "10s",
		"--resync-interval", "1h", // drift is repaired only when a test asks for it
		"--peer-loss-grace", "1m",
	}
	if c.uplink.IsValid() {
		args = append(args, "--uplink-address", c.uplink.String())
	}
	return append(args, c.extra...)
}

// startAgent runs the daemon and waits until its HTTP server listens.
func startAgent(t testing.TB, c agentConfig) *agent {
	t.Helper()
	p := startProc(t, "agent "+c.node, agentBin, nil, nil, c.args()...)
	rec := p.waitLog("serving metrics and health", 20*time.Second)
	return &agent{proc: p, url: "http://" + rec.str("address")}
}

var httpClient = &http.Client{Timeout: 5 * time.Second}

// get fetches path from the agent's HTTP server and returns the status and body.
func (a *agent) get(path string) (int, string) {
	a.t.Helper()
	resp, err := httpClient.Get(a.url + path)
	if err != nil {
		a.t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		a.t.Fatalf("GET %s: %v", path, err)
	}
	return resp.StatusCode, string(body)
}

// waitReady waits until /readyz answers 200.
func (a *agent) waitReady(within time.Duration) {
	a.t.Helper()
	deadline := time.Now().Add(within)
	for {
		code, body := a.get("/readyz")
		if code == http.StatusOK {
			return
		}
		if a.exited() {
			a.t.Fatalf("%s exited while waiting for readiness", a.name)
		}
		if time.Now().After(deadline) {
			a.t.Fatalf("%s not ready after %s: %d %s", a.name, within, code, body)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (a *agent) metrics() metrics {
	a.t.Helper()
	code, body := a.get("/metrics")
	if code != http.StatusOK {
		a.t.Fatalf("GET /metrics: %d %s", code, body)
	}
	m, err := parseMetrics(body)
	if err != nil {
		a.t.Fatal(err)
	}
	return m
}

// debugRoutes is the part of /debug/routes the tests read.
type debugRoutes struct {
	Node    string `json:"node"`
	Desired []struct {
		Prefix  netip.Prefix `json:"prefix"`
		NextHop netip.Addr   `json:"next_hop"`
		Owner   string       `json:"owner"`
	} `json:"desired"`
	Programmed []struct {
		Prefix  netip.Prefix `json:"prefix"`
		NextHop netip.Addr   `json:"next_hop"`
	} `json:"programmed"`
	Unresolved []struct {
		Prefix netip.Prefix `json:"prefix"`
		Owner  string       `json:"owner"`
		Reason string       `json:"reason"`
	} `json:"unresolved"`
}

func (a *agent) debugRoutes() debugRoutes {
	a.t.Helper()
	code, body := a.get("/debug/routes")
	if code != http.StatusOK {
		a.t.Fatalf("GET /debug/routes: %d %s", code, body)
	}
	var d debugRoutes
	if err := json.Unmarshal([]byte(body), &d); err != nil {
		a.t.Fatalf("/debug/routes: %v\n%s", err, body)
	}
	return d
}

// --- Prometheus text format ---

// metrics is one scrape, by metric family name.
type metrics map[string]*dto.MetricFamily

func parseMetrics(text string) (metrics, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		return nil, fmt.Errorf("parse /metrics: %w", err)
	}
	return metrics(fams), nil
}

// sum adds the values of the series of name whose labels include the given pairs ("k", "v", ...);
// name may be a histogram's or a summary's name_count or name_sum. ok is false when no series matches.
func (m metrics) sum(name string, labelPairs ...string) (total float64, ok bool) {
	base, part := name, ""
	if _, found := m[name]; !found {
		for _, suffix := range []string{"_count", "_sum"} {
			if b, cut := strings.CutSuffix(name, suffix); cut {
				base, part = b, suffix
			}
		}
	}
	fam := m[base]
	if fam == nil {
		return 0, false
	}
next:
	for _, s := range fam.GetMetric() {
		labels := map[string]string{}
		for _, l := range s.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		for i := 0; i+1 < len(labelPairs); i += 2 {
			if labels[labelPairs[i]] != labelPairs[i+1] {
				continue next
			}
		}
		ok = true
		switch {
		case s.Counter != nil:
			total += s.Counter.GetValue()
		case s.Gauge != nil:
			total += s.Gauge.GetValue()
		case s.Untyped != nil:
			total += s.Untyped.GetValue()
		case s.Histogram != nil && part == "_count":
			total += float64(s.Histogram.GetSampleCount())
		case s.Histogram != nil && part == "_sum":
			total += s.Histogram.GetSampleSum()
		case s.Summary != nil && part == "_count":
			total += float64(s.Summary.GetSampleCount())
		case s.Summary != nil && part == "_sum":
			total += s.Summary.GetSampleSum()
		default:
			return 0, false
		}
	}
	return total, ok
}

// value is sum for a series that must exist.
func (m metrics) value(t testing.TB, name string, labelPairs ...string) float64 {
	t.Helper()
	v, ok := m.sum(name, labelPairs...)
	if !ok {
		t.Fatalf("metric %s%v is not exported", name, labelPairs)
	}
	return v
}

// --- etcd and VPP fixtures ---

// cluster is an embedded etcd holding Calico data for a few remote nodes, the test's own client of it,
// and helpers to put more.
type cluster struct {
	t    testing.TB
	etcd *etcdtest.Server
	cli  *clientv3.Client
}

func newCluster(t testing.TB) *cluster {
	t.Helper()
	srv, cli := etcdtest.Start(t)
	return &cluster{t: t, etcd: srv, cli: cli}
}

func (c *cluster) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	c.t.Cleanup(cancel)
	return ctx
}

func (c *cluster) putPool(name string, cidr string, blockSize int) {
	c.t.Helper()
	if err := calicotest.PutPool(c.ctx(), c.cli, calico.IPPool{Name: name, CIDR: netip.MustParsePrefix(cidr), BlockSize: blockSize}); err != nil {
		c.t.Fatal(err)
	}
}

func (c *cluster) put(k, v string) {
	c.t.Helper()
	if _, err := c.cli.Put(c.ctx(), k, v); err != nil {
		c.t.Fatal(err)
	}
}

func (c *cluster) putPeer(node string, addr netip.Addr) {
	c.t.Helper()
	if err := calicotest.PutPeer(c.ctx(), c.cli, hostsPrefix, node, addr); err != nil {
		c.t.Fatal(err)
	}
}

// putBlock writes the i-th /26 of 10.0.0.0/8 owned by node and returns its CIDR.
func (c *cluster) putBlock(i int, node string) netip.Prefix {
	c.t.Helper()
	cidr := calicotest.BlockCIDR(i)
	if err := calicotest.PutBlock(c.ctx(), c.cli, calicotest.Block(cidr, node, i)); err != nil {
		c.t.Fatal(err)
	}
	return cidr
}

// peerKey is the registration key of node's IPv4 peer IP.
func peerKey(node string) string {
	return calicotest.PeerKey(hostsPrefix, node, netip.MustParseAddr("192.0.2.1"))
}

// remotePeer is the peer IP of the i-th remote node (outside 10.0.0.0/8, where the blocks are).
func remotePeer(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{192, 168, byte(1 + i/250), byte(1 + i%250)})
}

// remoteNode names the i-th remote node.
func remoteNode(i int) string { return fmt.Sprintf("node-%03d", i) }

// startSim starts an in-process VPP simulator with the uplink interface and returns it and its socket,
// for the benchmarks. Against real VPP (VPP_TEST_BACKEND=real) they are skipped.
func startSim(t testing.TB) (*vppsim.Sim, string) {
	t.Helper()
	vpptest.RequireSim(t, "a benchmark of the simulator's FIB")
	sim, err := vppsim.New(vppsim.Config{Interfaces: []string{uplinkName}})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(shortDir(t), "api.sock")
	if err := sim.Listen(sock); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	return sim, sock
}

// shortDir returns a fresh directory with a path short enough for unix sockets.
func shortDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "e2e-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// fibIn returns the simulator's API routes of table 0 inside pool, as prefix -> next hops.
func fibIn(sim *vppsim.Sim, pool netip.Prefix) map[netip.Prefix][]vppsim.Path {
	out := map[netip.Prefix][]vppsim.Path{}
	for _, r := range sim.APIRoutes(0) {
		if pool.Bits() <= r.Prefix.Bits() && pool.Contains(r.Prefix.Addr()) {
			out[r.Prefix] = r.Paths
		}
	}
	return out
}

// closedPort returns a loopback TCP address nothing listens on.
func closedPort(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// eventually polls cond every 10ms until it returns "" (success) or within passes; it fails with the
// last message.
func eventually(t testing.TB, within time.Duration, cond func() string) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		msg := cond()
		if msg == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %s", within, msg)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
