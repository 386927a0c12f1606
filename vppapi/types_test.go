package vppapi

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.fd.io/govpp/api"
)

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{"zero is valid", Config{}, ""},
		{"full", Config{Socket: "/run/vpp/api.sock", ReplyTimeout: time.Second, ReconnectDelay: time.Second, Window: 512, HealthInterval: time.Second}, ""},
		{"long socket", Config{Socket: "/" + strings.Repeat("a", 107)}, "longer than"},
		{"negative timeout", Config{ReplyTimeout: -1}, "reply timeout"},
		{"negative delay", Config{ReconnectDelay: -1}, "reconnect delay"},
		{"delay above cap", Config{ReconnectDelay: time.Minute}, "backoff cap"},
		{"negative window", Config{Window: -1}, "window"},
		{"huge window", Config{Window: MaxWindow + 1}, "window"},
		{"negative health", Config{HealthInterval: -time.Second}, "health"},
	}
	for _, tt := range tests {
		err := tt.cfg.Validate()
		if tt.wantErr == "" {
			if err != nil {
				t.Errorf("%s: Validate() = %v", tt.name, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("%s: Validate() = %v, want an error about %q", tt.name, err, tt.wantErr)
		}
	}
	if _, err := New(Config{Window: -3}); err == nil {
		t.Error("New accepted an invalid config")
	}
}

func TestConfigDefaults(t *testing.T) {
	c := Config{}.withDefaults()
	if c.Socket != DefaultSocket || c.ReplyTimeout != DefaultReplyTimeout || c.ReconnectDelay != DefaultReconnectDelay ||
		c.Window != DefaultWindow || c.HealthInterval != DefaultHealthInterval || c.Logger == nil {
		t.Errorf("defaults not applied: %+v", c)
	}
}

func TestNewRegistersMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := New(Config{Registerer: reg}); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]int{}
	for _, mf := range mfs {
		names[mf.GetName()] = len(mf.GetMetric())
	}
	for _, n := range []string{"vpp_route_agent_vpp_connected", "vpp_route_agent_vpp_reconnects_total", "vpp_route_agent_vpp_api_errors_total"} {
		if names[n] == 0 {
			t.Errorf("metric %s not exported (have %v)", n, names)
		}
	}
	if got, want := names["vpp_route_agent_vpp_api_errors_total"], len(requestMessageNames()); got != want {
		t.Errorf("api_errors_total has %d series, want one per request message (%d)", got, want)
	}
	// A second client on the same registry is a configuration error, not a panic.
	if _, err := New(Config{Registerer: reg}); err == nil {
		t.Error("second registration on one registry succeeded")
	}
}

func TestRouteString(t *testing.T) {
	r := Route{Prefix: netip.MustParsePrefix("10.244.3.0/26"), NextHop: netip.MustParseAddr("192.0.2.7"), SwIfIndex: 1}
	if got, want := r.String(), "10.244.3.0/26 via 192.0.2.7 sw_if_index 1"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	r.TableID = 5
	e := RouteError{Route: r, Op: OpAdd, Err: api.NO_MATCHING_INTERFACE}
	if got := e.Error(); !strings.HasPrefix(got, "add 10.244.3.0/26 via 192.0.2.7 sw_if_index 1 table 5: VPPApiError") {
		t.Errorf("RouteError = %q", got)
	}
	e.Op = OpDelete
	if got := e.Error(); !strings.HasPrefix(got, "delete 10.244.3.0/26 table 5: ") {
		t.Errorf("RouteError = %q", got)
	}
	var apiErr api.VPPApiError
	if !errors.As(e, &apiErr) || apiErr != api.NO_MATCHING_INTERFACE {
		t.Errorf("RouteError does not unwrap to the VPPApiError")
	}
}

func TestRouteCanonical(t *testing.T) {
	r, err := Route{Prefix: netip.MustParsePrefix("::ffff:10.244.3.9/122"), NextHop: netip.MustParseAddr("::ffff:192.0.2.7")}.Canonical()
	if err != nil {
		t.Fatal(err)
	}
	if r.Prefix != netip.MustParsePrefix("10.244.3.0/26") || r.NextHop != netip.MustParseAddr("192.0.2.7") {
		t.Errorf("Canonical() = %v", r)
	}
	if _, err := (Route{}).Canonical(); err == nil {
		t.Error("Canonical() of a route without prefix succeeded")
	}
}

func TestPathString(t *testing.T) {
	tests := []struct {
		p    Path
		want string
	}{
		{Path{NextHop: netip.MustParseAddr("192.0.2.7"), SwIfIndex: 1}, "via 192.0.2.7 sw_if_index 1"},
		{Path{SwIfIndex: noInterface, Type: PathDrop}, "drop"},
		{Path{SwIfIndex: 1, Type: PathLocal}, "local sw_if_index 1"},
		{Path{SwIfIndex: noInterface, Type: 42}, "PathType(42)"},
	}
	for _, tt := range tests {
		if got := tt.p.String(); got != tt.want {
			t.Errorf("String() = %q, want %q", got, tt.want)
		}
	}
}

func TestResultErr(t *testing.T) {
	if err := (Result{Added: 3}).Err(); err != nil {
		t.Errorf("Err() of a clean result = %v", err)
	}
	var res Result
	for i := range 25 {
		res.Failed = append(res.Failed, RouteError{
			Route: Route{Prefix: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 0, byte(i), 0}), 24)},
			Op:    OpAdd, Err: api.NO_SUCH_FIB,
		})
	}
	err := res.Err()
	if err == nil {
		t.Fatal("Err() = nil with failures")
	}
	msg := err.Error()
	if !strings.Contains(msg, "25 routes failed") || !strings.Contains(msg, "and 15 more") || strings.Count(msg, "VPPApiError") != maxJoinedErrors {
		t.Errorf("Err() = %q", msg)
	}
	if !errors.Is(err, api.NO_SUCH_FIB) {
		t.Error("Err() does not wrap the route errors")
	}
}

func TestEventKindString(t *testing.T) {
	for k, want := range map[EventKind]string{Connected: "connected", Disconnected: "disconnected", Incompatible: "incompatible", 9: "EventKind(9)"} {
		if got := fmt.Sprint(k); got != want {
			t.Errorf("%d: %q, want %q", int(k), got, want)
		}
	}
}

func TestIncompatibleError(t *testing.T) {
	err := error(&IncompatibleError{Version: "25.10", Messages: []string{"ip_route_add_del_b8ecfe0d"}, Err: &api.CompatibilityError{}})
	if msg := err.Error(); !strings.Contains(msg, "25.10") || !strings.Contains(msg, "ip_route_add_del_b8ecfe0d") {
		t.Errorf("Error() = %q", msg)
	}
	var cerr *api.CompatibilityError
	if !errors.As(err, &cerr) {
		t.Error("does not unwrap to api.CompatibilityError")
	}
}
