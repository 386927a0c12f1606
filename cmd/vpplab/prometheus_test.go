package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/internal/vppproc"
	"github.com/vpp-route-agent/vpp-route-agent/internal/vpptest"
)

// syncBuffer is a bytes.Buffer the lab writes to while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestLabPrometheusExhaustedPool runs the lab as a user would to watch it (--keep-running, its
// Prometheus on), a small IPv4 pool (64 addresses) filled with more pods than it holds, every alert's
// `for` 0s. From Prometheus's own HTTP API: every daemon of the lab is scraped and up, the pool's
// alerts fire for the IPv4 pool and not for the IPv6 one, a node that cannot claim and the refused
// claims fire too. Stopping the lab stops Prometheus, whose data stays in the lab's data directory.
func TestLabPrometheusExhaustedPool(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries and runs the lab")
	}
	if _, err := exec.LookPath("prometheus"); err != nil {
		t.Skip("prometheus is not installed (Debian's package: make promtool, or apt-get install --no-install-recommends prometheus)")
	}
	bin := buildBinaries(t)
	dataDir := shortDir(t)
	addr, err := freeAddr()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	nodes := 2
	args := []string{"--pods", "1", "--bin-dir", bin, "--data-dir", dataDir, "--ipv4-pool", "10.244.0.0/26", "--exhaust-pool",
		"--prometheus", "--prometheus-address", addr, "--alert-for", "0s", "--keep-running"}
	if vpptest.Real() { // make test-vpp: every node on a real VPP, three as in TestLabScenarioPasses
		pkg := os.Getenv(vppproc.EnvPackage)
		if pkg == "" {
			t.Fatal("the lab runs a real VPP from VPP_PKG (an unpacked package directory)")
		}
		args, nodes = append(args, "--vpp", pkg), 3
	}
	args = append(args, "--nodes", strconv.Itoa(nodes))
	var out syncBuffer
	errc := make(chan error, 1)
	go func() { errc <- run(ctx, args, &out, &out) }()
	p := &promServer{addr: addr}

	// Every agent and block-ipamd is a target, and up.
	type target struct {
		Labels map[string]string `json:"labels"`
		Health string            `json:"health"`
	}
	var targets []target
	waitFor(t, errc, &out, "every daemon scraped and up", func() bool {
		var body struct {
			Data struct {
				ActiveTargets []target `json:"activeTargets"`
			} `json:"data"`
		}
		if p.get(ctx, "/api/v1/targets", &body) != nil {
			return false
		}
		targets = body.Data.ActiveTargets
		up := map[string]bool{}
		for _, tg := range targets {
			if tg.Health == "up" {
				up[tg.Labels["job"]+" "+tg.Labels["lab_node"]] = true
			}
		}
		for i := 1; i <= nodes; i++ {
			if !up[fmt.Sprintf("vpp-route-agent node-%d", i)] || !up[fmt.Sprintf("block-ipamd node-%d", i)] {
				return false
			}
		}
		return len(targets) == 2*nodes
	})

	// The exhausted pool's alerts, as Prometheus's API reports them.
	want := []string{
		"BlockIPAMPoolUsageCritical{family=ipv4,pool=lab-ipv4}",
		"BlockIPAMPoolUsageHigh{family=ipv4,pool=lab-ipv4}",
		"BlockIPAMNodeCannotClaim{family=ipv4,node=node-1}",
	}
	var firing map[string]promAlert
	waitFor(t, errc, &out, "the exhausted pool's alerts firing", func() bool {
		alerts, err := p.alerts(ctx)
		if err != nil {
			return false
		}
		firing = map[string]promAlert{}
		for _, a := range alerts {
			if a.State == "firing" {
				firing[a.name()] = a
			}
		}
		for _, w := range want {
			if _, ok := firing[w]; !ok {
				return false
			}
		}
		for _, a := range firing {
			if a.Labels["alertname"] == "BlockIPAMClaimsRefused" && a.Labels["reason"] == "pool_exhausted" {
				return true
			}
		}
		return false
	})
	if s := firing[want[0]].Annotations["summary"]; s != "IP pool lab-ipv4 is 100% allocated" {
		t.Errorf("BlockIPAMPoolUsageCritical's summary %q, want the pool 100%% allocated", s)
	}
	for name, a := range firing {
		if a.Labels["pool"] == "lab-ipv6" || a.Labels["family"] == "ipv6" {
			t.Errorf("%s fires: the IPv6 pool is almost empty", name)
		}
	}
	// The alerts page the lab prints shows the alert (Debian's UI is under /classic/).
	m := regexp.MustCompile(`Prometheus web UI: (http://\S+/alerts) `).FindStringSubmatch(out.String())
	if m == nil || !strings.HasPrefix(m[1], "http://"+addr+"/") {
		t.Fatalf("the lab prints no web UI address of its Prometheus on %s:\n%s", addr, out.String())
	}
	resp, err := http.Get(m[1])
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !bytes.Contains(page, []byte("BlockIPAMPoolUsageCritical")) {
		t.Errorf("%s: %s, the page does not show BlockIPAMPoolUsageCritical", m[1], resp.Status)
	}

	waitFor(t, errc, &out, "the lab keeping running after its steps", func() bool {
		return strings.Contains(out.String(), "== The lab keeps running")
	})
	cancel()
	if err := <-errc; err != nil {
		t.Fatalf("lab: %v\n%s", err, out.String())
	}
	text := out.String()
	t.Log(text)
	for _, w := range []string{
		"PASS  exhaust lab-ipv4 (10.244.0.0/26): pods on node-1 until refused",
		"more pods, one more refused: ADD ",
		"PASS  Prometheus: BlockIPAMPoolUsageCritical active for lab-ipv4",
		"firing   BlockIPAMPoolUsageCritical{family=ipv4,pool=lab-ipv4}",
		"9 passed, 0 failed",
		fmt.Sprintf("scraping %d daemons every 1s", 2*nodes),
		"prometheus: " + m[1],
	} {
		if !strings.Contains(text, w) {
			t.Errorf("lab output lacks %q", w)
		}
	}
	// Prometheus stopped with the lab; its TSDB and configuration are in the lab's data directory.
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Errorf("Prometheus still listens on %s after the lab stopped", addr)
	}
	for _, f := range []string{"prometheus.yml", "rules.yml", "prometheus.log", "data/wal"} {
		if _, err := os.Stat(filepath.Join(dataDir, "prometheus", f)); err != nil {
			t.Errorf("the lab's Prometheus left no %s: %v", f, err)
		}
	}
}

