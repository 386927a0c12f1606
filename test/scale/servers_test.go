package scale

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/proxy/grpcproxy"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vpp-route-agent/vpp-route-agent/internal/etcdtest"
)

// The test binary re-executes itself in these roles (roleEnv) to run etcd and the proxy in processes
// of their own: the CPU they use is then theirs, not the watchers'.
const (
	roleEnv      = "VPP_ROUTE_AGENT_SCALE_ROLE"
	proxyEnv     = "VPP_ROUTE_AGENT_SCALE_PROXY_TARGET" // the proxy role's etcd endpoint
	proxyAddrEnv = "VPP_ROUTE_AGENT_SCALE_PROXY_ADDR"   // the proxy role's listen address
)

func TestMain(m *testing.M) {
	switch role := os.Getenv(roleEnv); role {
	case "":
		os.Exit(m.Run())
	case "etcd":
		os.Exit(runEtcdRole(os.Stdin, os.Stdout))
	case "proxy":
		os.Exit(runProxyRole(os.Getenv(proxyEnv), os.Getenv(proxyAddrEnv), os.Stdin, os.Stdout))
	default:
		fmt.Fprintf(os.Stderr, "%s=%q: unknown role\n", roleEnv, role)
		os.Exit(2)
	}
}

// --- the etcd role ---

// runEtcdRole runs an embedded etcd and a counting relay (an etcdtest.Proxy) in front of it, prints
// "ready direct=<etcd URL> relay=<relay address>", then answers each line on in until in is closed:
// "stats" with "stats down=<bytes> up=<bytes> conns=<accepted> grpc_sent=<etcd_network_client_grpc_sent_bytes_total>",
// "pause" and "resume" (the relay's) with "ok".
func runEtcdRole(in io.Reader, out io.Writer) int {
	srv, err := etcdtest.New(etcdtest.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "etcd role:", err)
		return 1
	}
	defer srv.Close()
	r, err := etcdtest.NewProxy(strings.TrimPrefix(srv.Endpoint(), "http://"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "etcd role:", err)
		return 1
	}
	defer r.Close()
	fmt.Fprintf(out, "ready direct=%s relay=%s\n", srv.Endpoint(), r.Addr())
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		switch sc.Text() {
		case "stats":
			fmt.Fprintf(out, "stats down=%d up=%d conns=%d grpc_sent=%.0f\n",
				r.Down.Load(), r.Up.Load(), r.Accepted.Load(), gatheredValue("etcd_network_client_grpc_sent_bytes_total"))
		case "pause":
			r.Block()
			fmt.Fprintln(out, "ok")
		case "resume":
			r.Unblock()
			fmt.Fprintln(out, "ok")
		default:
			fmt.Fprintf(out, "error unknown command %q\n", sc.Text())
		}
	}
	return 0
}

// gatheredValue is the value of a counter of this process's default Prometheus registry (-1 if absent).
func gatheredValue(name string) float64 {
	fams, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		return -1
	}
	for _, f := range fams {
		if f.GetName() == name && len(f.GetMetric()) == 1 {
			return f.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return -1
}

// --- the in-process gRPC proxy (etcd v3.6's server/proxy/grpcproxy, as `etcd grpc-proxy start` wires it) ---

// grpcProxy serves etcd's gRPC proxy on ln for the etcd at endpoint until Stop.
type grpcProxy struct {
	cli    *clientv3.Client
	srv    *grpc.Server
	cancel context.CancelFunc
	done   chan struct{}
}

func startGRPCProxy(endpoint string, ln net.Listener) (*grpcProxy, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(cli.Ctx())
	lg := zap.NewNop()
	kvp, _ := grpcproxy.NewKvProxy(cli)
	watchp, _ := grpcproxy.NewWatchProxy(ctx, lg, cli)
	clusterp, _ := grpcproxy.NewClusterProxy(lg, cli, ln.Addr().String(), "")
	leasep, _ := grpcproxy.NewLeaseProxy(ctx, cli)
	srv := grpc.NewServer()
	pb.RegisterKVServer(srv, kvp)
	pb.RegisterWatchServer(srv, watchp)
	pb.RegisterClusterServer(srv, clusterp)
	pb.RegisterLeaseServer(srv, leasep)
	pb.RegisterMaintenanceServer(srv, grpcproxy.NewMaintenanceProxy(cli))
	pb.RegisterAuthServer(srv, grpcproxy.NewAuthProxy(cli))
	p := &grpcProxy{cli: cli, srv: srv, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		_ = srv.Serve(ln)
	}()
	return p, nil
}

// Stop drops every client connection, as a proxy process that exits does (the clients see the
// connection go, not their watches cancelled), then the proxy's own connection to etcd.
func (p *grpcProxy) Stop() {
	p.srv.Stop()
	p.cancel()
	<-p.done
	p.cli.Close()
}

// runProxyRole serves the gRPC proxy for target on addr (127.0.0.1:0 if empty), prints
// "ready addr=<address>", and stops when in is closed.
func runProxyRole(target, addr string, in io.Reader, out io.Writer) int {
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "proxy role:", err)
		return 1
	}
	p, err := startGRPCProxy(target, ln)
	if err != nil {
		fmt.Fprintln(os.Stderr, "proxy role:", err)
		return 1
	}
	defer p.Stop()
	fmt.Fprintf(out, "ready addr=%s\n", ln.Addr())
	_, _ = io.Copy(io.Discard, in)
	return 0
}

