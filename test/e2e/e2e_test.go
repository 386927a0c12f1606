package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.fd.io/govpp/adapter/socketclient"
	"go.fd.io/govpp/api"
	"go.fd.io/govpp/binapi/ip"
	"go.fd.io/govpp/binapi/ip_types"
	"go.fd.io/govpp/core"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/internal/calicotest"
	"github.com/vpp-route-agent/vpp-route-agent/internal/vpptest"
	"github.com/vpp-route-agent/vpp-route-agent/test/vppsim"
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

// notExported returns the names of exportedMetrics missing from m.
func notExported(m metrics) []string {
	var missing []string
	for _, name := range exportedMetrics {
		if _, ok := m[name]; !ok {
			missing = append(missing, name)
		}
	}
	return missing
}

// remoteCluster puts the IPv4 pool 10.0.0.0/8, the peer IPs of the given number of remote nodes, and
// the given number of blocks owned round-robin by those nodes; it returns the blocks' CIDRs.
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
	done chan struct{} // closed when the poller has stopped: n and bad are final
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
			h.n++
			if err != nil {
				h.bad = append(h.bad, err.Error())
			} else {
				if resp.StatusCode != http.StatusOK {
					h.bad = append(h.bad, resp.Status)
				}
				resp.Body.Close()
			}
		}
	}()
	return h
}

// finish stops the poller and returns how many probes ran and the failed ones.
func (h *healthPoller) finish() (int, []string) {
	close(h.stop)
	<-h.done
	return h.n, h.bad
}

