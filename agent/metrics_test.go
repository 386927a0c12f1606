package agent_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vpp-route-agent/vpp-route-agent/agent"
)

// TestMetricsExportedBeforeAnyEvent: every metric family, vectors included, is exported as soon as the
// metrics exist, before the first resync or route operation (both wait for VPP).
func TestMetricsExportedBeforeAnyEvent(t *testing.T) {
	reg := prometheus.NewRegistry()
	agent.NewMetrics(reg)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, f := range families {
		got[f.GetName()] = len(f.GetMetric())
	}
	for _, name := range []string{
		"vpp_route_agent_routes_desired", "vpp_route_agent_routes_programmed", "vpp_route_agent_routes_unresolved",
		"vpp_route_agent_peers", "vpp_route_agent_route_operations_total", "vpp_route_agent_syncs_total",
		"vpp_route_agent_sync_duration_seconds", "vpp_route_agent_last_sync_timestamp_seconds",
		"vpp_route_agent_drift_corrections_total", "vpp_route_agent_registration_up",
		"vpp_route_agent_event_to_fib_seconds", "vpp_route_agent_snapshots_total", "vpp_route_agent_build_info",
		"vpp_route_agent_tunnels", "vpp_route_agent_tunnel_operations_total", "vpp_route_agent_routes_programmed_by_encap",
		"vpp_route_agent_pod_mtu_bytes",
	} {
		if got[name] == 0 {
			t.Errorf("%s is not exported before any event", name)
		}
	}
	if n := got["vpp_route_agent_syncs_total"]; n != 2*14 {
		t.Errorf("vpp_route_agent_syncs_total has %d series, want 28 (14 kinds, ok and error)", n)
	}
	// vpp_route_agent_blocks is per-agent totals by kind, never a series per node.
	if n := got["vpp_route_agent_blocks"]; n != 3 {
		t.Errorf("vpp_route_agent_blocks has %d series, want 3 (local, remote, unowned)", n)
	}
}
