package e2e

import (
	"fmt"
	"maps"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
)

var (
	pool     = netip.MustParsePrefix("10.0.0.0/8")
	selfAddr = netip.MustParsePrefix("192.168.0.254/16") // this node's uplink address and peer IP
)

// exportedMetrics are the metric names the daemon must export once it has started, synced and seen
// some etcd events.
var exportedMetrics = []string{
	"vpp_route_agent_routes_desired",
	"vpp_route_agent_routes_programmed",
	"vpp_route_agent_routes_unresolved",
	"vpp_route_agent_route_operations_total",
	"vpp_route_agent_syncs_total",
	"vpp_route_agent_sync_duration_seconds",
	"vpp_route_agent_last_sync_timestamp_seconds",
	"vpp_route_agent_drift_corrections_total",
	"vpp_route_agent_etcd_events_total",
	"vpp_route_agent_etcd_relists_total",
	"vpp_route_agent_malformed_values_total",
	"vpp_route_agent_vpp_connected",
	"vpp_route_agent_vpp_reconnects_total",
	"vpp_route_agent_vpp_api_errors_total",
	"vpp_route_agent_registration_up",
	"vpp_route_agent_peers",
	"vpp_route_agent_blocks",
	"vpp_route_agent_event_to_fib_seconds",
	"vpp_route_agent_build_info",
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

// remoteCluster puts the IPv4 pool, nodes remote peers and blocks blocks owned round-robin by them, and
// returns the blocks' CIDRs.
func remoteCluster(c *cluster, nodes, blocks int) []netip.Prefix {
	c.t.Helper()
	c.putPool("default-ipv4-ippool", pool.String(), 26)
	for i := range nodes {
		c.putPeer(remoteNode(i), remotePeer(i))
	}
	out := make([]netip.Prefix, blocks)
	for i := range blocks {
		out[i] = c.putBlock(i, remoteNode(i%nodes))
	}
	return out
}

// wantRoutes is the FIB of remoteCluster's blocks: block i via remote node i%nodes.
func wantRoutes(blocks []netip.Prefix, nodes int) map[netip.Prefix]netip.Addr {
	out := map[netip.Prefix]netip.Addr{}
	for i, b := range blocks {
		out[b] = remotePeer(i % nodes)
	}
	return out
}

// healthPoller checks /healthz every 50ms until stopped and remembers every answer that was not 200.
type healthPoller struct {
	stop chan struct{}
	done chan struct{}
	mu   sync.Mutex
	n    int
	bad  []string
}

func pollHealth(a *agent) *healthPoller {
	h := &healthPoller{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(h.done)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-h.stop:
				return
			case <-tick.C:
			}
			resp, err := httpClient.Get(a.url + "/healthz")
			h.mu.Lock()
			h.n++
			if err != nil {
				h.bad = append(h.bad, err.Error())
			} else {
				if resp.StatusCode != http.StatusOK {
					h.bad = append(h.bad, resp.Status)
				}
				resp.Body.Close()
			}
			h.mu.Unlock()
		}
	}()
	return h
}

// finish stops the poller and returns how many probes ran and the failed ones.
func (h *healthPoller) finish() (int, []string) {
	close(h.stop)
	<-h.done
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n, h.bad
}

