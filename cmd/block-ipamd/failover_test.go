package main

import (
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/cni/release"
	"github.com/vpp-route-agent/vpp-route-agent/internal/calicotest"
	"github.com/vpp-route-agent/vpp-route-agent/internal/etcdtest"
)

// daemonProc is a block-ipamd process.
type daemonProc struct {
	node, metrics string
	cmd           *exec.Cmd
	log           *os.File
}

// scrape returns the daemon's /metrics, "" when it does not answer.
func (d *daemonProc) scrape() string {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + d.metrics + "/metrics")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

var poolSeries = regexp.MustCompile(`(?m)^block_ipam_pool_addresses\{family="ipv4",pool="p"\} 65536$`)

// exporting reports whether the daemon exports the cluster's gauges.
func (d *daemonProc) exporting() bool {
	m := d.scrape()
	return poolSeries.MatchString(m) && strings.Contains(m, fmt.Sprintf("block_ipam_capacity_exporter{node=%q} 1", d.node))
}

// TestKilledExporterReplaced: of two block-ipamd processes exactly one exports the cluster's
// capacity gauges; after `kill -9` of that one, the other exports them within --liveness-ttl plus
// 5 s.
func TestKilledExporterReplaced(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs block-ipamd")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "block-ipamd")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	srv, cli := etcdtest.Start(t)
	if err := calicotest.PutPool(t.Context(), cli, calico.IPPool{Name: "p", CIDR: netip.MustParsePrefix("10.244.0.0/16"), BlockSize: 26}); err != nil {
		t.Fatal(err)
	}
	const ttl = 5 * time.Second
	start := func(node string) *daemonProc {
		port, err := etcdtest.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		d := &daemonProc{node: node, metrics: fmt.Sprintf("127.0.0.1:%d", port)}
		if d.log, err = os.Create(filepath.Join(dir, node+".log")); err != nil {
			t.Fatal(err)
		}
		d.cmd = exec.Command(bin, "--nodename", node, "--socket", filepath.Join(dir, node+".sock"), "--metrics-address", d.metrics,
			"--etcd-endpoints", srv.Endpoint(), "--liveness-ttl", ttl.String(), "--capacity-interval", "1s")
		d.cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
		d.cmd.Stderr = d.log
		if err := d.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			d.cmd.Process.Kill()
			d.cmd.Wait()
			d.log.Close()
			if t.Failed() {
				b, _ := os.ReadFile(d.log.Name())
				t.Logf("%s's log:\n%s", node, b)
			}
		})
		return d
	}
	waitUntil := func(what string, limit time.Duration, cond func() bool) time.Duration {
		t.Helper()
		begin := time.Now()
		for !cond() {
			if time.Since(begin) > limit {
				t.Fatalf("%s: not within %s", what, limit)
			}
			time.Sleep(100 * time.Millisecond)
		}
		return time.Since(begin)
	}
	first := start("first")
	waitUntil("the first daemon exports", 60*time.Second, first.exporting)
	second := start("second")
	waitUntil("the second daemon serves its own gauges", 60*time.Second, func() bool {
		return strings.Contains(second.scrape(), `block_ipam_node_block_limit{node="second"} 20`)
	})
	if second.exporting() || strings.Contains(second.scrape(), "block_ipam_pool_addresses") {
		t.Fatal("both daemons export the cluster's gauges")
	}
	if err := first.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	took := waitUntil("the second daemon takes over", ttl+5*time.Second, second.exporting)
	t.Logf("the second daemon exported the cluster's gauges %s after kill -9 of the first (--liveness-ttl %s)", took.Round(10*time.Millisecond), ttl)
}

// TestReleaseDeadNodeProcess: two block-ipamd processes with --release-dead-nodes-after; the second
// node holds blocks and is killed (-9): once its liveness lease has expired and it has been dead
// longer than the setting, the elected first daemon releases its blocks, counts the release and
// records it in etcd.
func TestReleaseDeadNodeProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs block-ipamd")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "block-ipamd")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	srv, cli := etcdtest.Start(t)
	if err := calicotest.PutPool(t.Context(), cli, calico.IPPool{Name: "p", CIDR: netip.MustParsePrefix("10.0.0.0/16"), BlockSize: 26}); err != nil {
		t.Fatal(err)
	}
	putNodeBlocks(t, cli, "victim", 0, 3)
	start := func(node string) *daemonProc {
		port, err := etcdtest.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		d := &daemonProc{node: node, metrics: fmt.Sprintf("127.0.0.1:%d", port)}
		if d.log, err = os.Create(filepath.Join(dir, node+".log")); err != nil {
			t.Fatal(err)
		}
		d.cmd = exec.Command(bin, "--nodename", node, "--socket", filepath.Join(dir, node+".sock"), "--metrics-address", d.metrics,
			"--etcd-endpoints", srv.Endpoint(), "--liveness-ttl", "2s", "--release-dead-nodes-after", "4s", "--capacity-interval", "1s")
		d.cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
		d.cmd.Stderr = d.log
		if err := d.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			d.cmd.Process.Kill()
			d.cmd.Wait()
			d.log.Close()
			if t.Failed() {
				b, _ := os.ReadFile(d.log.Name())
				t.Logf("%s's log:\n%s", node, b)
			}
		})
		return d
	}
	waitUntil := func(what string, cond func() bool) {
		t.Helper()
		for end := time.Now().Add(60 * time.Second); !cond(); time.Sleep(100 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("%s: not within 60s", what)
			}
		}
	}
	leader := start("leader")
	waitUntil("the first daemon is elected", leader.exporting)
	victim := start("victim")
	waitUntil("the elected daemon tracks the second", func() bool { return count(t, cli, release.TrackPrefix+"victim") == 1 })
	if err := victim.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitUntil("the dead node's blocks released", func() bool { return count(t, cli, calico.BlockPrefix) == 0 })
	waitUntil("the release counted", func() bool {
		return strings.Contains(leader.scrape(), `block_ipam_node_releases_total{result="released"} 1`)
	})
	if count(t, cli, release.RecordPrefix+"victim/") != 1 || count(t, cli, calico.HostAffinityNodePrefix("victim")) != 0 ||
		count(t, cli, calico.HandlePrefix) != 0 {
		t.Fatal("no record, or affinities or handles left")
	}
	b, _ := os.ReadFile(leader.log.Name())
	if !strings.Contains(string(b), "released dead node's addresses") {
		t.Fatalf("release not logged:\n%s", b)
	}
}
