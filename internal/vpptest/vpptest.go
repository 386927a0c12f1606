// Package vpptest gives tests a VPP to talk to: the simulator (test/vppsim, in process) by default, or a
// real VPP process when VPP_TEST_BACKEND=real (make test-vpp), so that the same tests run against both.
// Tests that need what only the simulator has (fault injection, a message table of another VPP) call
// RequireSim and are skipped against a real VPP.
package vpptest

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"testing"
	"time"

	"go.fd.io/govpp/api"
	"go.fd.io/govpp/binapi/fib_types"
	interfaces "go.fd.io/govpp/binapi/interface"
	"go.fd.io/govpp/binapi/interface_types"
	"go.fd.io/govpp/binapi/ip"
	"go.fd.io/govpp/binapi/ip_types"

	"github.com/vpp-route-agent/vpp-route-agent/internal/vppproc"
	"github.com/vpp-route-agent/vpp-route-agent/test/vppsim"
)

// EnvBackend selects the backend: "sim" (the default) or "real".
const EnvBackend = "VPP_TEST_BACKEND"

// Real reports whether the tests run against real VPP processes.
func Real() bool { return os.Getenv(EnvBackend) == "real" }

// RequireSim skips the test against a real VPP: it needs something only the simulator has.
func RequireSim(t testing.TB, why string) {
	t.Helper()
	if Real() {
		t.Skipf("needs the simulator (%s); %s=real", why, EnvBackend)
	}
}

// Options configure a VPP for a test.
type Options struct {
	// Uplink is the simulator's uplink name (sw_if_index 1); a real VPP's is always loop0, made by its
	// startup-config. Default vppproc.Uplink.
	Uplink string
	// LateUplink makes the uplink missing after every (re)start, as a real VPP's is until its
	// startup-config creates it 2 s later. The simulator's appears only when the test calls
	// ReleaseUplink (UplinkGated), so that the wait for it is seen for sure. Without LateUplink, New
	// returns once the uplink exists.
	LateUplink bool
}

// VPP is one VPP of a test, simulated or real.
type VPP struct {
	t      testing.TB
	uplink string
	sim    *vppsim.Sim
	proc   *vppproc.VPP
	sock   string
}

// StartupDelay is how long after a (re)start a real VPP creates its startup-config interfaces.
const StartupDelay = 2 * time.Second

// New starts a VPP of the selected backend for t; it stops with the test. Against a real VPP without one
// available, the test fails with how to get one.
func New(t testing.TB, opts Options) *VPP {
	t.Helper()
	if opts.Uplink == "" {
		opts.Uplink = vppproc.Uplink
	}
	dir, err := os.MkdirTemp("", "vt")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	v := &VPP{t: t, uplink: opts.Uplink}
	if !Real() {
		cfg := vppsim.Config{Interfaces: []string{opts.Uplink}, Version: "26.06-sim"}
		cfg.InterfacesOnDemand = opts.LateUplink
		sim, err := vppsim.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		v.sock = dir + "/api.sock"
		if err := sim.Listen(v.sock); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sim.Close() })
		v.sim = sim
		return v
	}
	v.uplink = vppproc.Uplink
	bin, err := vppproc.Find()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := vppproc.Start(ctx, bin, vppproc.Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	v.proc, v.sock = p, p.Socket()
	if !opts.LateUplink {
		v.WaitUplink(10 * time.Second)
	}
	return v
}

// Stop stops VPP before the test ends (it stops with the test anyway); a no-op when already stopped.
func (v *VPP) Stop() {
	if v.sim != nil {
		v.sim.Close()
		return
	}
	v.proc.Stop()
}

// Socket returns the binary API socket.
func (v *VPP) Socket() string { return v.sock }

// Uplink returns the uplink's name; its sw_if_index is 1.
func (v *VPP) Uplink() string { return v.uplink }

// PID returns VPP's pid as control_ping reports it.
func (v *VPP) PID() uint32 {
	if v.sim != nil {
		return v.sim.PID()
	}
	return uint32(v.proc.PID())
}

