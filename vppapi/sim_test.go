package vppapi_test

// Integration tests: the client against a VPP over a real unix socket, through GoVPP's unmodified
// socketclient. Tests that start it with vpptest run against the simulator and, with
// VPP_TEST_BACKEND=real, a real VPP; those that use startSim need the simulator's faults.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"
	"go.fd.io/govpp/adapter/socketclient"
	"go.fd.io/govpp/api"
	"go.fd.io/govpp/core"

	"github.com/vpp-route-agent/vpp-route-agent/internal/logging"
	"github.com/vpp-route-agent/vpp-route-agent/internal/vpptest"
	"github.com/vpp-route-agent/vpp-route-agent/test/vppsim"
	"github.com/vpp-route-agent/vpp-route-agent/vppapi"
)

func TestMain(m *testing.M) {
	// GoVPP logs through global logrus loggers; the faults these tests inject make it chatty.
	quiet := logrus.New()
	quiet.SetOutput(io.Discard)
	core.SetLogger(quiet)
	socketclient.SetLogger(quiet)
	os.Exit(m.Run())
}

const (
	uplinkName = "GigabitEthernet0/8/0"
	// testReplyTimeout keeps fault tests fast; health probes run every testHealth.
	testReplyTimeout = 400 * time.Millisecond
	testHealth       = 100 * time.Millisecond
	// eventWait bounds waiting for any connection event.
	eventWait = 10 * time.Second
)

