package monitoring

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/cni/ipamd"
	"github.com/vpp-route-agent/vpp-route-agent/internal/etcdtest"
)

// firing returns the names and pool labels of the alerts Prometheus at addr has firing.
func firing(t *testing.T, addr string) map[string]string {
	t.Helper()
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + addr + "/api/v1/alerts")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	var body struct {
		Data struct {
			Alerts []struct {
				Labels map[string]string
				State  string
			}
		}
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatalf("/api/v1/alerts: %v", err)
	}
	out := map[string]string{}
	for _, a := range body.Data.Alerts {
		if a.State == "firing" {
			out[a.Labels["alertname"]] = a.Labels["pool"]
		}
	}
	return out
}

// TestPrometheusFiresOnExhaustedPool: a real Prometheus (Debian's package) scrapes a block-ipamd's
// capacity gauges with the shipped rules (their `for` shortened to 0s): quiet while the pool is
// empty, BlockIPAMPoolUsageHigh and Critical fire, read back from Prometheus's API, once every
// address of the pool is allocated.
func TestPrometheusFiresOnExhaustedPool(t *testing.T) {
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Skip("prometheus is not installed (Debian: apt-get install --no-install-recommends prometheus; make promtool)")
	}
	_, cli := etcdtest.Start(t)
	pool := calico.IPPool{Name: "tiny", CIDR: netip.MustParsePrefix("10.77.0.0/28"), BlockSize: 28}
	v, _ := calico.EncodeIPPool(pool)
	if _, err := cli.Put(t.Context(), calico.IPPoolKey(pool.Name), string(v)); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	capacity := ipamd.NewCapacity(ipamd.CapacityConfig{Client: cli, Node: "n1", Leader: func() bool { return true }, Interval: time.Second}, reg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); capacity.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	target := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	t.Cleanup(target.Close)

	dir := t.TempDir()
	rules, err := os.ReadFile("rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	rules = regexp.MustCompile(`(?m)^(\s+for:) \S+$`).ReplaceAll(rules, []byte("$1 0s"))
	if err := os.WriteFile(filepath.Join(dir, "rules.yml"), rules, 0o644); err != nil {
		t.Fatal(err)
	}
	port, err := etcdtest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	conf := fmt.Sprintf("global: {scrape_interval: 1s, evaluation_interval: 1s}\nrule_files: [rules.yml]\n"+
		"scrape_configs:\n  - job_name: block-ipamd\n    static_configs: [{targets: ['%s']}]\n", target.Listener.Addr())
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	log, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config.file", filepath.Join(dir, "prometheus.yml"), "--storage.tsdb.path", filepath.Join(dir, "data"),
		"--web.listen-address", addr)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		log.Close()
		if t.Failed() {
			b, _ := os.ReadFile(log.Name())
			t.Logf("prometheus's log:\n%s", b)
		}
	})
	poll := func(what string, cond func() bool) {
		t.Helper()
		for end := time.Now().Add(60 * time.Second); !cond(); time.Sleep(250 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("%s: not within 60 s (firing: %v)", what, firing(t, addr))
			}
		}
	}
	// Ready, and a few evaluations with the pool scraped and empty: none of the pool alerts fires.
	poll("Prometheus scrapes the pool's gauges", func() bool {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return false
		}
		c.Close()
		resp, err := http.Get("http://" + addr + "/api/v1/query?query=block_ipam_pool_addresses")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var q struct{ Data struct{ Result []any } }
		json.NewDecoder(resp.Body).Decode(&q)
		return len(q.Data.Result) == 1
	})
	time.Sleep(3 * time.Second) // three evaluations: a wrongly firing alert would show now
	if f := firing(t, addr); f["BlockIPAMPoolUsageHigh"] != "" || f["BlockIPAMPoolUsageCritical"] != "" {
		t.Fatalf("pool alerts fire on an empty pool: %v", f)
	}

	// Every address of the pool allocated.
	b := calico.NewBlock(pool.CIDR, "host:n1", 1)
	h := "h"
	for ord := range calico.Size(pool.CIDR) {
		if err := b.Assign(ord, calico.AllocationAttribute{HandleID: &h, Secondary: map[string]string{calico.AttrNode: "n1"}}); err != nil {
			t.Fatal(err)
		}
	}
	bv, err := calico.EncodeBlock(b)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(t.Context(), calico.BlockKey(b.CIDR), string(bv)); err != nil {
		t.Fatal(err)
	}
	poll("BlockIPAMPoolUsageCritical fires for the exhausted pool", func() bool {
		f := firing(t, addr)
		return f["BlockIPAMPoolUsageCritical"] == "tiny" && f["BlockIPAMPoolUsageHigh"] == "tiny"
	})
}