// --- child processes ---

// child is a process the benchmark started: etcd, a proxy or an agent.
type child struct {
	tb    testing.TB
	name  string
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string // stdout
	done  chan struct{}
	// stdinStops: the process exits when its stdin is closed (the roles of this test binary).
	stdinStops bool
	mu         sync.Mutex // guards stderr
	errb       strings.Builder
}

// startChild runs bin with args and env added to a minimal environment, and returns once it runs.
// The process is stopped (stdin closed, then SIGTERM, then SIGKILL) when the test ends.
func startChild(tb testing.TB, name, bin string, env []string, args ...string) *child {
	tb.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.TempDir()}, env...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		tb.Fatal(err)
	}
	c := &child{tb: tb, name: name, cmd: cmd, stdin: stdin, lines: make(chan string, 64), done: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start %s: %v", name, err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(c.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
	})
	wg.Go(func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			c.mu.Lock()
			if c.errb.Len() < 1<<20 {
				c.errb.WriteString(sc.Text() + "\n")
			}
			c.mu.Unlock()
		}
	})
	go func() {
		wg.Wait()
		_ = cmd.Wait()
		close(c.done)
	}()
	tb.Cleanup(c.stop)
	return c
}

// startRole re-executes the test binary in role.
func startRole(tb testing.TB, role string, env ...string) *child {
	tb.Helper()
	self, err := os.Executable()
	if err != nil {
		tb.Fatal(err)
	}
	c := startChild(tb, role, self, append(env, roleEnv+"="+role), "-test.run=^$")
	c.stdinStops = true
	return c
}

// line returns the next stdout line, failing after within.
func (c *child) line(within time.Duration) string {
	c.tb.Helper()
	select {
	case l, ok := <-c.lines:
		if !ok {
			c.tb.Fatalf("%s: stdout closed; stderr:\n%s", c.name, c.stderr())
		}
		return l
	case <-time.After(within):
		c.tb.Fatalf("%s: no output within %s; stderr:\n%s", c.name, within, c.stderr())
	}
	return ""
}

// fields parses a "word k=v k=v" line into its values, checking the word.
func (c *child) fields(word string, within time.Duration) map[string]string {
	c.tb.Helper()
	l := c.line(within)
	f := strings.Fields(l)
	if len(f) == 0 || f[0] != word {
		c.tb.Fatalf("%s: got %q, want a %q line", c.name, l, word)
	}
	out := map[string]string{}
	for _, kv := range f[1:] {
		k, v, _ := strings.Cut(kv, "=")
		out[k] = v
	}
	return out
}

func (c *child) stderr() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.errb.String()
}

func (c *child) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// stop closes stdin (the roles exit on that), then signals; it waits at most a few seconds.
func (c *child) stop() {
	c.stdin.Close()
	if c.stdinStops {
		select {
		case <-c.done:
			return
		case <-time.After(3 * time.Second):
		}
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
		return
	case <-time.After(5 * time.Second):
	}
	_ = c.cmd.Process.Kill()
	<-c.done
}