// waitFor polls cond until it holds, failing the test after 90 s or if the lab ends first.
func waitFor(t *testing.T, labDone chan error, out *syncBuffer, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(90 * time.Second); !cond(); time.Sleep(250 * time.Millisecond) {
		select {
		case err := <-labDone:
			t.Fatalf("%s: the lab ended first (%v)\n%s", what, err, out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 90 s\n%s", what, out.String())
		}
	}
}

// TestPrometheusFiles: the configuration the lab writes names every daemon under the job names the
// rules expect, and promtool accepts it with the rules it loads; --alert-for rewrites every alert's
// `for` and nothing else, and without it the rules are the shipped ones byte for byte.
func TestPrometheusFiles(t *testing.T) {
	shipped, err := os.ReadFile("../../deploy/monitoring/rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(labRules(-1), shipped) {
		t.Error("without --alert-for the lab's rules differ from deploy/monitoring/rules.yml")
	}
	fast := string(labRules(0))
	nFor := strings.Count(string(shipped), "\n        for: ")
	if nFor < 5 || strings.Count(fast, "\n        for: 0s\n") != nFor {
		t.Errorf("--alert-for 0s: %d of the %d `for`s are 0s", strings.Count(fast, "\n        for: 0s\n"), nFor)
	}
	if strings.Count(fast, "\n") != strings.Count(string(shipped), "\n") || strings.Count(fast, "alert: ") != strings.Count(string(shipped), "alert: ") {
		t.Error("--alert-for changed more than the `for` lines")
	}
	conf := promConfig([]promTarget{
		{job: "vpp-route-agent", node: "node-1", addr: "127.0.0.1:1001"},
		{job: "block-ipamd", node: "node-1", addr: "127.0.0.1:1002"},
		{job: "vpp-route-agent", node: "node-2", addr: "127.0.0.1:1003"},
		{job: "block-ipamd", node: "node-2", addr: "127.0.0.1:1004"},
	})
	for _, want := range []string{
		"  - job_name: vpp-route-agent\n    static_configs:\n      - targets: ['127.0.0.1:1001']\n        labels: {lab_node: 'node-1'}\n      - targets: ['127.0.0.1:1003']\n",
		"  - job_name: block-ipamd\n    static_configs:\n      - targets: ['127.0.0.1:1002']\n        labels: {lab_node: 'node-1'}\n      - targets: ['127.0.0.1:1004']\n",
		"scrape_interval: 1s", "evaluation_interval: 1s", "rule_files:\n  - rules.yml\n",
	} {
		if !strings.Contains(conf, want) {
			t.Errorf("prometheus.yml lacks %q:\n%s", want, conf)
		}
	}
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool is not installed (Debian's prometheus package: make promtool)")
	}
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(conf), 0o644)
	os.WriteFile(filepath.Join(dir, "rules.yml"), labRules(0), 0o644)
	if out, err := exec.Command(promtool, "check", "config", filepath.Join(dir, "prometheus.yml")).CombinedOutput(); err != nil {
		t.Fatalf("promtool check config: %v\n%s", err, out)
	}
}

