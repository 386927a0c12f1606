package dataplane

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.fd.io/govpp/core"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/internal/calicotest"
	"github.com/vpp-route-agent/vpp-route-agent/internal/etcdtest"
	"github.com/vpp-route-agent/vpp-route-agent/internal/vppproc"
	"github.com/vpp-route-agent/vpp-route-agent/internal/vpptest"
	"github.com/vpp-route-agent/vpp-route-agent/internal/vpptopo"
)

const modulePath = "github.com/vpp-route-agent/vpp-route-agent"

var (
	pool4 = netip.MustParsePrefix("10.244.0.0/16")
	pool6 = netip.MustParsePrefix("fd00:244::/48")
)

var (
	// agentBin is the daemon's binary, built by TestMain when the tests can run.
	agentBin string
	// labBin is the lab build's VPP, or skipWhy says why the tests are skipped, or labErr why they fail
	// (VPP_LAB_PKG names no lab build: a broken set-up is not hidden as a skip).
	labBin  vppproc.Binaries
	skipWhy string
	labErr  error
)

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	switch bin, err := vpptopo.FindLab(); {
	case !vpptest.Real():
		skipWhy = "the data-plane tests need real VPP: " + vpptest.EnvBackend + "=real and " + vpptopo.EnvLabPackage + " (make test-vpp)"
	case errors.Is(err, vpptopo.ErrNoLab):
		skipWhy = err.Error()
	case err != nil:
		labErr = err
	default:
		labBin = bin
	}
	if skipWhy != "" || labErr != nil {
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "dataplane-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "dataplane:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	args := []string{"build", "-o", dir + string(os.PathSeparator)}
	if raceEnabled {
		args = append(args, "-race")
	}
	args = append(args, modulePath+"/cmd/vpp-route-agent")
	if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "dataplane: go %s: %v\n%s", strings.Join(args, " "), err, out)
		return 1
	}
	agentBin = filepath.Join(dir, "vpp-route-agent")
	core.SetLogLevel(logrus.ErrorLevel) // the test's own GoVPP clients
	return m.Run()
}

// requireLab skips the test unless it runs against real VPP with a lab build, and fails it if
// VPP_LAB_PKG names something else.
func requireLab(t testing.TB) {
	t.Helper()
	if skipWhy != "" {
		t.Skip(skipWhy)
	}
	if labErr != nil {
		t.Fatal(labErr)
	}
}

// startTopology starts a topology of n nodes for t in a short temporary directory; it stops with the
// test.
func startTopology(t *testing.T, kind vpptopo.Kind, n int) *vpptopo.Topology {
	t.Helper()
	return startTopologyWith(t, vpptopo.Config{Kind: kind, Nodes: n})
}

// startTopologyWith is startTopology with more of vpptopo.Config (Dir is set here).
func startTopologyWith(t testing.TB, cfg vpptopo.Config) *vpptopo.Topology {
	kind, n := cfg.Kind, cfg.Nodes
	t.Helper()
	dir, err := os.MkdirTemp("", "dp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	cfg.Dir = dir
	topo, err := vpptopo.Start(ctx, labBin, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(topo.Stop)
	t.Logf("%s topology of %d nodes linked in %s (run directories under %s)", kind, n, time.Since(start).Round(time.Millisecond), dir)
	return topo
}

// cluster is an embedded etcd with both pools and one IPv4 and one IPv6 block per node, each block as
// Calico writes it for a node with pods (ordinal 1 is the pod vpptopo puts on the node's loopback).
type cluster struct {
	t    testing.TB
	etcd *etcdtest.Server
	cli  *clientv3.Client
}

func newCluster(t testing.TB, topo *vpptopo.Topology) *cluster {
	t.Helper()
	srv, cli := etcdtest.Start(t)
	c := &cluster{t: t, etcd: srv, cli: cli}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, p := range []calico.IPPool{{Name: "default-ipv4-ippool", CIDR: pool4, BlockSize: 26},
		{Name: "default-ipv6-ippool", CIDR: pool6, BlockSize: 122}} {
		if err := calicotest.PutPool(ctx, cli, p); err != nil {
			t.Fatal(err)
		}
	}
	for i, n := range topo.Nodes {
		for j, b := range []netip.Prefix{n.Block4, n.Block6} {
			if err := calicotest.PutBlock(ctx, cli, calicotest.Block(b, n.Name, 2*i+j)); err != nil {
				t.Fatal(err)
			}
		}
	}
	return c
}

// deleteBlocks deletes node's blocks from etcd, as releasing them does.
func (c *cluster) deleteBlocks(n *vpptopo.Node) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, b := range []netip.Prefix{n.Block4, n.Block6} {
		if _, err := c.cli.Delete(ctx, calico.BlockKey(b)); err != nil {
			c.t.Fatal(err)
		}
	}
}

// startAgent runs a vpp-route-agent for node n: its uplink is the node's memif, with the node's
// addresses, which it also registers as its peer IPs. Its log goes to a file (appended to by a restarted
// agent), shown if the test fails. It returns a function that stops the agent (SIGTERM), as the test's
// end does.
func startAgent(t *testing.T, etcd string, n *vpptopo.Node) (stop func()) {
	t.Helper()
	return startAgentOn(t, etcd, n.Name, n.VPP, vpptopo.UplinkInterface, n.Addr4, n.Addr6)
}

// startAgentOn is startAgent for node name on VPP vpp, its uplink interface uplink with addresses addrs.
func startAgentOn(t *testing.T, etcd, name string, vpp *vppproc.VPP, uplink string, addrs ...netip.Prefix) (stop func()) {
	t.Helper()
	args := []string{"--uplink-interface", uplink}
	for _, a := range addrs {
		args = append(args, "--uplink-address", a.String())
	}
	return startAgentArgs(t, etcd, name, vpp, args...)
}

// startAgentArgs is startAgentOn with the uplink flags, and any others (a later flag overrides an
// earlier one), given as args.
func startAgentArgs(t testing.TB, etcd, name string, vpp *vppproc.VPP, args ...string) (stop func()) {
	t.Helper()
	n := struct {
		Name string
		VPP  *vppproc.VPP
	}{name, vpp}
	logPath := filepath.Join(n.VPP.Dir(), "agent.log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(agentBin,
		"--nodename", n.Name,
		"--etcd-endpoints", etcd,
		"--etcd-dial-timeout", "2s",
		"--vpp-api-socket", n.VPP.Socket(),
		"--metrics-address", "",
		"--log-format", "json",
		"--log-level", "debug", // the tests wait for "full resync done"
		"--registration-ttl", "10s")
	cmd.Args = append(cmd.Args, args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.TempDir()} // no ETCD_ENDPOINTS, NODENAME leak in
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				_ = cmd.Process.Kill()
				<-done
			}
		})
	}
	t.Cleanup(func() {
		stop()
		logFile.Close()
		out, _ := os.ReadFile(logPath)
		if raceEnabled && strings.Contains(string(out), "WARNING: DATA RACE") {
			t.Errorf("agent %s: the race detector found a data race:\n%s", n.Name, out)
		} else if t.Failed() {
			t.Logf("agent %s log:\n%s", n.Name, out)
		}
	})
	return stop
}