// TestStartBeforeVPP starts the daemon before VPP (the vppsim binary): /readyz says 503 and what is
// missing, then 200 once the simulator is up and the routes are in; /healthz is 200 throughout; after
// a few etcd events every metric is exported; a VPP restart is repaired; SIGTERM exits 0.
func TestStartBeforeVPP(t *testing.T) {
	c := newCluster(t)
	const nodes = 3
	blocks := remoteCluster(c, nodes, 12)
	c.putBlock(100, "node-unregistered") // owner without a peer IP: unresolved
	sock := filepath.Join(shortDir(t), "api.sock")

	a := startAgent(t, agentConfig{node: "node-self", etcd: c.etcd.Endpoint(), socket: sock, uplink: selfAddr})
	health := pollHealth(a)

	// Without VPP, readiness lists exactly what is missing once etcd has been read and the node is
	// registered.
	wantMissing := "not ready:\n- VPP not connected or uplink not set up\n- first full resync not done\n"
	eventually(t, 5*time.Second, func() string {
		code, body := a.get("/readyz")
		if code != http.StatusServiceUnavailable || body != wantMissing {
			return fmt.Sprintf("/readyz = %d %q, want 503 %q", code, body, wantMissing)
		}
		return ""
	})
	before := a.metrics()
	if v := before.value(t, "vpp_route_agent_vpp_connected"); v != 0 {
		t.Errorf("vpp_connected = %v before VPP is up", v)
	}
	if v := before.value(t, "vpp_route_agent_routes_desired"); v != float64(len(blocks)) {
		t.Errorf("routes_desired = %v before VPP is up, want %d", v, len(blocks))
	}
	var missingBefore []string
	for _, name := range exportedMetrics {
		if _, ok := before.types[name]; !ok {
			missingBefore = append(missingBefore, name)
		}
	}
	t.Logf("not exported before the first sync (vectors without a series yet): %v", missingBefore)

	sim := startSimProc(t, sock)
	a.waitReady(15 * time.Second)
	want := wantRoutes(blocks, nodes)
	if got := sim.apiRoutes(pool); !maps.Equal(got, want) {
		t.Fatalf("FIB once ready:\n got %v\nwant %v", got, want)
	}

	// Events: a new block (an add, timed by event_to_fib), a deleted block (a delete) and a malformed
	// value (skipped and counted).
	added := c.putBlock(200, remoteNode(0))
	want[added] = remotePeer(0)
	eventually(t, 5*time.Second, func() string {
		if got := sim.apiRoutes(pool); !maps.Equal(got, want) {
			return fmt.Sprintf("FIB after a new block:\n got %v\nwant %v", got, want)
		}
		return ""
	})
	if _, err := c.cli.Delete(c.ctx(), calico.BlockKey(blocks[0])); err != nil {
		t.Fatal(err)
	}
	delete(want, blocks[0])
	c.put(calico.BlockPrefix+"ipv4/block/10.255.0.0-26", "{not json")
	eventually(t, 5*time.Second, func() string {
		if got := sim.apiRoutes(pool); !maps.Equal(got, want) {
			return fmt.Sprintf("FIB after a deleted block:\n got %v\nwant %v", got, want)
		}
		return ""
	})

	m := a.metrics()
	var missing []string
	for _, name := range exportedMetrics {
		if _, ok := m.types[name]; !ok {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		t.Errorf("not exported: %v", missing)
	}
	for _, prefix := range []string{"go_", "process_"} {
		if !slices.ContainsFunc(slices.Collect(maps.Keys(m.types)), func(n string) bool { return strings.HasPrefix(n, prefix) }) {
			t.Errorf("no %s* collector metrics", prefix)
		}
	}
	eventually(t, 2*time.Second, func() string {
		m = a.metrics()
		if v, _ := m.sum("vpp_route_agent_malformed_values_total"); v < 1 {
			return fmt.Sprintf("malformed_values_total = %v, want >= 1", v)
		}
		return ""
	})
	for _, chk := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"vpp_route_agent_routes_desired", nil, float64(len(want))},
		{"vpp_route_agent_routes_programmed", nil, float64(len(want))},
		{"vpp_route_agent_routes_unresolved", nil, 1},
		{"vpp_route_agent_vpp_connected", nil, 1},
		{"vpp_route_agent_registration_up", nil, 1},
		{"vpp_route_agent_peers", nil, nodes + 1},
		{"vpp_route_agent_blocks", []string{"owner", "node-unregistered"}, 1},
		{"vpp_route_agent_blocks", []string{"owner", remoteNode(0)}, 4}, // 0, 3, 6, 9, 200, minus 0
		{"vpp_route_agent_route_operations_total", []string{"op", "add", "result", "ok"}, float64(len(blocks) + 1)},
		{"vpp_route_agent_route_operations_total", []string{"op", "delete", "result", "ok"}, 1},
		{"vpp_route_agent_etcd_relists_total", []string{"reason", "initial"}, 1},
		{"vpp_route_agent_event_to_fib_seconds_count", nil, 2},
		{"vpp_route_agent_build_info", []string{"version", buildVersion}, 1},
	} {
		if got := m.value(t, chk.name, chk.labels...); got != chk.want {
			t.Errorf("%s%v = %v, want %v", chk.name, chk.labels, got, chk.want)
		}
	}
	if v := m.value(t, "vpp_route_agent_etcd_events_total", "source", "blocks", "type", "put"); v < 2 {
		t.Errorf("etcd_events_total{blocks,put} = %v, want >= 2", v)
	}

	d := a.debugRoutes()
	if d.Node != "node-self" || len(d.Desired) != len(want) || len(d.Programmed) != len(want) || len(d.Unresolved) != 1 {
		t.Errorf("/debug/routes: node %q, %d desired, %d programmed, %d unresolved; want node-self, %d, %d, 1",
			d.Node, len(d.Desired), len(d.Programmed), len(d.Unresolved), len(want), len(want))
	} else if u := d.Unresolved[0]; u.Owner != "node-unregistered" || !strings.Contains(u.Reason, "no registered IPv4 peer IP") {
		t.Errorf("/debug/routes unresolved: %+v", u)
	}

	// A VPP restart (vppsim's SIGHUP) empties the FIB; the agent reconnects and programs it again.
	sim.signal(syscall.SIGHUP)
	if l := sim.line(); !strings.HasPrefix(l, "vppsim restarted pid=") {
		t.Fatalf("vppsim after SIGHUP: %q", l)
	}
	eventually(t, 10*time.Second, func() string {
		if got := sim.apiRoutes(pool); !maps.Equal(got, want) {
			return fmt.Sprintf("FIB after the VPP restart: %d routes, want %d", len(got), len(want))
		}
		return ""
	})
	a.waitReady(5 * time.Second)
	if v := a.metrics().value(t, "vpp_route_agent_vpp_reconnects_total"); v != 1 {
		t.Errorf("vpp_reconnects_total = %v after one VPP restart, want 1", v)
	}

	n, bad := health.finish()
	if len(bad) > 0 || n < 10 {
		t.Errorf("/healthz: %d probes, failures %q", n, bad)
	}
	a.stop()
}