// TestStartBeforeVPP starts the daemon before VPP: /readyz says 503 and what is missing, then 200 once
// VPP is up and the routes are in; /healthz is 200 throughout; after a few etcd events every metric is
// exported; a VPP restart is repaired; SIGTERM exits 0.
func TestStartBeforeVPP(t *testing.T) {
	c := newCluster(t)
	const nodes = 3
	blocks := remoteCluster(c, nodes, 12)
	c.putBlock(100, "node-unregistered") // owner without a peer IP: unresolved
	v := vpptest.New(t, vpptest.Options{Deferred: true})
	sock := v.Socket()

	a := startAgent(t, agentConfig{node: "node-self", etcd: c.etcd.Endpoint(), socket: sock, uplink: selfAddr, uplinkIf: v.Uplink()})
	health := pollHealth(a)

	// Without VPP, readiness lists exactly what is missing once etcd has been read and the node is
	// registered.
	wantMissing := []string{"not ready:", "- VPP not connected: connect to VPP at " + sock, "- first full resync not done"}
	eventually(t, 5*time.Second, func() string {
		code, body := a.get("/readyz")
		lines := strings.Split(strings.TrimSpace(body), "\n")
		if code != http.StatusServiceUnavailable || len(lines) != len(wantMissing) ||
			!strings.HasPrefix(lines[1], wantMissing[1]) || lines[0] != wantMissing[0] || lines[2] != wantMissing[2] {
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
	// Everything is exported before VPP is up: the vectors' series are created at zero.
	if missing := notExported(before); len(missing) > 0 {
		t.Errorf("not exported before the first resync: %v", missing)
	}

	v.Start()
	a.waitReady(15 * time.Second)
	want := wantRoutes(blocks, nodes)
	if got := v.APIRoutes(pool); !maps.Equal(got, want) {
		t.Fatalf("FIB once ready:\n got %v\nwant %v", got, want)
	}

	// Events: a new block (an add, timed by event_to_fib), a deleted block (a delete) and a malformed
	// value (skipped and counted).
	added := c.putBlock(200, remoteNode(0))
	want[added] = remotePeer(0)
	eventually(t, 5*time.Second, func() string {
		if got := v.APIRoutes(pool); !maps.Equal(got, want) {
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
		if got := v.APIRoutes(pool); !maps.Equal(got, want) {
			return fmt.Sprintf("FIB after a deleted block:\n got %v\nwant %v", got, want)
		}
		return ""
	})

	m := a.metrics()
	if missing := notExported(m); len(missing) > 0 {
		t.Errorf("not exported: %v", missing)
	}
	for _, prefix := range []string{"go_", "process_"} {
		if !slices.ContainsFunc(slices.Collect(maps.Keys(m)), func(n string) bool { return strings.HasPrefix(n, prefix) }) {
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
		{"vpp_route_agent_blocks", []string{"kind", "remote"}, float64(len(blocks) + 1)}, // 12 + 100 + 200 - 0
		{"vpp_route_agent_blocks", []string{"kind", "local"}, 0},
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

	_, raw := a.get("/debug/routes")
	var doc map[string]json.RawMessage
	if err := json.Unmarshal([]byte(raw), &doc); err != nil {
		t.Fatalf("/debug/routes: %v\n%s", err, raw)
	}
	for _, k := range []string{"desired", "programmed", "unresolved"} {
		if !strings.HasPrefix(string(doc[k]), "[") {
			t.Errorf("/debug/routes has no %q list:\n%s", k, raw)
		}
	}
	d := a.debugRoutes()
	if d.Node != "node-self" || len(d.Desired) != len(want) || len(d.Programmed) != len(want) || len(d.Unresolved) != 1 {
		t.Errorf("/debug/routes: node %q, %d desired, %d programmed, %d unresolved; want node-self, %d, %d, 1",
			d.Node, len(d.Desired), len(d.Programmed), len(d.Unresolved), len(want), len(want))
	} else if u := d.Unresolved[0]; u.Owner != "node-unregistered" || !strings.Contains(u.Reason, "no registered IPv4 peer IP") {
		t.Errorf("/debug/routes unresolved: %+v", u)
	}

	// A VPP restart empties the FIB; the agent reconnects and programs it again.
	v.Restart()
	eventually(t, 15*time.Second, func() string {
		if got := v.APIRoutes(pool); !maps.Equal(got, want) {
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

// vppFIB compares VPP's API routes in the pool with want (prefix -> next hop via the uplink).
func vppFIB(v *vpptest.VPP, want map[netip.Prefix]netip.Addr) string {
	got := map[netip.Prefix]netip.Addr{}
	for _, r := range v.Routes(vppsim.SourceAPI) {
		if pool.Bits() > r.Prefix.Bits() || !pool.Contains(r.Prefix.Addr()) {
			continue
		}
		if len(r.Paths) != 1 || r.Paths[0].SwIfIndex != 1 {
			got[r.Prefix] = netip.Addr{} // not a route the agent would program
			continue
		}
		got[r.Prefix] = r.Paths[0].NextHop
	}
	if maps.Equal(got, want) {
		return ""
	}
	return fmt.Sprintf("FIB: %d routes in the pool, want %d:\n got %v\nwant %v", len(got), len(want), got, want)
}

// registration returns node's IPv4 peer key and its lease's remaining TTL (-1: the lease is gone).
func (c *cluster) registration(node string) (*mvccpb.KeyValue, int64) {
	c.t.Helper()
	resp, err := c.cli.Get(c.ctx(), peerKey(node))
	if err != nil {
		c.t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return nil, -1
	}
	kv := resp.Kvs[0]
	if kv.Lease == 0 {
		return kv, 0
	}
	ttl, err := c.cli.TimeToLive(c.ctx(), clientv3.LeaseID(kv.Lease))
	if err != nil {
		c.t.Fatal(err)
	}
	return kv, ttl.TTL
}

// TestRegistrationOutlivesRestart: the peer IP is registered on a lease; SIGTERM exits 0 and leaves the
// routes and the registration (lease not revoked) in place; a new process adopts the registration
// (no write) and does not touch the FIB.
func TestRegistrationOutlivesRestart(t *testing.T) {
	c := newCluster(t)
	blocks := remoteCluster(c, 2, 6)
	want := wantRoutes(blocks, 2)
	v := vpptest.New(t, vpptest.Options{CountRequests: true})
	cfg := agentConfig{node: "node-self", etcd: c.etcd.Endpoint(), socket: v.Socket(), uplink: selfAddr, uplinkIf: v.Uplink()}
	a := startAgent(t, cfg)
	a.waitReady(10 * time.Second)
	if msg := vppFIB(v, want); msg != "" {
		t.Fatal(msg)
	}
	kv, ttl := c.registration("node-self")
	if kv == nil || string(kv.Value) != selfAddr.Addr().String() || kv.Lease == 0 || ttl <= 0 || ttl > 10 {
		t.Fatalf("registration %s = %v with TTL %d; want %s on a live 10s lease", peerKey("node-self"), kv, ttl, selfAddr.Addr())
	}
	writes := v.CountRequests("ip_route_add_del")

	a.signal(syscall.SIGTERM)
	stopped := time.Now()
	if code, took := a.wait(8 * time.Second); code != 0 || took > 3*time.Second {
		t.Fatalf("SIGTERM: exit status %d after %s, want 0 within 3s", code, took)
	}
	if msg := vppFIB(v, want); msg != "" {
		t.Fatalf("after SIGTERM: %s", msg)
	}
	kv2, ttl := c.registration("node-self")
	if kv2 == nil || kv2.Lease != kv.Lease || ttl <= 0 {
		t.Fatalf("after SIGTERM the registration is %v with TTL %d; want it kept on lease %x", kv2, ttl, kv.Lease)
	}

	// A new process with the same peer IP adopts the lease its predecessor left: it writes nothing
	// (other nodes see no event) and keeps the lease alive past its TTL.
	wctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	watch := c.cli.Watch(wctx, peerKey("node-self"), clientv3.WithRev(kv2.ModRevision+1))
	a = startAgent(t, cfg)
	a.waitReady(10 * time.Second)
	t.Logf("ready %s after exec", time.Since(a.started).Round(time.Millisecond))
	time.Sleep(time.Until(stopped.Add(11 * time.Second))) // the lease had at most 10s left then
	select {
	case resp := <-watch:
		t.Fatalf("after the restart the registration changed: %+v", resp)
	default:
	}
	if kv3, ttl := c.registration("node-self"); kv3 == nil || kv3.Lease != kv.Lease || ttl <= 0 {
		t.Fatalf("after the restart the registration is %v with TTL %d; want it adopted on lease %x", kv3, ttl, kv.Lease)
	}
	a.waitReady(10 * time.Second)
	if n := v.CountRequests("ip_route_add_del"); n != writes {
		t.Errorf("the restarted agent sent %d ip_route_add_del for a FIB that was already right", n-writes)
	}
	a.stop()
}

// TestDeregisterOnExit: with --deregister-on-exit, SIGTERM revokes the lease (deleting the key) but
// leaves the routes.
func TestDeregisterOnExit(t *testing.T) {
	c := newCluster(t)
	blocks := remoteCluster(c, 2, 4)
	v := vpptest.New(t, vpptest.Options{})
	a := startAgent(t, agentConfig{node: "node-self", etcd: c.etcd.Endpoint(), socket: v.Socket(), uplink: selfAddr,
		uplinkIf: v.Uplink(), extra: []string{"--deregister-on-exit"}})
	a.waitReady(10 * time.Second)
	kv, _ := c.registration("node-self")
	if kv == nil {
		t.Fatal("not registered")
	}
	a.stop()
	if kv, ttl := c.registration("node-self"); kv != nil {
		t.Fatalf("after SIGTERM with --deregister-on-exit the key is still there: %v (TTL %d)", kv, ttl)
	}
	ttl, err := c.cli.TimeToLive(c.ctx(), clientv3.LeaseID(kv.Lease))
	if err != nil || ttl.TTL != -1 {
		t.Errorf("lease %x after deregistration: TTL %v, %v; want revoked (-1)", kv.Lease, ttl, err)
	}
	if msg := vppFIB(v, wantRoutes(blocks, 2)); msg != "" {
		t.Errorf("deregistration withdrew routes: %s", msg)
	}
}

// TestWithdrawOnExit: with --withdraw-on-exit, SIGTERM deletes exactly the routes the agent owns: not
// a foreign route inside the pool, not a route via the uplink outside the pool, not the interface's.
func TestWithdrawOnExit(t *testing.T) {
	c := newCluster(t)
	blocks := remoteCluster(c, 2, 6)
	v := vpptest.New(t, vpptest.Options{})
	foreign := []vppsim.Route{
		{Prefix: netip.MustParsePrefix("10.200.0.0/26"), Paths: []vppsim.Path{{SwIfIndex: ^uint32(0), Type: "drop"}}},
		{Prefix: netip.MustParsePrefix("172.16.0.0/16"), Paths: []vppsim.Path{{NextHop: netip.MustParseAddr("192.168.0.1"), SwIfIndex: 1}}},
	}
	for _, r := range foreign {
		v.AddRoute(r)
	}
	a := startAgent(t, agentConfig{node: "node-self", etcd: c.etcd.Endpoint(), socket: v.Socket(), uplink: selfAddr,
		uplinkIf: v.Uplink(), extra: []string{"--withdraw-on-exit"}})
	a.waitReady(10 * time.Second)
	want := wantRoutes(blocks, 2)
	want[foreign[0].Prefix] = netip.Addr{}
	if msg := vppFIB(v, want); msg != "" {
		t.Fatal(msg)
	}
	otherRoutes := nonAPIRoutes(v)

	a.stop()
	var left []string
	for _, r := range v.Routes(vppsim.SourceAPI) {
		left = append(left, r.Prefix.String())
	}
	slices.Sort(left)
	if want := []string{"10.200.0.0/26", "172.16.0.0/16"}; !slices.Equal(left, want) {
		t.Errorf("API routes after SIGTERM with --withdraw-on-exit: %v, want only the foreign %v", left, want)
	}
	if after := nonAPIRoutes(v); !slices.Equal(after, otherRoutes) {
		t.Errorf("the withdrawal changed VPP's other entries:\n got %v\nwant %v", after, otherRoutes)
	}
	if kv, _ := c.registration("node-self"); kv == nil {
		t.Error("--withdraw-on-exit alone removed the registration")
	}
}

// nonAPIRoutes returns the prefixes of VPP's entries whose best source is not the API (interface
// routes, VPP's own), sorted.
func nonAPIRoutes(v *vpptest.VPP) []netip.Prefix {
	var out []netip.Prefix
	for _, r := range v.Routes(0) {
		if r.Source != vppsim.SourceAPI {
			out = append(out, r.Prefix)
		}
	}
	slices.SortFunc(out, netip.Prefix.Compare)
	return out
}

// vppClient is a second GoVPP client of VPP: VPP's CLI or another agent, writing behind the
// agent's back.
func vppClient(t *testing.T, sock string) api.Channel {
	t.Helper()
	conn, err := core.Connect(socketclient.NewVppClient(sock))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Disconnect)
	ch, err := conn.NewAPIChannel()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ch.Close)
	ch.SetReplyTimeout(2 * time.Second)
	return ch
}

// TestSIGHUPRelistRepairsDrift: routes deleted or changed in VPP behind the agent's back stay broken
// (no periodic resync in this test) until SIGHUP, which relists etcd and resyncs the FIB, repairing
// them and counting the drift.
func TestSIGHUPRelistRepairsDrift(t *testing.T) {
	c := newCluster(t)
	blocks := remoteCluster(c, 2, 8)
	want := wantRoutes(blocks, 2)
	v := vpptest.New(t, vpptest.Options{})
	a := startAgent(t, agentConfig{node: "node-self", etcd: c.etcd.Endpoint(), socket: v.Socket(), uplink: selfAddr,
		uplinkIf: v.Uplink()})
	a.waitReady(10 * time.Second)
	if msg := vppFIB(v, want); msg != "" {
		t.Fatal(msg)
	}
	m0 := a.metrics()

	// Drift: one route deleted by another API client, one repointed.
	pfx, err := ip_types.ParsePrefix(blocks[0].String())
	if err != nil {
		t.Fatal(err)
	}
	reply := &ip.IPRouteAddDelReply{}
	if err := vppClient(t, v.Socket()).SendRequest(&ip.IPRouteAddDel{IsAdd: false, Route: ip.IPRoute{Prefix: pfx}}).ReceiveReply(reply); err != nil || reply.Retval != 0 {
		t.Fatalf("delete %s behind the agent's back: %v, retval %d", blocks[0], err, reply.Retval)
	}
	wrong := netip.MustParseAddr("192.168.77.77")
	v.AddRoute(vppsim.Route{Prefix: blocks[1], Paths: []vppsim.Path{{NextHop: wrong, SwIfIndex: 1}}})
	drifted := maps.Clone(want)
	delete(drifted, blocks[0])
	drifted[blocks[1]] = wrong
	time.Sleep(300 * time.Millisecond)
	if msg := vppFIB(v, drifted); msg != "" {
		t.Fatalf("drift repaired before SIGHUP (%s)", msg)
	}

	a.signal(syscall.SIGHUP)
	eventually(t, 5*time.Second, func() string { return vppFIB(v, want) })
	// The FIB is repaired as VPP applies the adds, a moment before the agent has read their replies
	// and counted the resync.
	synced := []string{"kind", "relist-requested", "result", "ok"}
	before, _ := m0.sum("vpp_route_agent_syncs_total", synced...)
	eventually(t, 5*time.Second, func() string {
		if v, _ := a.metrics().sum("vpp_route_agent_syncs_total", synced...); v == before {
			return "the relist's resync is not counted yet"
		}
		return ""
	})
	m1 := a.metrics()
	for _, chk := range []struct {
		name   string
		labels []string
		delta  float64
	}{
		{"vpp_route_agent_etcd_relists_total", []string{"reason", "requested"}, 1},
		{"vpp_route_agent_syncs_total", []string{"kind", "relist-requested", "result", "ok"}, 1},
		{"vpp_route_agent_drift_corrections_total", nil, 2},
		{"vpp_route_agent_route_operations_total", []string{"op", "add", "result", "ok"}, 2},
	} {
		before, _ := m0.sum(chk.name, chk.labels...)
		if d := m1.value(t, chk.name, chk.labels...) - before; d != chk.delta {
			t.Errorf("%s%v rose by %v after SIGHUP, want %v", chk.name, chk.labels, d, chk.delta)
		}
	}
	if code, _ := a.get("/readyz"); code != http.StatusOK {
		t.Errorf("/readyz after SIGHUP: %d", code)
	}
	a.stop()
}

// TestDryRun: --dry-run computes and logs the changes, including the deletion of a stale owned route,
// but writes nothing to VPP (no route, no interface flags or address, no table), registers nothing and
// withdraws nothing on exit.
func TestDryRun(t *testing.T) {
	c := newCluster(t)
	blocks := remoteCluster(c, 2, 5)
	v := vpptest.New(t, vpptest.Options{CountRequests: true})
	stale := vppsim.Route{Prefix: calicotest.BlockCIDR(900), Paths: []vppsim.Path{{NextHop: remotePeer(0), SwIfIndex: 1}}}
	v.AddRoute(stale)
	interfacesBefore := v.Interfaces()
	v.ResetRequests()
	a := startAgent(t, agentConfig{node: "node-self", etcd: c.etcd.Endpoint(), socket: v.Socket(), uplinkIf: v.Uplink(),
		extra: []string{"--dry-run", "--withdraw-on-exit", "--deregister-on-exit"}})
	a.waitReady(10 * time.Second)
	added := c.putBlock(50, remoteNode(1)) // an incremental change is not written either
	eventually(t, 5*time.Second, func() string {
		if v, _ := a.metrics().sum("vpp_route_agent_route_operations_total", "op", "add", "result", "dry_run"); v != float64(len(blocks)+1) {
			return fmt.Sprintf("dry-run adds = %v, want %d", v, len(blocks)+1)
		}
		return ""
	})
	m := a.metrics()
	if v := m.value(t, "vpp_route_agent_route_operations_total", "op", "delete", "result", "dry_run"); v != 1 {
		t.Errorf("dry-run deletes = %v, want 1 (the stale route)", v)
	}
	if v, _ := m.sum("vpp_route_agent_route_operations_total", "result", "ok"); v != 0 {
		t.Errorf("%v route operations done in a dry run", v)
	}
	d := a.debugRoutes()
	if len(d.Desired) != len(blocks)+1 || len(d.Programmed) != 1 || d.Programmed[0].Prefix != stale.Prefix {
		t.Errorf("/debug/routes: %d desired, programmed %v; want %d and only the stale %s", len(d.Desired), d.Programmed, len(blocks)+1, stale.Prefix)
	}
	var would []string
	for _, r := range a.records() {
		if strings.HasPrefix(r.str("msg"), "dry run: would ") {
			would = append(would, r.str("msg")+" "+r.str("prefix"))
		}
	}
	slices.Sort(would)
	var wantWould []string
	for _, b := range append(slices.Clone(blocks), added) {
		wantWould = append(wantWould, "dry run: would add "+b.String())
	}
	wantWould = append(wantWould, "dry run: would delete "+stale.Prefix.String())
	slices.Sort(wantWould)
	if !slices.Equal(would, wantWould) {
		t.Errorf("dry-run log:\n got %q\nwant %q", would, wantWould)
	}
	resp, err := c.cli.Get(c.ctx(), hostsPrefix+"node-self/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || resp.Count != 0 {
		t.Errorf("a dry run registered %d keys (%v)", resp.Count, err)
	}
	a.stop()

	counts := v.RequestCounts()
	for _, msg := range []string{"ip_route_add_del", "sw_interface_set_flags", "sw_interface_add_del_address", "ip_table_add_del"} {
		if counts[msg] != 0 {
			t.Errorf("a dry run sent %d %s", counts[msg], msg)
		}
	}
	if counts["ip_route_v2_dump"] == 0 || counts["sw_interface_dump"] == 0 {
		t.Errorf("a dry run did not read VPP: requests %v", counts)
	}
	if got := v.Routes(vppsim.SourceAPI); len(got) != 1 || got[0].Prefix != stale.Prefix {
		t.Errorf("FIB after the dry run: %v, want only the stale route", got)
	}
	if got := v.Interfaces(); !slices.EqualFunc(got, interfacesBefore, func(a, b vppsim.Interface) bool {
		return a.Name == b.Name && a.AdminUp == b.AdminUp && slices.Equal(a.Addresses, b.Addresses)
	}) {
		t.Errorf("interfaces after the dry run: %+v, before %+v", got, interfacesBefore)
	}
}

// silentListeners are an etcd endpoint and a VPP socket that accept connections and never answer,
// counting the connections.
type silentListeners struct {
	etcd, sock string
	accepts    atomic.Int32
}

func listenSilently(t *testing.T) *silentListeners {
	t.Helper()
	s := &silentListeners{sock: filepath.Join(shortDir(t), "api.sock")}
	tl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ul, err := net.Listen("unix", s.sock)
	if err != nil {
		t.Fatal(err)
	}
	s.etcd = "http://" + tl.Addr().String()
	for _, l := range []net.Listener{tl, ul} {
		t.Cleanup(func() { l.Close() })
		go func() {
			for {
				conn, err := l.Accept()
				if err != nil {
					return
				}
				s.accepts.Add(1)
				t.Cleanup(func() { conn.Close() })
			}
		}()
	}
	return s
}

// TestBadFlagExitsAtOnce: an invalid flag or environment value makes the daemon exit with status 2 and
// a message naming the flag, before it connects to etcd or VPP.
func TestBadFlagExitsAtOnce(t *testing.T) {
	l := listenSilently(t)
	base := agentConfig{node: "node-self", etcd: l.etcd, socket: l.sock, uplink: selfAddr}.args()
	for _, tc := range []struct {
		args []string
		env  []string
		want string
	}{
		{args: []string{"--pool-cidr", "10.0.0.1/8"}, want: "--pool-cidr"},
		{args: []string{"--pool-cidr", "10.0.0.0/33"}, want: "--pool-cidr"},
		{args: []string{"--etcd-endpoints", "127.0.0.1:2379"}, want: "--etcd-endpoints"},
		{args: []string{"--uplink-address", "192.168.0.1"}, want: "--uplink-address"},
		{args: []string{"--log-level", "loud"}, want: "--log-level"},
		{args: []string{"--registration-ttl", "1s"}, want: "--registration-ttl"},
		{args: []string{"--resync-interval", "10ms"}, want: "--resync-interval"},
		{args: []string{"--table-id", "main"}, want: "--table-id"},
		{args: []string{"--no-such-flag"}, want: "no-such-flag"},
		{env: []string{"VPP_ROUTE_AGENT_TABLE_ID=main"}, want: "VPP_ROUTE_AGENT_TABLE_ID"},
	} {
		t.Run(strings.Join(append(tc.args, tc.env...), " "), func(t *testing.T) {
			p := startProc(t, "agent", agentBin, tc.env, nil, append(slices.Clone(base), tc.args...)...)
			code, _ := p.wait(5 * time.Second)
			if wall := time.Since(p.started); code != 2 || wall > 2*time.Second {
				t.Errorf("exit status %d after %s, want 2 at once", code, wall)
			}
			if out := p.output(); !strings.Contains(out, tc.want) || strings.Contains(out, "starting vpp-route-agent") {
				t.Errorf("stderr does not name %s, or the daemon started:\n%s", tc.want, out)
			}
		})
	}
	if n := l.accepts.Load(); n != 0 {
		t.Errorf("%d connections to etcd or VPP with invalid flags", n)
	}
}

// run runs the agent binary to completion and returns its stdout, stderr, exit status and duration.
func run(t *testing.T, env []string, args ...string) (string, string, int, time.Duration) {
	t.Helper()
	var stdout strings.Builder
	p := startProc(t, "vpp-route-agent "+args[0], agentBin, env, &stdout, args...)
	code, _ := p.wait(30 * time.Second)
	return stdout.String(), p.output(), code, time.Since(p.started)
}

// putTestdata writes every block of calico/testdata into etcd, as Calico stores it.
func (c *cluster) putTestdata() {
	c.t.Helper()
	files, err := filepath.Glob("../../calico/testdata/*.json")
	if err != nil || len(files) == 0 {
		c.t.Fatalf("calico/testdata: %v %v", files, err)
	}
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			c.t.Fatal(err)
		}
		var kv struct {
			Key   string          `json:"key"`
			Value json.RawMessage `json:"value"`
		}
		if err := json.Unmarshal(raw, &kv); err != nil {
			c.t.Fatalf("%s: %v", f, err)
		}
		var compact bytes.Buffer
		if err := json.Compact(&compact, kv.Value); err != nil {
			c.t.Fatal(err)
		}
		c.put(kv.Key, compact.String())
	}
}

// TestRoutesCommand runs `vpp-route-agent routes` against Calico-format blocks (calico/testdata) and
// registered peers, in both output formats, with flags and with their environment fall-backs.
func TestRoutesCommand(t *testing.T) {
	c := newCluster(t)
	c.putPool("default-ipv4-ippool", "10.244.0.0/16", 26)
	c.putPool("default-ipv6-ippool", "fd00:10:244::/48", 122)
	c.putPool("legacy-ippool", "192.168.45.0/24", 26)
	c.putTestdata()
	c.putPeer("node-a", netip.MustParseAddr("192.0.2.1"))
	c.putPeer("node-a", netip.MustParseAddr("2001:db8::1"))
	c.putPeer("node-b", netip.MustParseAddr("192.0.2.2"))
	// node-old (the legacy block's owner) has no peer IP; the load-balancer block belongs to no node;
	// the deleted block is absent.

	stdout, stderr, code, _ := run(t, nil, "routes", "--etcd-endpoints", c.etcd.Endpoint(), "--nodename", "node-c")
	wantTable := "10.244.1.64/26 via 192.0.2.1 owner node-a encap none\n" +
		"10.244.1.68/32 via 192.0.2.2 owner node-b encap none\n" +
		"fd00:10:244:0:8e1f:1a2b:3c4d:5e40/122 via 2001:db8::1 owner node-a encap none\n" +
		"unresolved 192.168.45.0/26 owner node-old: node \"node-old\" has no registered IPv4 peer IP\n"
	if code != 0 || stdout != wantTable {
		t.Errorf("routes (table) for node-c: exit %d\n got %q\nwant %q\nstderr: %s", code, stdout, wantTable, stderr)
	}

	type route struct {
		Prefix     string  `json:"prefix"`
		NextHop    *string `json:"next_hop"`
		Owner      string  `json:"owner"`
		Kind       string  `json:"kind"`
		Block      string  `json:"block"`
		Unresolved string  `json:"unresolved"`
	}
	// The environment fall-backs, Calico's names where it has one.
	stdout, stderr, code, _ = run(t, []string{"ETCD_ENDPOINTS=" + c.etcd.Endpoint(), "NODENAME=node-a"}, "routes", "--output", "json")
	var got []route
	if err := json.Unmarshal([]byte(stdout), &got); code != 0 || err != nil {
		t.Fatalf("routes --output json: exit %d, %v\n%s\nstderr: %s", code, err, stdout, stderr)
	}
	nh := "192.0.2.2"
	want := []route{
		{Prefix: "10.244.1.68/32", NextHop: &nh, Owner: "node-b", Kind: "borrowed", Block: "10.244.1.64/26"},
		{Prefix: "192.168.45.0/26", Owner: "node-old", Kind: "block", Block: "192.168.45.0/26",
			Unresolved: `node "node-old" has no registered IPv4 peer IP`},
	}
	if !slices.EqualFunc(got, want, func(a, b route) bool {
		return a.Prefix == b.Prefix && a.Owner == b.Owner && a.Kind == b.Kind && a.Block == b.Block &&
			a.Unresolved == b.Unresolved && (a.NextHop == nil) == (b.NextHop == nil) && (a.NextHop == nil || *a.NextHop == *b.NextHop)
	}) {
		t.Errorf("routes --output json for node-a:\n got %s\nwant %+v", stdout, want)
	}
}

// TestRoutesCommandUnreachable: with etcd unreachable the routes subcommand fails within
// --etcd-dial-timeout, naming the endpoint.
func TestRoutesCommandUnreachable(t *testing.T) {
	endpoint := "http://" + closedPort(t)
	const timeout = time.Second
	_, stderr, code, took := run(t, nil, "routes", "--etcd-endpoints", endpoint, "--nodename", "node-c",
		"--etcd-dial-timeout", timeout.String())
	if code != 1 || took > timeout+time.Second {
		t.Errorf("exit status %d after %s, want 1 within %s", code, took, timeout)
	}
	if !strings.Contains(stderr, endpoint) || !strings.Contains(stderr, "unreachable") {
		t.Errorf("stderr does not say that %s is unreachable:\n%s", endpoint, stderr)
	}
	t.Logf("took %s: %s", took.Round(time.Millisecond), stderr)
}
