package monitoring

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"sigs.k8s.io/yaml"

	"github.com/vpp-route-agent/vpp-route-agent/agent"
	"github.com/vpp-route-agent/vpp-route-agent/blockwatch"
	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/cni/ipamd"
	"github.com/vpp-route-agent/vpp-route-agent/cni/release"
	"github.com/vpp-route-agent/vpp-route-agent/internal/etcdtest"
	"github.com/vpp-route-agent/vpp-route-agent/vppapi"
)

// promtool returns promtool's path, skipping the test when it is not installed.
func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool is not installed (Debian: apt-get install --no-install-recommends prometheus; make test installs it)")
	}
	return p
}

func run(t *testing.T, name string, args ...string) {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

// TestRules: the rules load, and their unit tests (each alert fires and stays quiet when it should)
// pass.
func TestRules(t *testing.T) {
	p := promtool(t)
	run(t, p, "check", "rules", "rules.yml")
	run(t, p, "test", "rules", "rules_test.yml")
	run(t, p, "check", "config", "prometheus.yml")
}

// recorder is a Registerer that keeps the collectors registered with it.
type recorder struct{ cs []prometheus.Collector }

func (r *recorder) Register(c prometheus.Collector) error   { r.cs = append(r.cs, c); return nil }
func (r *recorder) MustRegister(cs ...prometheus.Collector) { r.cs = append(r.cs, cs...) }
func (r *recorder) Unregister(prometheus.Collector) bool    { return false }

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

// names returns the metric names the collectors describe, and those unchecked collectors (which
// describe nothing) send.
func (r *recorder) names() map[string]bool {
	out := map[string]bool{}
	descs := make(chan *prometheus.Desc, 1000)
	metrics := make(chan prometheus.Metric, 1000)
	for _, c := range r.cs {
		c.Describe(descs)
		c.Collect(metrics)
	}
	close(descs)
	close(metrics)
	for d := range descs {
		if m := fqName.FindStringSubmatch(d.String()); m != nil {
			out[m[1]] = true
		}
	}
	for m := range metrics {
		if n := fqName.FindStringSubmatch(m.Desc().String()); n != nil {
			out[n[1]] = true
		}
	}
	return out
}

// exported returns every metric name the two binaries export, built by the constructors their main
// functions call: the agent's, blockwatch's and vppapi's metrics, the IPAM daemon's, its capacity
// gauges as the elected exporter (after a read of a pool and a block), and the Go and process
// collectors. Histograms add their _bucket, _sum and _count series.
func exported(t *testing.T) map[string]bool {
	_, cli := etcdtest.Start(t)
	pool, err := calico.EncodeIPPool(calico.IPPool{Name: "p", CIDR: netip.MustParsePrefix("10.0.0.0/24"), BlockSize: 26})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(t.Context(), calico.IPPoolKey("p"), string(pool)); err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	rec.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	agent.NewMetrics(rec)
	if _, err := vppapi.New(vppapi.Config{Socket: "/nonexistent/api.sock", Registerer: rec}); err != nil {
		t.Fatal(err)
	}
	if _, err := blockwatch.New(blockwatch.Config{Client: cli, Registerer: rec}); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	if _, err := ipamd.New(ipamd.Config{Node: "n1", Client: cli, Logger: log, Registerer: rec}); err != nil {
		t.Fatal(err)
	}
	capacity := ipamd.NewCapacity(ipamd.CapacityConfig{Client: cli, Node: "n1", Leader: func() bool { return true }, Logger: log}, rec)
	if err := capacity.Refresh(t.Context(), true); err != nil {
		t.Fatal(err)
	}
	if _, err := release.NewReaper(release.ReaperConfig{Client: cli, Node: "n1", After: time.Minute}, rec); err != nil {
		t.Fatal(err)
	}
	names := rec.names()
	for n := range names {
		for _, s := range []string{"_bucket", "_sum", "_count"} {
			names[n+s] = true
		}
	}
	// Series Prometheus itself makes for every target and alert.
	names["up"], names["ALERTS"] = true, true
	return names
}

var (
	strLit    = regexp.MustCompile(`"(\\.|[^"\\])*"|'(\\.|[^'\\])*'`)
	matchers  = regexp.MustCompile(`\{[^}]*\}`)
	ranges    = regexp.MustCompile(`\[[^\]]*\]`)
	grouping  = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	variables = regexp.MustCompile(`\$\{[^}]*\}|\$\w+`)
	ident     = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*(\s*\()?`)
	labelVals = regexp.MustCompile(`label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)`)
	keywords  = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true, "group_left": true, "group_right": true, "e": true, "inf": true, "nan": true}
)

// metricNames returns the metric names a PromQL expression (or Grafana query) reads.
func metricNames(expr string) []string {
	if m := labelVals.FindStringSubmatch(expr); m != nil {
		return []string{m[1]}
	}
	for _, re := range []*regexp.Regexp{strLit, matchers, ranges, grouping, variables} {
		expr = re.ReplaceAllString(expr, " ")
	}
	var out []string
	for _, m := range ident.FindAllString(expr, -1) {
		if strings.HasSuffix(m, "(") || keywords[strings.ToLower(m)] {
			continue // a function or aggregation
		}
		out = append(out, m)
	}
	return out
}

func TestMetricNames(t *testing.T) {
	for expr, want := range map[string][]string{
		`sum by (pool, family) (a_b{x="y,z}"}) / on (node) group_left () rate(c[5m]) > 0.8`: {"a_b", "c"},
		`up{job="block-ipamd"} == 0 or absent(d)`:                                           {"up", "d"},
		`label_values(block_ipam_pool_addresses, pool)`:                                     {"block_ipam_pool_addresses"},
		`histogram_quantile(0.99, sum by (le) (rate(h_bucket[$__rate_interval])))`:          {"h_bucket"},
		`time() - max by (instance) (x) > 270 unless on (instance) y == 1`:                  {"x", "y"},
	} {
		if got := metricNames(expr); !slices.Equal(got, want) {
			t.Errorf("metricNames(%s) = %v, want %v", expr, got, want)
		}
	}
}

// queries returns every expression of the rules and the dashboard, each with where it is.
func queries(t *testing.T) map[string]string {
	out := map[string]string{}
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert, Record, Expr string
			}
		}
	}
	data, err := os.ReadFile("rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, &rules); err != nil {
		t.Fatal(err)
	}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			out["rules.yml "+r.Alert+r.Record] = r.Expr
		}
	}
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
		Templating struct {
			List []struct {
				Name  string
				Query any
			}
		}
	}
	data, err = os.ReadFile("dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatal(err)
	}
	for _, p := range dash.Panels {
		for i, tg := range p.Targets {
			out["dashboard.json panel "+p.Title+" target "+string(rune('A'+i))] = tg.Expr
		}
	}
	for _, v := range dash.Templating.List {
		if q, ok := v.Query.(string); ok && strings.Contains(q, "(") {
			out["dashboard.json variable "+v.Name] = q
		}
	}
	return out
}

// TestQueriesNameExportedMetrics: every metric the alert rules and the dashboard read is one the
// binaries export, so no panel stays empty and no alert is silenced by a renamed metric.
func TestQueriesNameExportedMetrics(t *testing.T) {
	names := exported(t)
	qs := queries(t)
	if len(qs) < 20 {
		t.Fatalf("only %d queries found in rules.yml and dashboard.json", len(qs))
	}
	var errs []error
	for where, expr := range qs {
		ms := metricNames(expr)
		if len(ms) == 0 {
			errs = append(errs, errors.New(where+": names no metric"))
		}
		for _, m := range ms {
			if !names[m] {
				errs = append(errs, errors.New(where+": "+m+" is not exported by vpp-route-agent or block-ipamd"))
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		t.Error(err)
	}
}