// Restart restarts VPP: new pid, empty FIB. A real VPP's uplink is missing again for 2 s, the
// simulator's only with LateUplink, until ReleaseUplink.
func (v *VPP) Restart() {
	v.t.Helper()
	if v.sim != nil {
		if err := v.sim.Restart(); err != nil {
			v.t.Fatal(err)
		}
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := v.proc.Restart(ctx); err != nil {
		v.t.Fatal(err)
	}
}

// UplinkGated reports whether the test decides when a late uplink appears (ReleaseUplink): true for the
// simulator; a real VPP creates it from its startup-config 2 s after every (re)start, so a client may
// connect before or after it exists.
func (v *VPP) UplinkGated() bool { return v.sim != nil }

// ReleaseUplink makes a late uplink (Options.LateUplink) appear now in the simulator; a real VPP's
// appears by itself (StartupDelay), so there it does nothing.
func (v *VPP) ReleaseUplink() {
	v.t.Helper()
	if v.sim != nil {
		if err := v.sim.CreateInterfaces(); err != nil {
			v.t.Fatal(err)
		}
	}
}

// HasUplink reports whether the uplink exists now.
func (v *VPP) HasUplink() bool {
	v.t.Helper()
	if v.sim != nil {
		return slices.ContainsFunc(v.sim.Interfaces(), func(i vppsim.Interface) bool { return i.Name == v.uplink })
	}
	found := false
	v.with(func(ch api.Channel) error {
		req := ch.SendMultiRequest(&interfaces.SwInterfaceDump{SwIfIndex: ^interface_types.InterfaceIndex(0),
			NameFilterValid: true, NameFilter: v.uplink})
		for {
			d := new(interfaces.SwInterfaceDetails)
			last, err := req.ReceiveReply(d)
			if err != nil || last {
				return err
			}
			found = found || d.InterfaceName == v.uplink
		}
	})
	return found
}

// WaitUplink waits until the uplink exists and returns when it was first seen.
func (v *VPP) WaitUplink(within time.Duration) time.Time {
	v.t.Helper()
	deadline := time.Now().Add(within)
	for !v.HasUplink() {
		if time.Now().After(deadline) {
			v.t.Fatalf("uplink %s did not appear within %s", v.uplink, within)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Now()
}

// CLI runs a vppctl command against a real VPP; it fails the test against the simulator.
func (v *VPP) CLI(command string) string {
	v.t.Helper()
	if v.proc == nil {
		v.t.Fatal("vpptest: CLI needs a real VPP")
	}
	out, err := v.proc.CLI(context.Background(), command)
	if err != nil {
		v.t.Fatal(err)
	}
	return out
}

// AddRecursiveRoute adds, as another API client, prefix via nh resolved through the FIB: VPP then adds a
// recursive-resolution /32 (/128) for nh, dumped with the paths of nh's cover.
func (v *VPP) AddRecursiveRoute(prefix netip.Prefix, nh netip.Addr) {
	v.t.Helper()
	if v.sim != nil {
		if err := v.sim.AddRoute(vppsim.Route{Prefix: prefix, Paths: []vppsim.Path{{NextHop: nh, SwIfIndex: ^uint32(0)}}}); err != nil {
			v.t.Fatal(err)
		}
		return
	}
	path := fib_types.FibPath{SwIfIndex: ^uint32(0), Weight: 1, Proto: fib_types.FIB_API_PATH_NH_PROTO_IP4}
	if nh.Is6() {
		path.Proto = fib_types.FIB_API_PATH_NH_PROTO_IP6
	}
	path.Nh.Address = apiAddress(nh).Un
	req := &ip.IPRouteAddDel{IsAdd: true, Route: ip.IPRoute{Prefix: ip_types.Prefix{Address: apiAddress(prefix.Addr()),
		Len: uint8(prefix.Bits())}, NPaths: 1, Paths: []fib_types.FibPath{path}}}
	v.with(func(ch api.Channel) error {
		reply := new(ip.IPRouteAddDelReply)
		return ch.SendRequest(req).ReceiveReply(reply)
	})
}

// ResolveNeighbor makes VPP resolve neighbour addr on the uplink, as ARP/ND would: an adjacency /32
// (/128) "addr via addr" appears.
func (v *VPP) ResolveNeighbor(addr netip.Addr) {
	v.t.Helper()
	if v.sim != nil {
		if err := v.sim.ResolveNeighbor(1, addr); err != nil {
			v.t.Fatal(err)
		}
		return
	}
	v.CLI(fmt.Sprintf("set ip neighbor %s %s 02:00:00:00:00:42", v.uplink, addr))
}

// Route is one route of a table as VPP reports it for a source.
type Route struct {
	Prefix netip.Prefix // masked
	Source vppsim.Source
	Paths  []vppsim.Path
}

// Routes dumps table 0 (IPv4 then IPv6) for source src (0: every entry, with its best source), with
// ip_route_v2_dump over a connection of its own.
func (v *VPP) Routes(src vppsim.Source) []Route {
	v.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out []Route
	if v.sim != nil {
		for _, ip6 := range []bool{false, true} {
			for _, r := range v.sim.Routes(0, ip6) {
				if src == 0 || r.Source == src {
					out = append(out, Route{Prefix: r.Prefix, Source: r.Source, Paths: r.Paths})
				}
			}
		}
		if src == vppsim.SourceAPI { // shadowed API routes too, as ip_route_v2_dump returns them
			out = out[:0]
			for _, r := range v.sim.APIRoutes(0) {
				out = append(out, Route{Prefix: r.Prefix, Source: r.Source, Paths: r.Paths})
			}
		}
		return out
	}
	routes, err := v.proc.Routes(ctx, uint8(src))
	if err != nil {
		v.t.Fatalf("vpptest: %v", err)
	}
	for _, r := range routes {
		vr := Route{Prefix: r.Prefix, Source: vppsim.Source(r.Source)}
		for _, p := range r.Paths {
			vr.Paths = append(vr.Paths, vppsim.Path{NextHop: p.NextHop, SwIfIndex: p.SwIfIndex})
		}
		out = append(out, vr)
	}
	return out
}

// APIRoutes returns the API routes of table 0 inside pool, as prefix -> next hop of the first path.
func (v *VPP) APIRoutes(pool netip.Prefix) map[netip.Prefix]netip.Addr {
	v.t.Helper()
	out := map[netip.Prefix]netip.Addr{}
	for _, r := range v.Routes(vppsim.SourceAPI) {
		if pool.Bits() <= r.Prefix.Bits() && pool.Contains(r.Prefix.Addr()) && len(r.Paths) > 0 {
			out[r.Prefix] = r.Paths[0].NextHop
		}
	}
	return out
}

// with runs f on a fresh GoVPP channel to the real VPP.
func (v *VPP) with(f func(api.Channel) error) {
	v.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := v.proc.Call(ctx, f); err != nil {
		v.t.Fatalf("vpptest: %v", err)
	}
}

// apiAddress converts an address for VPP.
func apiAddress(a netip.Addr) ip_types.Address {
	if a.Is4() {
		return ip_types.Address{Af: ip_types.ADDRESS_IP4, Un: ip_types.AddressUnionIP4(a.As4())}
	}
	return ip_types.Address{Af: ip_types.ADDRESS_IP6, Un: ip_types.AddressUnionIP6(a.As16())}
}