// TestLabFlagsRefused: bad pool, Prometheus and alert flags are refused before anything starts, each
// naming the flag.
func TestLabFlagsRefused(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--ipv4-pool", "10.244.0.0"}, "--ipv4-pool"},
		{[]string{"--ipv4-pool", "fd00::/64"}, "not an IPv4 network"},
		{[]string{"--ipv4-pool", "10.244.0.1/26"}, "not an IPv4 network"},
		{[]string{"--ipv4-pool", "10.244.0.0/29"}, "of /28 blocks"},
		{[]string{"--exhaust-pool"}, "--exhaust-pool: the pool 10.244.0.0/16 holds 65536 addresses"},
		{[]string{"--prometheus=maybe"}, `--prometheus: "maybe" is not yes, no or auto`},
		{[]string{"--alert-for", "1.5s"}, "--alert-for"},
		{[]string{"--alert-for", "-1s"}, "--alert-for"},
	} {
		var out bytes.Buffer
		err := run(t.Context(), append(tc.args, "--bin-dir", t.TempDir()), &out, &out)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want one containing %q", tc.args, err, tc.want)
		}
	}
}

// TestPrometheusModes: auto runs Prometheus only with --keep-running and when it is installed, yes
// insists on it, no never runs it.
func TestPrometheusModes(t *testing.T) {
	installed := func() bool { _, err := exec.LookPath("prometheus"); return err == nil }()
	for _, tc := range []struct {
		mode string
		keep bool
		run  bool
	}{
		{"auto", false, false}, {"auto", true, installed}, {"no", true, false}, {"yes", false, installed},
	} {
		o := options{keepRunning: tc.keep}
		err := o.parsePrometheus(tc.mode, "")
		if tc.mode == "yes" && !installed {
			if err == nil || !strings.Contains(err.Error(), "make promtool") {
				t.Errorf("yes without prometheus: error %v, want one saying how to install it", err)
			}
			continue
		}
		if err != nil || (o.promBin != "") != tc.run || o.alertFor >= 0 {
			t.Errorf("%s, keep-running %v: binary %q, alert-for %s, error %v; want running %v, shipped `for`s",
				tc.mode, tc.keep, o.promBin, o.alertFor, err, tc.run)
		}
	}
}