// cpu is the CPU time (user + system) the process has used so far, from /proc (10ms resolution).
func (c *child) cpu() time.Duration {
	c.tb.Helper()
	d, err := procCPU(c.cmd.Process.Pid)
	if err != nil {
		c.tb.Fatalf("%s: %v", c.name, err)
	}
	return d
}

// procCPU reads utime + stime of pid from /proc/<pid>/stat.
func procCPU(pid int) (time.Duration, error) {
	raw, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, err
	}
	// The command name may hold spaces: fields start after its closing parenthesis.
	s := string(raw)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	// f[0] is field 3 (state); utime and stime are fields 14 and 15, in clock ticks (100 a second on Linux).
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: bad utime/stime", pid)
	}
	return time.Duration(ut+st) * 10 * time.Millisecond, nil
}

// selfCPU is the CPU time (user + system) of this process, from getrusage.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// etcdProc is etcd in its own process behind a counting relay.
type etcdProc struct {
	*child
	direct string // etcd's client URL, for the writer (its traffic is not counted)
	relay  string // the counted endpoint, host:port
}

func startEtcd(tb testing.TB) *etcdProc {
	tb.Helper()
	c := startRole(tb, "etcd")
	f := c.fields("ready", time.Minute)
	return &etcdProc{child: c, direct: f["direct"], relay: f["relay"]}
}

// command sends a command to the etcd role and waits for its "ok".
func (e *etcdProc) command(cmd string) {
	e.tb.Helper()
	if _, err := io.WriteString(e.stdin, cmd+"\n"); err != nil {
		e.tb.Fatal(err)
	}
	if l := e.line(10 * time.Second); l != "ok" {
		e.tb.Fatalf("etcd role: %s: %q", cmd, l)
	}
}

// egress is etcd's traffic through the relay so far.
type egress struct {
	down, up, conns int64
	grpcSent        float64
}

func (e *etcdProc) stats() egress {
	e.tb.Helper()
	if _, err := io.WriteString(e.stdin, "stats\n"); err != nil {
		e.tb.Fatal(err)
	}
	f := e.fields("stats", 10*time.Second)
	n := func(k string) int64 { v, _ := strconv.ParseInt(f[k], 10, 64); return v }
	g, _ := strconv.ParseFloat(f["grpc_sent"], 64)
	return egress{down: n("down"), up: n("up"), conns: n("conns"), grpcSent: g}
}

// proxyProc is an etcd gRPC proxy process.
type proxyProc struct {
	*child
	addr string
}

// debianEtcd is where Debian's etcd-server package installs etcd (make bench-scale installs it).
const debianEtcd = "/usr/bin/etcd"

// startProxy runs a gRPC proxy for target on addr ("" for any free port): Debian's `etcd grpc-proxy
// start` when kind is "debian", else etcd v3.6's grpcproxy in a re-executed test binary.
func startProxy(tb testing.TB, kind, target, addr string) *proxyProc {
	tb.Helper()
	if kind != "debian" {
		c := startRole(tb, "proxy", proxyEnv+"=http://"+target, proxyAddrEnv+"="+addr)
		f := c.fields("ready", 30*time.Second)
		return &proxyProc{child: c, addr: f["addr"]}
	}
	if addr == "" {
		port, err := etcdtest.FreePort()
		if err != nil {
			tb.Fatal(err)
		}
		addr = fmt.Sprintf("127.0.0.1:%d", port)
	}
	dir := tb.TempDir()
	c := startChild(tb, "etcd grpc-proxy", debianEtcd, nil, "grpc-proxy", "start",
		"--endpoints", target, "--listen-addr", addr, "--advertise-client-url", addr,
		"--data-dir", filepath.Join(dir, "proxy"))
	deadline := time.Now().Add(30 * time.Second)
	for {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			conn.Close()
			return &proxyProc{child: c, addr: addr}
		}
		if c.exited() || time.Now().After(deadline) {
			tb.Fatalf("etcd grpc-proxy does not listen on %s: %v\n%s", addr, err, c.stderr())
		}
		time.Sleep(20 * time.Millisecond)
	}
}