// startSim starts a simulator listening on a fresh short socket path. Against a real VPP
// (VPP_TEST_BACKEND=real) the test is skipped, saying why it needs the simulator.
func startSim(t testing.TB, why string, cfg vppsim.Config) *vppsim.Sim {
	t.Helper()
	vpptest.RequireSim(t, why)
	dir, err := os.MkdirTemp("", "va")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sim, err := vppsim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := sim.Listen(filepath.Join(dir, "api.sock")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	return sim
}

// harness is a client whose Run is running against a VPP.
type harness struct {
	t      testing.TB
	c      *vppapi.Client
	reg    *prometheus.Registry
	cancel context.CancelFunc
	done   chan error
}

// start runs a client against sim and waits for its first event, which must be Connected unless
// wantConnected is false.
func start(t testing.TB, socket string, mutate func(*vppapi.Config)) *harness {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg := vppapi.Config{
		Socket:         socket,
		ReplyTimeout:   testReplyTimeout,
		ReconnectDelay: 20 * time.Millisecond,
		HealthInterval: testHealth,
		Registerer:     reg,
	}
	if mutate != nil {
		mutate(&cfg)
	}
	c, err := vppapi.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &harness{t: t, c: c, reg: reg, cancel: cancel, done: make(chan error, 1)}
	go func() { h.done <- c.Run(ctx) }()
	t.Cleanup(h.stop)
	return h
}

// stop cancels Run and checks it returns promptly.
func (h *harness) stop() {
	h.cancel()
	select {
	case err := <-h.done:
		if err != nil {
			h.t.Errorf("Run returned %v", err)
		}
		h.done <- nil // later stops return at once
	case <-time.After(3 * time.Second):
		h.t.Errorf("Run did not return within 3s of cancel")
	}
}

// next returns the next event, failing the test after eventWait.
func (h *harness) next() vppapi.Event {
	h.t.Helper()
	select {
	case ev := <-h.c.Events():
		return ev
	case <-time.After(eventWait):
		h.t.Fatalf("no connection event within %v (status %+v)", eventWait, h.c.Status())
		return vppapi.Event{}
	}
}

// expect returns the next event, failing the test unless it is of kind k.
func (h *harness) expect(k vppapi.EventKind) vppapi.Event {
	h.t.Helper()
	ev := h.next()
	for ev.Kind == vppapi.InterfaceUp && k != vppapi.InterfaceUp {
		ev = h.next() // an interface set up (SetupUplink's admin up): not what the test waits for
	}
	if ev.Kind != k {
		h.t.Fatalf("event %v (err %v), want %v", ev.Kind, ev.Err, k)
	}
	return ev
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }
func addr(s string) netip.Addr  { return netip.MustParseAddr(s) }

// blockRoutes returns n /26 routes from 10.0.0.0/8 via nh on sw_if_index 1.
func blockRoutes(n int, nh string, table uint32) []vppapi.Route {
	out := make([]vppapi.Route, n)
	for i := range n {
		a := netip.AddrFrom4([4]byte{10, byte(i >> 10), byte(i >> 2), byte(i&3) << 6})
		out[i] = vppapi.Route{Prefix: netip.PrefixFrom(a, 26), NextHop: addr(nh), SwIfIndex: 1, TableID: table}
	}
	return out
}

// vppAPIRoutes returns the API routes of a table of a VPP of either backend as prefix -> "nexthop@swifindex".
func vppAPIRoutes(v *vpptest.VPP, table uint32) map[netip.Prefix]string {
	var rs []vppsim.Route
	for _, r := range v.TableRoutes(table, vppsim.SourceAPI) {
		rs = append(rs, vppsim.Route{Prefix: r.Prefix, Paths: r.Paths})
	}
	return pathStrings(rs)
}

func pathStrings(routes []vppsim.Route) map[netip.Prefix]string {
	out := map[netip.Prefix]string{}
	for _, r := range routes {
		var ps []string
		for _, p := range r.Paths {
			ps = append(ps, fmt.Sprintf("%v@%d", p.NextHop, p.SwIfIndex))
		}
		out[r.Prefix] = strings.Join(ps, ",")
	}
	return out
}

func TestConnect(t *testing.T) {
	v := vpptest.New(t, vpptest.Options{})
	h := start(t, v.Socket(), nil)
	ev := h.expect(vppapi.Connected)
	version := v.Version()
	if ev.PID != v.PID() || ev.Version != version || version == "" || ev.Restarted || ev.Err != nil {
		t.Errorf("Connected event %+v, want pid %d version %q", ev, v.PID(), version)
	}
	st := h.c.Status()
	if !st.Connected || !h.c.Connected() || st.PID != v.PID() || st.Version != version || st.Reconnects != 0 {
		t.Errorf("Status() = %+v", st)
	}
	if got := metricValue(t, h.reg, "vpp_route_agent_vpp_connected"); got != 1 {
		t.Errorf("connected gauge = %v", got)
	}
	h.stop()
	if ev := h.expect(vppapi.Disconnected); ev.Err != nil {
		t.Errorf("Disconnected at stop carries %v", ev.Err)
	}
	if h.c.Connected() {
		t.Error("Connected() after Run returned")
	}
}

// metricValue returns the value of the unlabelled gauge or counter name.
func metricValue(t testing.TB, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name || len(mf.GetMetric()) != 1 {
			continue
		}
		m := mf.GetMetric()[0]
		if m.GetGauge() != nil {
			return m.GetGauge().GetValue()
		}
		return m.GetCounter().GetValue()
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// apiErrors returns vpp_route_agent_vpp_api_errors_total{msg}.
func apiErrors(t testing.TB, reg *prometheus.Registry, msg string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "vpp_route_agent_vpp_api_errors_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "msg" && l.GetValue() == msg {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no api_errors_total series for %s", msg)
	return 0
}

func TestNotConnected(t *testing.T) {
	c, err := vppapi.New(vppapi.Config{Socket: "/nonexistent/api.sock"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	if _, err := c.DumpRoutes(ctx, 0); !errors.Is(err, vppapi.ErrNotConnected) {
		t.Errorf("DumpRoutes: %v", err)
	}
	if err := c.EnsureTable(ctx, 3); !errors.Is(err, vppapi.ErrNotConnected) {
		t.Errorf("EnsureTable: %v", err)
	}
	if _, err := c.SetupUplink(ctx, vppapi.Uplink{Name: uplinkName}); !errors.Is(err, vppapi.ErrNotConnected) {
		t.Errorf("SetupUplink: %v", err)
	}
	res := c.Apply(ctx, blockRoutes(3, "192.0.2.7", 0), blockRoutes(2, "192.0.2.7", 0))
	if len(res.Failed) != 5 || res.Added != 0 || !errors.Is(res.Err(), vppapi.ErrNotConnected) {
		t.Errorf("Apply: %+v", res)
	}
}

func TestApplyAddReplaceDelete(t *testing.T) {
	for _, mode := range []string{"pipelined", "sync"} {
		t.Run(mode, func(t *testing.T) {
			v := vpptest.New(t, vpptest.Options{Uplink: uplinkName})
			h := start(t, v.Socket(), func(c *vppapi.Config) { c.Window = 8 })
			h.expect(vppapi.Connected)
			apply := h.c.Apply
			if mode == "sync" {
				apply = h.c.ApplySync
			}
			ctx := ctxT(t)

			adds := blockRoutes(100, "192.0.2.7", 0)
			adds = append(adds, vppapi.Route{Prefix: pfx("fd00:244::/80"), NextHop: addr("2001:db8::7"), SwIfIndex: 1})
			res := apply(ctx, adds, nil)
			if res.Err() != nil || res.Added != len(adds) {
				t.Fatalf("add: %+v: %v", res, res.Err())
			}
			got := vppAPIRoutes(v, 0)
			if len(got) != len(adds) {
				t.Fatalf("sim has %d API routes, want %d", len(got), len(adds))
			}
			for _, r := range adds {
				if want := fmt.Sprintf("%v@1", r.NextHop); got[r.Prefix] != want {
					t.Errorf("sim route %v = %q, want %q", r.Prefix, got[r.Prefix], want)
				}
			}

			// Replace: same prefixes via another next hop; deletes of some others in the same call.
			repl := blockRoutes(10, "192.0.2.9", 0)
			dels := adds[90:100]
			res = apply(ctx, repl, dels)
			if res.Err() != nil || res.Added != 10 || res.Deleted != 10 {
				t.Fatalf("replace+delete: %+v: %v", res, res.Err())
			}
			got = vppAPIRoutes(v, 0)
			if len(got) != len(adds)-10 {
				t.Errorf("sim has %d API routes after deleting 10, want %d", len(got), len(adds)-10)
			}
			for _, r := range repl {
				if got[r.Prefix] != "192.0.2.9@1" {
					t.Errorf("replaced route %v = %q, want one path via 192.0.2.9", r.Prefix, got[r.Prefix])
				}
			}
			for _, r := range dels {
				if _, ok := got[r.Prefix]; ok {
					t.Errorf("deleted route %v still in the sim", r.Prefix)
				}
			}

			// Deleting what is absent succeeds, as in VPP.
			if res := apply(ctx, nil, dels); res.Err() != nil || res.Deleted != len(dels) {
				t.Errorf("repeated delete: %+v: %v", res, res.Err())
			}

			// DumpRoutes sees the same.
			fib, err := h.c.DumpRoutes(ctx, 0)
			if err != nil {
				t.Fatal(err)
			}
			dumped := map[netip.Prefix][]vppapi.Path{}
			for _, e := range fib {
				dumped[e.Prefix] = e.Paths
			}
			for _, r := range adds[:90] {
				nh := r.NextHop
				if slices.ContainsFunc(repl, func(x vppapi.Route) bool { return x.Prefix == r.Prefix }) {
					nh = addr("192.0.2.9")
				}
				want := []vppapi.Path{{NextHop: nh, SwIfIndex: 1, Type: vppapi.PathNormal}}
				if !slices.Equal(dumped[r.Prefix], want) {
					t.Errorf("dumped %v = %v, want %v", r.Prefix, dumped[r.Prefix], want)
				}
			}
			for _, r := range dels {
				if _, ok := dumped[r.Prefix]; ok {
					t.Errorf("dump still has deleted %v", r.Prefix)
				}
			}
		})
	}
}

func TestApplyFailuresAttributed(t *testing.T) {
	v := vpptest.New(t, vpptest.Options{Uplink: uplinkName})
	h := start(t, v.Socket(), func(c *vppapi.Config) { c.Window = 4 })
	h.expect(vppapi.Connected)
	ctx := ctxT(t)

	good := blockRoutes(20, "192.0.2.7", 0)
	badIf := vppapi.Route{Prefix: pfx("10.200.0.0/26"), NextHop: addr("192.0.2.7"), SwIfIndex: 99}
	noTable := vppapi.Route{Prefix: pfx("10.201.0.0/26"), NextHop: addr("192.0.2.7"), SwIfIndex: 1, TableID: 7}
	invalid := vppapi.Route{NextHop: addr("192.0.2.7"), SwIfIndex: 1}
	adds := slices.Concat(good[:7], []vppapi.Route{badIf}, good[7:13], []vppapi.Route{noTable, invalid}, good[13:])
	dels := []vppapi.Route{{Prefix: pfx("10.202.0.0/26"), TableID: 8}, good[0]}

	res := h.c.Apply(ctx, adds, dels)
	if res.Added != len(good) || res.Deleted != 1 || len(res.Failed) != 4 {
		t.Fatalf("Apply = added %d deleted %d failed %v", res.Added, res.Deleted, res.Failed)
	}
	want := []struct {
		route vppapi.Route
		op    vppapi.Op
		code  api.VPPApiError
	}{
		{badIf, vppapi.OpAdd, api.NO_MATCHING_INTERFACE},
		{noTable, vppapi.OpAdd, api.NO_SUCH_FIB},
		{invalid, vppapi.OpAdd, 0},
		{dels[0], vppapi.OpDelete, api.NO_SUCH_FIB},
	}
	for i, w := range want {
		f := res.Failed[i]
		if f.Route != w.route || f.Op != w.op {
			t.Errorf("failure %d is %v %v, want %v %v", i, f.Op, f.Route, w.op, w.route)
			continue
		}
		var code api.VPPApiError
		if w.code == 0 {
			if errors.As(f, &code) {
				t.Errorf("invalid route failed with VPP error %v; it must not be sent", code)
			}
			continue
		}
		if !errors.As(f, &code) || code != w.code {
			t.Errorf("failure %d: %v, want VPP error %d", i, f, w.code)
		}
	}
	if msg := res.Failed[0].Error(); !strings.HasPrefix(msg, "add 10.200.0.0/26 via 192.0.2.7 sw_if_index 99: ") {
		t.Errorf("error does not say what was attempted: %q", msg)
	}
	if got := apiErrors(t, h.reg, "ip_route_add_del"); got != 3 {
		t.Errorf("api_errors_total{msg=ip_route_add_del} = %v, want 3", got)
	}
	// The good routes went in; the failed ones did not.
	got := vppAPIRoutes(v, 0)
	if len(got) != len(good)-1 {
		t.Errorf("VPP has %d routes, want %d", len(got), len(good)-1)
	}

	// After EnsureTable, table 7 works; EnsureTable is idempotent.
	for range 2 {
		if err := h.c.EnsureTable(ctx, 7); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.c.EnsureTable(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if res := h.c.ApplySync(ctx, []vppapi.Route{noTable}, nil); res.Err() != nil {
		t.Errorf("add in created table: %v", res.Err())
	}
	if got := vppAPIRoutes(v, 7); got[noTable.Prefix] != "192.0.2.7@1" {
		t.Errorf("table 7 = %v", got)
	}
}

// setupUplinkLoopbacks are the interfaces of the uplink tests besides loop0 (sw_if_index 1): loop10 (2)
// and loop1 (3). The uplink's name, loop1, is a substring of the interface before it.
var setupUplinkLoopbacks = []int{10, 1}

func TestSetupUplink(t *testing.T) {
	// The uplink's name is a substring of another interface's: only the exact match may be chosen.
	v := vpptest.New(t, vpptest.Options{Loopbacks: setupUplinkLoopbacks, CountRequests: true})
	h := start(t, v.Socket(), nil)
	h.expect(vppapi.Connected)
	ctx := ctxT(t)
	u := vppapi.Uplink{Name: "loop1", Addresses: []netip.Prefix{pfx("192.0.2.7/24"), pfx("2001:db8::7/64")}}

	idx, err := h.c.SetupUplink(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	if idx != 3 {
		t.Fatalf("SetupUplink returned sw_if_index %d, want 3", idx)
	}
	ifc := v.Interface(3)
	if !ifc.AdminUp || !slices.Equal(ifc.Addresses, u.Addresses) {
		t.Errorf("interface after setup: %+v", ifc)
	}
	for _, i := range []uint32{1, 2} {
		if other := v.Interface(i); other.AdminUp || len(other.Addresses) != 0 {
			t.Errorf("another interface was touched: %+v", other)
		}
	}

	// Idempotent: the second call only reads.
	v.ResetRequests()
	if idx, err := h.c.SetupUplink(ctx, u); err != nil || idx != 3 {
		t.Fatalf("second SetupUplink = %d, %v", idx, err)
	}
	counts := v.RequestCounts()
	for _, w := range []string{"sw_interface_set_flags", "sw_interface_add_del_address"} {
		if n := counts[w]; n != 0 {
			t.Errorf("second SetupUplink sent %d %s", n, w)
		}
	}
	if counts["sw_interface_dump"] == 0 {
		t.Error("second SetupUplink did not even look")
	}

	// By index, adding one more address.
	u2 := vppapi.Uplink{SwIfIndex: 1, HasIndex: true, Addresses: []netip.Prefix{pfx("198.51.100.1/24")}}
	if idx, err := h.c.SetupUplink(ctx, u2); err != nil || idx != 1 {
		t.Fatalf("SetupUplink by index = %d, %v", idx, err)
	}
	if ifc := v.Interface(1); !ifc.AdminUp || !slices.Equal(ifc.Addresses, u2.Addresses) {
		t.Errorf("interface 1 after setup: %+v", ifc)
	}
	// Index and name both given must agree.
	if _, err := h.c.SetupUplink(ctx, vppapi.Uplink{Name: "loop1", SwIfIndex: 1, HasIndex: true}); err == nil {
		t.Error("SetupUplink accepted an index whose name differs")
	}

	// Bad index: -2, as VPP answers a write to it.
	_, err = h.c.SetupUplink(ctx, vppapi.Uplink{SwIfIndex: 42, HasIndex: true})
	if !errors.Is(err, api.INVALID_SW_IF_INDEX) || !errors.Is(err, vppapi.ErrNoInterface) {
		t.Errorf("bad index: %v, want -2", err)
	}
	// Unknown name.
	_, err = h.c.SetupUplink(ctx, vppapi.Uplink{Name: "GigabitEthernet0/9/0"})
	if !errors.Is(err, vppapi.ErrNoInterface) || !strings.Contains(err.Error(), "GigabitEthernet0/9/0") {
		t.Errorf("unknown name: %v", err)
	}
	// local0 cannot take an address: VPP's error comes back, saying what was attempted.
	_, err = h.c.SetupUplink(ctx, vppapi.Uplink{SwIfIndex: 0, HasIndex: true, Addresses: []netip.Prefix{pfx("203.0.113.1/24")}})
	var code api.VPPApiError
	if !errors.As(err, &code) || !strings.Contains(err.Error(), "local0") {
		t.Errorf("address on local0: %v", err)
	}
}

func TestLookupUplinkWritesNothing(t *testing.T) {
	v := vpptest.New(t, vpptest.Options{Loopbacks: setupUplinkLoopbacks, CountRequests: true})
	h := start(t, v.Socket(), nil)
	h.expect(vppapi.Connected)
	ctx := ctxT(t)
	v.ResetRequests()
	idx, err := h.c.LookupUplink(ctx, vppapi.Uplink{Name: "loop1", Addresses: []netip.Prefix{pfx("192.0.2.7/24")}})
	if err != nil || idx != 3 {
		t.Fatalf("LookupUplink = %d, %v; want 3", idx, err)
	}
	counts := v.RequestCounts()
	for _, w := range []string{"sw_interface_set_flags", "sw_interface_add_del_address"} {
		if n := counts[w]; n != 0 {
			t.Errorf("LookupUplink sent %d %s", n, w)
		}
	}
	if ifc := v.Interface(3); ifc.AdminUp || len(ifc.Addresses) != 0 {
		t.Errorf("LookupUplink changed the interface: %+v", ifc)
	}
	if _, err := h.c.LookupUplink(ctx, vppapi.Uplink{Name: "nope0"}); !errors.Is(err, vppapi.ErrNoInterface) {
		t.Errorf("unknown name: %v", err)
	}
}

func TestDumpRoutesAllSources(t *testing.T) {
	v := vpptest.New(t, vpptest.Options{Uplink: uplinkName})
	h := start(t, v.Socket(), nil)
	h.expect(vppapi.Connected)
	ctx := ctxT(t)
	if _, err := h.c.SetupUplink(ctx, vppapi.Uplink{Name: v.Uplink(), Addresses: []netip.Prefix{pfx("172.16.0.1/24")}}); err != nil {
		t.Fatal(err)
	}
	foreign := vppsim.Route{Prefix: pfx("10.99.0.0/16"), Source: vppsim.SourceAPI,
		Paths: []vppsim.Path{{NextHop: addr("172.16.0.254"), SwIfIndex: 1}, {NextHop: addr("172.16.0.253"), SwIfIndex: 1}}}
	v.AddRoute(foreign)
	own := vppapi.Route{Prefix: pfx("10.244.3.0/26"), NextHop: addr("172.16.0.2"), SwIfIndex: 1}
	own6 := vppapi.Route{Prefix: pfx("fd00:244::/80"), NextHop: addr("fe80::2"), SwIfIndex: 1}
	if res := h.c.Apply(ctx, []vppapi.Route{own, own6}, nil); res.Err() != nil {
		t.Fatal(res.Err())
	}

	fib, err := h.c.DumpRoutes(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	got := map[netip.Prefix][]vppapi.Path{}
	for _, e := range fib {
		if e.TableID != 0 {
			t.Errorf("entry of table %d in a dump of table 0", e.TableID)
		}
		if _, dup := got[e.Prefix]; dup {
			t.Errorf("%v dumped twice", e.Prefix)
		}
		got[e.Prefix] = e.Paths
	}
	drop := []vppapi.Path{{SwIfIndex: ^uint32(0), Type: vppapi.PathDrop}}
	want := map[netip.Prefix][]vppapi.Path{
		pfx("0.0.0.0/0"):          drop,
		pfx("224.0.0.0/4"):        drop,
		pfx("255.255.255.255/32"): drop,
		pfx("172.16.0.0/32"):      drop,
		pfx("172.16.0.255/32"):    drop,
		pfx("10.99.0.0/16"): {
			{NextHop: addr("172.16.0.253"), SwIfIndex: 1}, {NextHop: addr("172.16.0.254"), SwIfIndex: 1}},
		own.Prefix:  {{NextHop: own.NextHop, SwIfIndex: 1}},
		own6.Prefix: {{NextHop: own6.NextHop, SwIfIndex: 1}},
	}
	for p, w := range want {
		if !slices.Equal(got[p], w) {
			t.Errorf("dump %v = %v, want %v", p, got[p], w)
		}
	}
	// The connected and local entries of the interface address are there, whatever their path details.
	for _, p := range []string{"172.16.0.0/24", "172.16.0.1/32"} {
		if len(got[pfx(p)]) == 0 {
			t.Errorf("interface route %s missing from the dump", p)
		}
	}
	if ps := got[pfx("172.16.0.1/32")]; len(ps) > 0 && ps[0].Type != vppapi.PathLocal {
		t.Errorf("172.16.0.1/32 = %v, want a local path", ps)
	}
	if all := v.Routes(0); len(fib) != len(all) {
		t.Errorf("dumped %d entries, VPP has %d", len(fib), len(all))
	}

	// A table that does not exist has no routes.
	if fib, err := h.c.DumpRoutes(ctx, 12345); err != nil || len(fib) != 0 {
		t.Errorf("dump of a missing table = %v, %v", fib, err)
	}
}

func TestRestart(t *testing.T) {
	v := vpptest.New(t, vpptest.Options{Uplink: uplinkName})
	h := start(t, v.Socket(), nil)
	first := h.expect(vppapi.Connected)
	if first.PID != v.PID() {
		t.Errorf("Connected pid %d, VPP's %d", first.PID, v.PID())
	}
	ctx := ctxT(t)
	if res := h.c.Apply(ctx, blockRoutes(10, "192.0.2.7", 0), nil); res.Err() != nil {
		t.Fatal(res.Err())
	}

	v.Restart()
	if ev := h.expect(vppapi.Disconnected); ev.Err == nil || ev.PID != first.PID {
		t.Errorf("Disconnected = %+v, want an error and the old pid", ev)
	}
	ev := h.expect(vppapi.Connected)
	if !ev.Restarted || ev.PID != v.PID() || ev.PID == first.PID {
		t.Errorf("Connected after restart = %+v, want Restarted with new pid %d (old %d)", ev, v.PID(), first.PID)
	}
	if st := h.c.Status(); st.Reconnects != 1 || st.PID != v.PID() || st.LastError == "" {
		t.Errorf("Status() = %+v", st)
	}
	if n := len(vppAPIRoutes(v, 0)); n != 0 {
		t.Fatalf("%d API routes after restart, want an empty FIB", n)
	}
	v.WaitUplink(10 * time.Second)
	res := h.c.Apply(ctx, blockRoutes(10, "192.0.2.7", 0), nil)
	if n := len(vppAPIRoutes(v, 0)); res.Err() != nil || n != 10 {
		t.Errorf("Apply after restart: %v, VPP has %d routes", res.Err(), n)
	}
	if got := metricValue(t, h.reg, "vpp_route_agent_vpp_reconnects_total"); got != 1 {
		t.Errorf("reconnects_total = %v", got)
	}
}

func TestNoReplyTimesOut(t *testing.T) {
	sim := startSim(t, "it injects unanswered requests", vppsim.Config{})
	h := start(t, sim.SocketPath(), func(c *vppapi.Config) { c.Window = 16; c.HealthInterval = time.Hour })
	h.expect(vppapi.Connected)
	ctx := ctxT(t)

	sim.SetFaults(vppsim.Faults{NoReply: true})
	routes := blockRoutes(50, "192.0.2.7", 0)
	t0 := time.Now()
	res := h.c.Apply(ctx, routes, nil)
	took := time.Since(t0)
	if took > 4*testReplyTimeout {
		t.Errorf("Apply took %v with VPP not replying; reply timeout is %v", took, testReplyTimeout)
	}
	if len(res.Failed) != len(routes) || res.Added != 0 {
		t.Fatalf("Apply = added %d, %d failed; want all %d failed", res.Added, len(res.Failed), len(routes))
	}
	for i, f := range res.Failed {
		if f.Route != routes[i] || !errors.Is(f, vppapi.ErrTimeout) {
			t.Fatalf("failure %d = %v, want a timeout of %v", i, f, routes[i])
		}
	}
	if got := apiErrors(t, h.reg, "ip_route_add_del"); got != 16 {
		t.Errorf("api_errors_total{ip_route_add_del} = %v, want the 16 sent", got)
	}

	t0 = time.Now()
	if err := h.c.EnsureTable(ctx, 3); !errors.Is(err, vppapi.ErrTimeout) || time.Since(t0) > 3*testReplyTimeout {
		t.Errorf("EnsureTable: %v after %v", err, time.Since(t0))
	}
	if got := apiErrors(t, h.reg, "ip_table_add_del"); got != 1 {
		t.Errorf("api_errors_total{ip_table_add_del} = %v, want 1", got)
	}
	// Pings are still answered under NoReply: VPP is alive, the connection stays.
	if !h.c.Connected() {
		t.Error("disconnected although VPP answers pings")
	}
}

func TestContextDeadlineHonoured(t *testing.T) {
	sim := startSim(t, "it injects slow replies", vppsim.Config{})
	h := start(t, sim.SocketPath(), func(c *vppapi.Config) { c.HealthInterval = time.Hour })
	h.expect(vppapi.Connected)
	sim.SetFaults(vppsim.Faults{ReplyDelay: 2 * testReplyTimeout})
	defer sim.SetFaults(vppsim.Faults{})

	short := testReplyTimeout / 4
	check := func(what string, call func(ctx context.Context) error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), short)
		defer cancel()
		t0 := time.Now()
		err := call(ctx)
		if took := time.Since(t0); !errors.Is(err, context.DeadlineExceeded) || took > short+testReplyTimeout {
			t.Errorf("%s with a %v deadline: %v after %v", what, short, err, took)
		}
	}
	check("DumpRoutes", func(ctx context.Context) error { _, err := h.c.DumpRoutes(ctx, 0); return err })
	check("EnsureTable", func(ctx context.Context) error { return h.c.EnsureTable(ctx, 4) })
	check("SetupUplink", func(ctx context.Context) error {
		_, err := h.c.SetupUplink(ctx, vppapi.Uplink{Name: uplinkName})
		return err
	})
	check("Apply", func(ctx context.Context) error { return h.c.Apply(ctx, blockRoutes(10, "192.0.2.7", 0), nil).Err() })
}

func TestNoPingReplyDisconnects(t *testing.T) {
	sim := startSim(t, "it injects unanswered pings", vppsim.Config{})
	h := start(t, sim.SocketPath(), nil)
	h.expect(vppapi.Connected)
	sim.SetFaults(vppsim.Faults{NoPingReply: true})
	t0 := time.Now()
	ev := h.expect(vppapi.Disconnected)
	if ev.Err == nil || !strings.Contains(ev.Err.Error(), "not responding") {
		t.Errorf("Disconnected.Err = %v", ev.Err)
	}
	t.Logf("stall detected after %v", time.Since(t0))
	if h.c.Connected() {
		t.Error("Connected() true after the disconnect")
	}
	// Calls fail fast while disconnected.
	if _, err := h.c.DumpRoutes(ctxT(t), 0); !errors.Is(err, vppapi.ErrNotConnected) {
		t.Errorf("DumpRoutes while disconnected: %v", err)
	}
	// Once VPP answers again, the client reconnects to the same VPP: not a restart.
	sim.SetFaults(vppsim.Faults{})
	if ev := h.expect(vppapi.Connected); ev.Restarted {
		t.Errorf("reconnect to the same VPP flagged as restart: %+v", ev)
	}
}

func TestHangUpMidApply(t *testing.T) {
	sim := startSim(t, "it injects a hang-up", vppsim.Config{})
	h := start(t, sim.SocketPath(), func(c *vppapi.Config) { c.Window = 8 })
	h.expect(vppapi.Connected)
	ctx := ctxT(t)

	// The fault applies to connections accepted from now on: restart VPP to get one. Its first three
	// messages are the handshake, show_version and control_ping; a health probe may come before Apply.
	sim.SetFaults(vppsim.Faults{HangUpAfter: 23})
	if err := sim.Restart(); err != nil {
		t.Fatal(err)
	}
	h.expect(vppapi.Disconnected)
	h.expect(vppapi.Connected)

	routes := blockRoutes(200, "192.0.2.7", 0)
	t0 := time.Now()
	res := h.c.Apply(ctx, routes, nil)
	sim.SetFaults(vppsim.Faults{})
	if took := time.Since(t0); took > 4*testReplyTimeout {
		t.Errorf("Apply took %v after a hang-up", took)
	}
	// At most 20 requests fit before the hang-up; health probes (every 100 ms) sent between Connected
	// and Apply take some of them, more on a loaded machine, so the lower bound is loose.
	if res.Added > 20 || res.Added < 5 || len(res.Failed) != len(routes)-res.Added {
		t.Fatalf("Apply = added %d failed %d of %d, want 5-20 added before the hang-up", res.Added, len(res.Failed), len(routes))
	}
	for i, f := range res.Failed {
		if f.Route != routes[res.Added+i] {
			t.Fatalf("failure %d is %v, want %v", i, f.Route, routes[res.Added+i])
		}
		if !errors.Is(f, vppapi.ErrNotConnected) && !errors.Is(f, vppapi.ErrTimeout) {
			t.Fatalf("failure %v is neither a lost connection nor a timeout", f)
		}
	}
	h.expect(vppapi.Disconnected)
	if ev := h.expect(vppapi.Connected); ev.Restarted {
		t.Errorf("reconnect after a hang-up flagged as restart")
	}
	if res := h.c.Apply(ctx, routes, nil); res.Err() != nil {
		t.Errorf("Apply after reconnect: %v", res.Err())
	}
}

func TestIncompatible(t *testing.T) {
	sim := startSim(t, "it plays a VPP with other CRCs", vppsim.Config{Version: "21.01-old", CRCOverrides: map[string]string{"ip_route_add_del": "deadbeef"}})
	var logs logging.Buffer
	h := start(t, sim.SocketPath(), func(c *vppapi.Config) { c.Logger = slog.New(slog.NewTextHandler(&logs, nil)) })
	for i := range 2 { // reported, then reported again after the backoff: it keeps retrying
		ev := h.expect(vppapi.Incompatible)
		var ie *vppapi.IncompatibleError
		if !errors.As(ev.Err, &ie) {
			t.Fatalf("Incompatible event %d Err = %v", i, ev.Err)
		}
		if ie.Version != "21.01-old" || ev.Version != "21.01-old" || !slices.Equal(ie.Messages, []string{"ip_route_add_del_b8ecfe0d"}) {
			t.Errorf("IncompatibleError = %+v", ie)
		}
		if msg := ev.Err.Error(); !strings.Contains(msg, "ip_route_add_del_b8ecfe0d") || !strings.Contains(msg, "21.01-old") {
			t.Errorf("error does not name the message and version: %q", msg)
		}
	}
	if h.c.Connected() {
		t.Error("Connected() against an incompatible VPP")
	}
	if st := h.c.Status(); !strings.Contains(st.LastError, "ip_route_add_del") {
		t.Errorf("Status().LastError = %q", st.LastError)
	}
	res := h.c.Apply(ctxT(t), blockRoutes(1, "192.0.2.7", 0), nil)
	if !errors.Is(res.Err(), vppapi.ErrNotConnected) {
		t.Errorf("Apply against an incompatible VPP: %v", res.Err())
	}
	if n := strings.Count(logs.String(), "VPP is incompatible"); n != 1 {
		t.Errorf("the incompatibility was logged %d times over two attempts, want once", n)
	}
}

func TestRunStopsWithoutLeaks(t *testing.T) {
	before := goroutines()
	v := vpptest.New(t, vpptest.Options{Uplink: uplinkName})
	h := start(t, v.Socket(), nil)
	h.expect(vppapi.Connected)
	if res := h.c.Apply(ctxT(t), blockRoutes(100, "192.0.2.7", 0), nil); res.Err() != nil {
		t.Fatal(res.Err())
	}
	if _, err := h.c.DumpRoutes(ctxT(t), 0); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	h.stop()
	if took := time.Since(t0); took > time.Second {
		t.Errorf("Run took %v to stop", took)
	}
	v.Stop()
	// Run also stops while it waits to reconnect to a VPP that is gone.
	h2 := start(t, v.Socket(), nil)
	time.Sleep(100 * time.Millisecond)
	h2.stop()

	deadline := time.Now().Add(3 * time.Second)
	for {
		leaked := leakedGoroutines(before)
		if len(leaked) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("goroutines left after Run returned:\n%s", strings.Join(leaked, "\n\n"))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// goroutines returns the stacks of the running goroutines.
func goroutines() []string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	return strings.Split(string(buf), "\n\n")
}

// leakedGoroutines returns the stacks in vppapi or GoVPP that were not running at before.
func leakedGoroutines(before []string) []string {
	var out []string
	for _, g := range goroutines() {
		if !strings.Contains(g, "go.fd.io/govpp") && !strings.Contains(g, "/vppapi.") {
			continue
		}
		if strings.Contains(g, "leakedGoroutines") {
			continue
		}
		if slices.ContainsFunc(before, func(b string) bool { return firstLine(b) == firstLine(g) }) {
			continue
		}
		out = append(out, g)
	}
	return out
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// TestShuffledMessageIDs runs every call against a VPP whose message ids (from 29 up) and message table
// order differ from the default build's: nothing may depend on an id.
func TestShuffledMessageIDs(t *testing.T) {
	for _, seed := range []int64{1, 42} {
		sim := startSim(t, "it plays a VPP with other message ids", vppsim.Config{MessageOrderSeed: seed})
		h := start(t, sim.SocketPath(), nil)
		h.expect(vppapi.Connected)
		ctx := ctxT(t)
		if _, err := h.c.SetupUplink(ctx, vppapi.Uplink{Name: uplinkName, Addresses: []netip.Prefix{pfx("192.0.2.1/24")}}); err != nil {
			t.Fatalf("seed %d: SetupUplink: %v", seed, err)
		}
		if err := h.c.EnsureTable(ctx, 9); err != nil {
			t.Fatalf("seed %d: EnsureTable: %v", seed, err)
		}
		routes := blockRoutes(300, "192.0.2.7", 9)
		if res := h.c.Apply(ctx, routes, nil); res.Err() != nil || res.Added != len(routes) {
			t.Fatalf("seed %d: Apply: %+v %v", seed, res.Added, res.Err())
		}
		fib, err := h.c.DumpRoutes(ctx, 9)
		if err != nil {
			t.Fatalf("seed %d: DumpRoutes: %v", seed, err)
		}
		if n := len(sim.Routes(9, false)) + len(sim.Routes(9, true)); len(fib) != n || n < len(routes) {
			t.Errorf("seed %d: dumped %d entries, sim has %d", seed, len(fib), n)
		}
	}
}

// TestRestartDuringApply restarts VPP while a large Apply is in flight: Apply must account for every
// route, fail the rest with a connection error, not hang, and work again after the reconnect.
func TestRestartDuringApply(t *testing.T) {
	sim := startSim(t, "it restarts VPP at once in the middle of an Apply; a real VPP takes 2 s to stop", vppsim.Config{})
	h := start(t, sim.SocketPath(), nil)
	h.expect(vppapi.Connected)
	ctx := ctxT(t)
	routes := blockRoutes(20000, "192.0.2.7", 0)

	resc := make(chan vppapi.Result, 1)
	go func() { resc <- h.c.Apply(ctx, routes, nil) }()
	for len(sim.APIRoutes(0)) < 1000 {
		time.Sleep(time.Millisecond)
	}
	if err := sim.Restart(); err != nil {
		t.Fatal(err)
	}
	var res vppapi.Result
	select {
	case res = <-resc:
	case <-time.After(5 * testReplyTimeout):
		t.Fatal("Apply did not return after VPP restarted")
	}
	if res.Added+len(res.Failed) != len(routes) || len(res.Failed) == 0 {
		t.Fatalf("Apply = added %d failed %d of %d", res.Added, len(res.Failed), len(routes))
	}
	for _, f := range res.Failed {
		if !errors.Is(f, vppapi.ErrNotConnected) && !errors.Is(f, vppapi.ErrTimeout) {
			t.Fatalf("failure %v is neither a lost connection nor a timeout", f)
		}
	}
	h.expect(vppapi.Disconnected)
	if ev := h.expect(vppapi.Connected); !ev.Restarted {
		t.Errorf("Connected after restart = %+v", ev)
	}
	if res := h.c.Apply(ctx, routes, nil); res.Err() != nil || len(sim.APIRoutes(0)) != len(routes) {
		t.Errorf("Apply after the restart: %v; sim has %d routes", res.Err(), len(sim.APIRoutes(0)))
	}
}

// TestInterfaceUpEvent: an uplink set admin up (its link up) is reported as InterfaceUp with its index
// (the agent re-creates its BFD sessions that are not up there: VPP's interface down/up defect).
func TestInterfaceUpEvent(t *testing.T) {
	v := vpptest.New(t, vpptest.Options{})
	h := start(t, v.Socket(), nil)
	h.expect(vppapi.Connected)
	idx, err := h.c.SetupUplink(ctxT(t), vppapi.Uplink{Name: v.Uplink(), Addresses: []netip.Prefix{pfx("192.0.2.7/24")}})
	if err != nil {
		t.Fatal(err)
	}
	if ev := h.expect(vppapi.InterfaceUp); ev.SwIfIndex != idx {
		t.Errorf("InterfaceUp for sw_if_index %d, want %d", ev.SwIfIndex, idx)
	}
}

// TestUplinkDeletedAndCreated is VPP 26.06's behaviour when an operator deletes the interface routes go
// through and creates it again (measured; the simulator reproduces it): the client hears of the
// deletion; the routes stay in the dump, through the deleted index, but drop traffic; a route through
// that index is refused; the interface comes back with the same name and index, admin down and without
// addresses; the routes stay dead after it is set up again and re-added unchanged, and only a delete and
// add revives one.
func TestUplinkDeletedAndCreated(t *testing.T) {
	v := vpptest.New(t, vpptest.Options{})
	h := start(t, v.Socket(), nil)
	h.expect(vppapi.Connected)
	ctx := ctxT(t)
	up := vppapi.Uplink{Name: v.Uplink(), Addresses: []netip.Prefix{pfx("192.0.2.7/24")}}
	idx, err := h.c.SetupUplink(ctx, up)
	if err != nil {
		t.Fatal(err)
	}
	routes := []vppapi.Route{
		{Prefix: pfx("10.244.3.0/26"), NextHop: addr("192.0.2.9"), SwIfIndex: idx},
		{Prefix: pfx("10.244.4.0/26"), NextHop: addr("192.0.2.9"), SwIfIndex: idx},
	}
	if res := h.c.Apply(ctx, routes, nil); res.Err() != nil {
		t.Fatal(res.Err())
	}
	if got := v.Unresolved(); len(got) != 0 {
		t.Fatalf("unresolved before the deletion: %v", got)
	}

	v.DeleteUplink()
	if ev := h.expect(vppapi.InterfaceDeleted); ev.SwIfIndex != idx {
		t.Errorf("InterfaceDeleted for sw_if_index %d, want %d", ev.SwIfIndex, idx)
	}
	if _, err := h.c.LookupUplink(ctx, up); !errors.Is(err, vppapi.ErrNoInterface) {
		t.Errorf("LookupUplink of the deleted uplink: %v, want ErrNoInterface", err)
	}
	want := []netip.Prefix{routes[0].Prefix, routes[1].Prefix}
	checkDump := func(when string) {
		t.Helper()
		entries, err := h.c.DumpAPIRoutes(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		var got []netip.Prefix
		for _, e := range entries {
			if len(e.Paths) != 1 || e.Paths[0].SwIfIndex != idx || e.Paths[0].NextHop != addr("192.0.2.9") {
				t.Errorf("%s: %v dumped with paths %+v, want via 192.0.2.9 on sw_if_index %d", when, e.Prefix, e.Paths, idx)
			}
			got = append(got, e.Prefix)
		}
		slices.SortFunc(got, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
		if !slices.Equal(got, want) {
			t.Errorf("%s: API routes %v, want %v", when, got, want)
		}
		if got := v.Unresolved(); !slices.Equal(got, want) {
			t.Errorf("%s: routes dropping traffic %v, want %v", when, got, want)
		}
	}
	checkDump("deleted")
	res := h.c.Apply(ctx, []vppapi.Route{{Prefix: pfx("10.244.5.0/26"), NextHop: addr("192.0.2.9"), SwIfIndex: idx}}, nil)
	if len(res.Failed) != 1 || !errors.Is(res.Failed[0].Err, api.NO_MATCHING_INTERFACE) {
		t.Errorf("a route through the deleted index: %+v, want NO_MATCHING_INTERFACE", res.Failed)
	}

	if again := v.CreateUplink(); again != idx {
		t.Errorf("the uplink came back as sw_if_index %d, want %d (VPP reuses it)", again, idx)
	}
	if ifc := v.Interface(idx); ifc.Name != v.Uplink() || ifc.AdminUp || len(ifc.Addresses) != 0 {
		t.Errorf("the created uplink: %+v, want %s admin down without addresses", ifc, v.Uplink())
	}
	checkDump("created")
	if _, err := h.c.SetupUplink(ctx, up); err != nil {
		t.Fatal(err)
	}
	if res := h.c.Apply(ctx, routes, nil); res.Err() != nil { // identical: a no-op for VPP
		t.Fatal(res.Err())
	}
	checkDump("set up and re-added unchanged")
	// A route added again while a dead one with the same paths is still there shares its dead path
	// list; once no dead route with those paths is left, an add resolves.
	readd := func(rs []vppapi.Route, wantDead []netip.Prefix) {
		t.Helper()
		if res := h.c.Apply(ctx, nil, rs); res.Err() != nil {
			t.Fatal(res.Err())
		}
		if res := h.c.Apply(ctx, rs, nil); res.Err() != nil {
			t.Fatal(res.Err())
		}
		if got := v.Unresolved(); !slices.Equal(got, wantDead) {
			t.Errorf("after deleting and adding %d routes: routes dropping traffic %v, want %v", len(rs), got, wantDead)
		}
	}
	readd(routes[:1], want)
	readd(routes, nil)
}

// TestAPIRouteShadowedByAddress: an interface address of the same prefix as an API route shadows it
// (VPP gleans there): ip_route_v2_dump filtered on the API source leaves the route out, the dump of every
// source shows the interface's entry, and once the address goes the route is back, untouched (measured
// on VPP 26.06).
func TestAPIRouteShadowedByAddress(t *testing.T) {
	v := vpptest.New(t, vpptest.Options{})
	h := start(t, v.Socket(), nil)
	h.expect(vppapi.Connected)
	ctx := ctxT(t)
	idx, err := h.c.SetupUplink(ctx, vppapi.Uplink{Name: v.Uplink(), Addresses: []netip.Prefix{pfx("192.0.2.7/24")}})
	if err != nil {
		t.Fatal(err)
	}
	route := vppapi.Route{Prefix: pfx("10.244.5.0/26"), NextHop: addr("192.0.2.9"), SwIfIndex: idx}
	if res := h.c.Apply(ctx, []vppapi.Route{route}, nil); res.Err() != nil {
		t.Fatal(res.Err())
	}
	sources := func() (api []netip.Prefix, best map[netip.Prefix]vppapi.Source) {
		t.Helper()
		entries, err := h.c.DumpAPIRoutes(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			api = append(api, e.Prefix)
		}
		all, err := h.c.DumpBestRoutes(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		best = map[netip.Prefix]vppapi.Source{}
		for _, e := range all {
			best[e.Prefix] = e.Source
		}
		return api, best
	}
	if api, best := sources(); !slices.Equal(api, []netip.Prefix{route.Prefix}) || best[route.Prefix] != vppapi.SourceAPI {
		t.Fatalf("before the address: API routes %v, source of %v %v", api, route.Prefix, best[route.Prefix])
	}
	v.SetUplinkAddress(pfx("10.244.5.1/26"), true)
	if api, best := sources(); len(api) != 0 || best[route.Prefix] != vppapi.SourceInterface {
		t.Errorf("with the address: API routes %v, source of %v %v; want none and interface", api, route.Prefix, best[route.Prefix])
	}
	v.SetUplinkAddress(pfx("10.244.5.1/26"), false)
	if api, best := sources(); !slices.Equal(api, []netip.Prefix{route.Prefix}) || best[route.Prefix] != vppapi.SourceAPI {
		t.Errorf("after the address: API routes %v, source of %v %v; want the route back", api, route.Prefix, best[route.Prefix])
	}
}

// TestFrozenVPPIsStalled: a request to a frozen VPP (SIGSTOP, the simulator's Frozen fault) times out
// with no other reply meanwhile: the client says at once that VPP is not answering (Status.Stalled,
// vpp_connected 0) rather than after the health probes that end the connection; once VPP thaws it is
// connected and answering again.
func TestFrozenVPPIsStalled(t *testing.T) {
	v := vpptest.New(t, vpptest.Options{})
	h := start(t, v.Socket(), func(c *vppapi.Config) { c.HealthInterval = time.Hour })
	h.expect(vppapi.Connected)
	ctx := ctxT(t)
	if st := h.c.Status(); st.Stalled {
		t.Fatalf("stalled before the freeze: %+v", st)
	}
	v.Freeze()
	if _, err := h.c.DumpAPIRoutes(ctx, 0); !errors.Is(err, vppapi.ErrTimeout) {
		t.Fatalf("dump from a frozen VPP: %v, want ErrTimeout", err)
	}
	if st := h.c.Status(); !st.Connected || !st.Stalled || st.StalledSince.IsZero() {
		t.Errorf("after a request timed out: %+v, want connected and stalled", st)
	}
	if got := metricValue(t, h.reg, "vpp_route_agent_vpp_connected"); got != 0 {
		t.Errorf("vpp_connected = %v while VPP does not answer", got)
	}
	v.Thaw()
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, err := h.c.DumpAPIRoutes(ctx, 0)
		st := h.c.Status()
		if err == nil && st.Connected && !st.Stalled && metricValue(t, h.reg, "vpp_route_agent_vpp_connected") == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not answering again after the thaw: %v, %+v", err, st)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestApplyECMPReplace: a Route with several paths is one ECMP route: an add replaces the prefix's whole
// path set in one request (is_multipath=0), growing and shrinking it, and a dump lists every path, on
// both backends.
func TestApplyECMPReplace(t *testing.T) {
	v := vpptest.New(t, vpptest.Options{Uplink: uplinkName, Loopbacks: []int{1}})
	h := start(t, v.Socket(), nil)
	h.expect(vppapi.Connected)
	ctx := ctxT(t)
	p := pfx("10.244.7.0/26")
	hop := func(nh string, idx uint32) vppapi.Hop { return vppapi.Hop{NextHop: addr(nh), SwIfIndex: idx} }
	steps := []struct {
		hops []vppapi.Hop
		want string
	}{
		{[]vppapi.Hop{hop("192.0.2.8", 2), hop("192.0.2.7", 1)}, "192.0.2.7@1,192.0.2.8@2"},
		{[]vppapi.Hop{hop("192.0.2.7", 1), hop("192.0.2.8", 2), hop("192.0.2.9", 1)}, "192.0.2.7@1,192.0.2.8@2,192.0.2.9@1"},
		{[]vppapi.Hop{hop("192.0.2.9", 1)}, "192.0.2.9@1"},
		{[]vppapi.Hop{hop("192.0.2.9", 1), hop("192.0.2.8", 2)}, "192.0.2.8@2,192.0.2.9@1"},
	}
	for i, s := range steps {
		r := vppapi.NewRoute(p, 0, s.hops)
		if res := h.c.Apply(ctx, []vppapi.Route{r}, nil); res.Err() != nil || res.Added != 1 {
			t.Fatalf("step %d: add %v: %+v: %v", i, r, res, res.Err())
		}
		if got := vppAPIRoutes(v, 0)[p]; got != s.want {
			t.Errorf("step %d: VPP has %v via %q, want %q", i, p, got, s.want)
		}
		fib, err := h.c.DumpAPIRoutes(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range fib {
			if e.Prefix != p {
				continue
			}
			var hops []vppapi.Hop
			for _, path := range e.Paths {
				hops = append(hops, vppapi.Hop{NextHop: path.NextHop, SwIfIndex: path.SwIfIndex})
			}
			if back := vppapi.NewRoute(p, 0, hops); back != r {
				t.Errorf("step %d: the dump reads back as %v, want %v", i, back, r)
			}
		}
	}
	if res := h.c.Apply(ctx, nil, []vppapi.Route{vppapi.NewRoute(p, 0, steps[0].hops)}); res.Err() != nil {
		t.Fatal(res.Err())
	}
	if got, ok := vppAPIRoutes(v, 0)[p]; ok {
		t.Errorf("deleted ECMP route still there via %q", got)
	}
}