// wantRoutes are the routes the agent on node n must program: every other node's blocks via that node's
// uplink addresses (attached next hops on the uplink).
func wantRoutes(topo *vpptopo.Topology, n *vpptopo.Node) map[netip.Prefix]netip.Addr {
	want := map[netip.Prefix]netip.Addr{}
	for _, m := range topo.Nodes {
		if m != n {
			want[m.Block4], want[m.Block6] = m.Addr4.Addr(), m.Addr6.Addr()
		}
	}
	return want
}

// apiRoutes returns node n's API routes inside the pools, prefix -> next hop of the first path.
func apiRoutes(t *testing.T, n *vpptopo.Node) map[netip.Prefix]netip.Addr {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	routes, err := n.VPP.Routes(ctx, vppproc.SourceAPI)
	if err != nil {
		t.Fatalf("%s: %v", n.Name, err)
	}
	out := map[netip.Prefix]netip.Addr{}
	for _, r := range routes {
		inPool := pool4.Contains(r.Prefix.Addr()) || pool6.Contains(r.Prefix.Addr())
		if inPool && len(r.Paths) > 0 {
			out[r.Prefix] = r.Paths[0].NextHop
		}
	}
	return out
}

// waitRoutes waits until every node's API routes in the pools are exactly want(node).
func waitRoutes(t *testing.T, topo *vpptopo.Topology, want func(*vpptopo.Node) map[netip.Prefix]netip.Addr) {
	t.Helper()
	start := time.Now()
	for _, n := range topo.Nodes {
		w := want(n)
		deadline := time.Now().Add(60 * time.Second)
		for {
			got := apiRoutes(t, n)
			if maps.Equal(got, w) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s's routes after 60s:\n got %v\nwant %v", n.Name, got, w)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	t.Logf("every node's FIB as wanted %s after the wait began", time.Since(start).Round(time.Millisecond))
}

// Ping judgement: a round is 3 echoes, 0.1 s apart; a pair answers when a round gets at least 2 replies
// within 5 rounds. The first echoes of a new path are lost while ARP or ND resolves each hop (VPP drops
// the packet that triggers the resolution, and the reply's too): IPv6 through a router measured 0/3
// twice before 3/3. A pair that does not answer gets the same 5 rounds and must see no reply at all.
const (
	pingCount   = 3
	pingAtLeast = 2
	pingRounds  = 5
)

// pingPods pings from's pod to to's pod (the family's addresses; the source is the pod's interface).
func pingPods(t *testing.T, from, to *vpptopo.Node, ipv6 bool) ([]vpptopo.PingResult, bool) {
	t.Helper()
	return ping(t, from, to.Pod(ipv6), vpptopo.PodInterface)
}

// ping pings dst from node from's VPP, sourced from interface source.
func ping(t testing.TB, from *vpptopo.Node, dst netip.Addr, source string) ([]vpptopo.PingResult, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	results, ok, err := vpptopo.PingUntil(ctx, from.VPP, source, dst, pingCount, pingAtLeast, pingRounds)
	if err != nil {
		t.Fatalf("%s: %v", from.Name, err)
	}
	return results, ok
}

func received(results []vpptopo.PingResult) int {
	n := 0
	for _, r := range results {
		n += r.Received
	}
	return n
}

func family(ipv6 bool) string {
	if ipv6 {
		return "IPv6"
	}
	return "IPv4"
}
