// Package vpptest gives tests a VPP to talk to: the simulator (test/vppsim, in process) by default, or a
// real VPP process when VPP_TEST_BACKEND=real (make test-vpp), so that the same tests run against both.
// Tests that need what only the simulator has (fault injection, a message table of another VPP) call
// RequireSim and are skipped against a real VPP.
package vpptest

import (
	"cmp"
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.fd.io/govpp/api"
	"go.fd.io/govpp/binapi/fib_types"
	interfaces "go.fd.io/govpp/binapi/interface"
	"go.fd.io/govpp/binapi/interface_types"
	"go.fd.io/govpp/binapi/ip"
	"go.fd.io/govpp/binapi/ip_types"
	"go.fd.io/govpp/binapi/vpe"

	"github.com/vpp-route-agent/vpp-route-agent/internal/netaddr"
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
	// Loopbacks are more interfaces, sw_if_index 2, 3, ... in order: the loopbacks of these instance
	// numbers, named loop<N> on both backends. New returns once they exist (unless LateUplink).
	Loopbacks []int
	// Deferred makes New return a VPP that is not running yet: its socket path is known, and Start
	// starts it (a client started first finds nothing there).
	Deferred bool
	// CountRequests makes RequestCounts work against a real VPP too (VPP's API trace, on from the start);
	// the simulator always counts.
	CountRequests bool
	// VXLAN gives VPP the vxlan plugin where it can: the simulator's message table has its messages
	// (without VXLAN it has none, as VPP's minimal build), a real VPP loads vxlan_plugin.so when its
	// package has it (the lab build; the minimal one has no plugins). HasVXLAN says which.
	VXLAN bool
}

// VPP is one VPP of a test, simulated or real.
type VPP struct {
	t      testing.TB
	opts   Options
	uplink string
	dir    string
	sim    *vppsim.Sim
	proc   *vppproc.VPP
	sock   string
	vxlan  bool
}

// StartupDelay is how long after a (re)start a real VPP creates its startup-config interfaces.
const StartupDelay = 2 * time.Second

// New starts a VPP of the selected backend for t (or only prepares it, with Deferred); it stops with
// the test. Against a real VPP without one available, the test fails with how to get one.
func New(t testing.TB, opts Options) *VPP {
	t.Helper()
	if opts.Uplink == "" || Real() {
		opts.Uplink = vppproc.Uplink // a real VPP's is always loop0, made by its startup-config
	}
	dir, err := os.MkdirTemp("", "vt")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	v := &VPP{t: t, opts: opts, uplink: opts.Uplink, dir: dir, sock: filepath.Join(dir, "api.sock")}
	if !opts.Deferred {
		v.Start()
	}
	return v
}

// Start starts a VPP made with Deferred.
func (v *VPP) Start() {
	v.t.Helper()
	if v.sim != nil || v.proc != nil {
		v.t.Fatal("vpptest: VPP already started")
	}
	if !Real() {
		cfg := vppsim.Config{Interfaces: v.interfaces(), Version: "26.06-sim", InterfacesOnDemand: v.opts.LateUplink,
			NoVXLAN: !v.opts.VXLAN}
		sim, err := vppsim.New(cfg)
		if err != nil {
			v.t.Fatal(err)
		}
		if err := sim.Listen(v.sock); err != nil {
			v.t.Fatal(err)
		}
		v.t.Cleanup(func() { sim.Close() })
		v.sim = sim
		v.vxlan = v.opts.VXLAN
		return
	}
	bin, err := vppproc.Find()
	if err != nil {
		v.t.Fatal(err)
	}
	setup := []string{"create loopback interface"}
	for _, n := range v.opts.Loopbacks {
		setup = append(setup, fmt.Sprintf("create loopback interface instance %d", n))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var plugins []string
	if v.opts.VXLAN {
		if dir, err := bin.PluginDir(); err == nil {
			if _, err := os.Stat(filepath.Join(dir, vxlanPlugin)); err == nil {
				plugins = []string{vxlanPlugin}
			}
		}
	}
	v.vxlan = len(plugins) > 0
	p, err := vppproc.Start(ctx, bin, vppproc.Options{Dir: v.dir, Setup: setup, APITrace: v.opts.CountRequests, Plugins: plugins})
	if err != nil {
		v.t.Fatal(err)
	}
	v.t.Cleanup(p.Stop)
	v.proc = p
	if p.Socket() != v.sock {
		v.t.Fatalf("vpptest: VPP's socket is %s, not %s", p.Socket(), v.sock)
	}
	if !v.opts.LateUplink {
		for _, name := range v.interfaces() {
			v.waitInterface(name, 10*time.Second)
		}
	}
}

// vxlanPlugin is the file of VPP's vxlan plugin.
const vxlanPlugin = "vxlan_plugin.so"

// HasVXLAN reports whether VPP has the vxlan plugin (Options.VXLAN, and for a real VPP a package that
// has it).
func (v *VPP) HasVXLAN() bool { return v.vxlan }

// interfaces are the names of sw_if_index 1, 2, ...
func (v *VPP) interfaces() []string {
	names := []string{v.uplink}
	for _, n := range v.opts.Loopbacks {
		names = append(names, fmt.Sprintf("loop%d", n))
	}
	return names
}

// Socket returns the binary API socket.
func (v *VPP) Socket() string { return v.sock }

// Uplink returns the uplink's name; its sw_if_index is 1.
func (v *VPP) Uplink() string { return v.uplink }

// Stop stops VPP for good: its socket stays behind, as a real VPP's does, with nobody answering.
func (v *VPP) Stop() {
	v.t.Helper()
	if v.sim != nil {
		v.sim.Close()
		return
	}
	v.proc.Stop()
}

// Freeze makes VPP stop answering anything with its sockets open, as a SIGSTOPped VPP does (a real VPP
// is sent SIGSTOP; the simulator gets the Frozen fault), until Thaw.
func (v *VPP) Freeze() {
	v.t.Helper()
	if v.sim != nil {
		v.sim.SetFaults(vppsim.Faults{Frozen: true})
		return
	}
	if err := v.proc.Signal(syscall.SIGSTOP); err != nil {
		v.t.Fatal(err)
	}
	v.t.Cleanup(func() { _ = v.proc.Signal(syscall.SIGCONT) }) // so that Stop can end it
}

// Thaw ends a Freeze: VPP answers again, what it received meanwhile first.
func (v *VPP) Thaw() {
	v.t.Helper()
	if v.sim != nil {
		v.sim.SetFaults(vppsim.Faults{})
		return
	}
	if err := v.proc.Signal(syscall.SIGCONT); err != nil {
		v.t.Fatal(err)
	}
}

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

// DeleteUplink deletes the uplink as an operator would (a real VPP's loop0 with "delete loopback
// interface intfc loop0"): the routes through it stay in the FIB, dead (see vppsim.Sim.DeleteInterface).
func (v *VPP) DeleteUplink() {
	v.t.Helper()
	if v.sim != nil {
		if err := v.sim.DeleteInterface(v.uplink); err != nil {
			v.t.Fatal(err)
		}
		return
	}
	v.CLI("delete loopback interface intfc " + v.uplink)
}

// CreateUplink creates the uplink again after DeleteUplink, as an operator would ("create loopback
// interface", which reuses the freed loop0 and its sw_if_index): admin down, without addresses. It
// returns its sw_if_index.
func (v *VPP) CreateUplink() uint32 {
	v.t.Helper()
	if v.sim != nil {
		idx, err := v.sim.CreateInterface(v.uplink)
		if err != nil {
			v.t.Fatal(err)
		}
		return idx
	}
	if out := strings.TrimSpace(v.CLI("create loopback interface")); out != v.uplink {
		v.t.Fatalf("vpptest: create loopback interface made %q, not %s", out, v.uplink)
	}
	for _, i := range v.Interfaces() {
		if i.Name == v.uplink {
			return i.SwIfIndex
		}
	}
	v.t.Fatalf("vpptest: %s not in the interfaces after its creation", v.uplink)
	return 0
}

// SetUplinkAddress adds (or with add false removes) address p on the uplink as an operator would
// ("set interface ip address [del] loop0 p"): VPP's interface routes for it shadow an API route of the
// same prefix.
func (v *VPP) SetUplinkAddress(p netip.Prefix, add bool) {
	v.t.Helper()
	if v.sim != nil {
		if err := v.sim.SetAddress(1, p, add); err != nil {
			v.t.Fatal(err)
		}
		return
	}
	del := ""
	if !add {
		del = "del "
	}
	v.CLI(fmt.Sprintf("set interface ip address %s%s %s", del, v.uplink, p))
}

// Unresolved returns, sorted, the API routes of table 0 with a next hop that drop their traffic: an
// interface of their paths was deleted (vppsim.Route.Unresolved; on a real VPP, read from "show ip fib").
func (v *VPP) Unresolved() []netip.Prefix {
	v.t.Helper()
	var out []netip.Prefix
	if v.sim != nil {
		for _, r := range v.sim.APIRoutes(0) {
			if r.Unresolved {
				out = append(out, r.Prefix) // sorted
			}
		}
		return out
	}
	// "show ip fib table 0" prints each entry as an unindented prefix and its forwarding chain under it:
	// a route with a next hop whose chain is a dpo-drop cannot forward through its interface.
	api := map[netip.Prefix]bool{}
	for _, r := range v.Routes(vppsim.SourceAPI) {
		api[r.Prefix] = len(r.Paths) > 0 && r.Paths[0].NextHop.IsValid()
	}
	var cur netip.Prefix
	for _, table := range []string{"ip", "ip6"} {
		for _, l := range strings.Split(v.CLI("show "+table+" fib table 0"), "\n") {
			if p, err := netip.ParsePrefix(strings.TrimSpace(l)); err == nil && !strings.HasPrefix(l, " ") {
				cur = p.Masked()
				continue
			}
			if strings.Contains(l, "dpo-drop") && api[cur] && !slices.Contains(out, cur) {
				out = append(out, cur)
			}
		}
	}
	slices.SortFunc(out, netip.Prefix.Compare)
	return out
}

// WaitUplink waits until the uplink exists and returns when it was first seen.
func (v *VPP) WaitUplink(within time.Duration) time.Time {
	v.t.Helper()
	return v.waitInterface(v.uplink, within)
}

func (v *VPP) waitInterface(name string, within time.Duration) time.Time {
	v.t.Helper()
	deadline := time.Now().Add(within)
	for !slices.ContainsFunc(v.Interfaces(), func(i vppsim.Interface) bool { return i.Name == name }) {
		if time.Now().After(deadline) {
			v.t.Fatalf("interface %s did not appear within %s", name, within)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Now()
}

// Interfaces returns every interface, local0 first, with its admin state and addresses (IPv4 then
// IPv6 on a real VPP, in the order added in the simulator). LinkUp is left out.
func (v *VPP) Interfaces() []vppsim.Interface {
	v.t.Helper()
	if v.sim != nil {
		out := v.sim.Interfaces()
		for i := range out {
			out[i].LinkUp = false
		}
		return out
	}
	var out []vppsim.Interface
	v.with(func(ch api.Channel) error {
		out = out[:0]
		req := ch.SendMultiRequest(&interfaces.SwInterfaceDump{SwIfIndex: ^interface_types.InterfaceIndex(0)})
		for {
			d := new(interfaces.SwInterfaceDetails)
			last, err := req.ReceiveReply(d)
			if err != nil {
				return err
			}
			if last {
				break
			}
			out = append(out, vppsim.Interface{SwIfIndex: uint32(d.SwIfIndex), Name: d.InterfaceName,
				AdminUp: d.Flags&interface_types.IF_STATUS_API_FLAG_ADMIN_UP != 0})
		}
		for i := range out {
			for _, ip6 := range []bool{false, true} {
				req := ch.SendMultiRequest(&ip.IPAddressDump{SwIfIndex: interface_types.InterfaceIndex(out[i].SwIfIndex), IsIPv6: ip6})
				for {
					d := new(ip.IPAddressDetails)
					last, err := req.ReceiveReply(d)
					if err != nil {
						return err
					}
					if last {
						break
					}
					a := netip.AddrFrom4(d.Prefix.Address.Un.GetIP4())
					if d.Prefix.Address.Af == ip_types.ADDRESS_IP6 {
						a = netip.AddrFrom16(d.Prefix.Address.Un.GetIP6())
					}
					out[i].Addresses = append(out[i].Addresses, netip.PrefixFrom(a, int(d.Prefix.Len)))
				}
			}
		}
		return nil
	})
	slices.SortFunc(out, func(a, b vppsim.Interface) int { return cmp.Compare(a.SwIfIndex, b.SwIfIndex) })
	return out
}

// Interface returns the interface of index idx; it fails the test if there is none.
func (v *VPP) Interface(idx uint32) vppsim.Interface {
	v.t.Helper()
	for _, i := range v.Interfaces() {
		if i.SwIfIndex == idx {
			return i
		}
	}
	v.t.Fatalf("vpptest: no interface with sw_if_index %d", idx)
	return vppsim.Interface{}
}

// Version returns the version VPP reports in show_version.
func (v *VPP) Version() string {
	v.t.Helper()
	if v.sim != nil {
		return "26.06-sim"
	}
	var version string
	v.with(func(ch api.Channel) error {
		reply := new(vpe.ShowVersionReply)
		err := ch.SendRequest(&vpe.ShowVersion{}).ReceiveReply(reply)
		version = reply.Version
		return err
	})
	return version
}

// RequestCounts returns how many API messages of each name VPP received (from every client, the
// test's own included) since the start or the last ResetRequests. A real VPP needs
// Options.CountRequests: it counts with its API trace.
func (v *VPP) RequestCounts() map[string]int {
	v.t.Helper()
	if v.sim != nil {
		return v.sim.RequestCounts()
	}
	if !v.opts.CountRequests {
		v.t.Fatal("vpptest: RequestCounts on a real VPP needs Options.CountRequests")
	}
	out := map[string]int{}
	for _, l := range strings.Split(v.CLI("api trace dump"), "\n") {
		if name, ok := strings.CutPrefix(strings.TrimRight(l, "\r"), "vl_api_"); ok && strings.HasSuffix(name, "_t:") {
			out[strings.TrimSuffix(name, "_t:")]++
		}
	}
	return out
}

// CountRequests returns how many API messages with this name VPP received (see RequestCounts).
func (v *VPP) CountRequests(name string) int {
	v.t.Helper()
	return v.RequestCounts()[name]
}

// ResetRequests starts counting requests from zero.
func (v *VPP) ResetRequests() {
	v.t.Helper()
	if v.sim != nil {
		v.sim.ResetRequests()
		return
	}
	v.CLI("api trace free") // also turns the trace off
	v.CLI("api trace on")
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
	v.AddRoute(vppsim.Route{Prefix: prefix, Paths: []vppsim.Path{{NextHop: nh, SwIfIndex: ^uint32(0)}}})
}

// AddRoute adds r to table 0 as another API client would (replacing that prefix's API paths): a
// route the agent did not write, or one it wrote, changed behind its back. A path's Type is "" or
// "drop".
func (v *VPP) AddRoute(r vppsim.Route) {
	v.t.Helper()
	if v.sim != nil {
		if err := v.sim.AddRoute(r); err != nil {
			v.t.Fatal(err)
		}
		return
	}
	route := ip.IPRoute{Prefix: ip_types.Prefix{Address: apiAddress(r.Prefix.Addr()), Len: uint8(r.Prefix.Bits())}}
	proto := fib_types.FIB_API_PATH_NH_PROTO_IP4
	if r.Prefix.Addr().Is6() {
		proto = fib_types.FIB_API_PATH_NH_PROTO_IP6
	}
	for _, p := range r.Paths {
		path := fib_types.FibPath{SwIfIndex: p.SwIfIndex, Weight: 1, Proto: proto}
		switch p.Type {
		case "":
			path.Nh.Address = apiAddress(p.NextHop).Un
		case "drop":
			path.Type, path.SwIfIndex = fib_types.FIB_API_PATH_TYPE_DROP, ^uint32(0)
		default:
			v.t.Fatalf("vpptest: AddRoute: path type %q", p.Type)
		}
		route.Paths = append(route.Paths, path)
	}
	route.NPaths = uint8(len(route.Paths))
	v.with(func(ch api.Channel) error {
		reply := new(ip.IPRouteAddDelReply)
		if err := ch.SendRequest(&ip.IPRouteAddDel{IsAdd: true, Route: route}).ReceiveReply(reply); err != nil {
			return fmt.Errorf("add %v: %w", r.Prefix, err)
		}
		return nil
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
	return v.TableRoutes(0, src)
}

// TableRoutes is Routes for table id table.
func (v *VPP) TableRoutes(table uint32, src vppsim.Source) []Route {
	v.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out []Route
	if v.sim != nil {
		for _, ip6 := range []bool{false, true} {
			for _, r := range v.sim.Routes(table, ip6) {
				if src == 0 || r.Source == src {
					out = append(out, Route{Prefix: r.Prefix, Source: r.Source, Paths: r.Paths})
				}
			}
		}
		return out
	}
	routes, err := v.proc.TableRoutes(ctx, table, uint8(src))
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
		if netaddr.Covers(pool, r.Prefix) && len(r.Paths) > 0 {
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

// Sim returns the simulator, nil against a real VPP: for checks of state the API does not show (a
// route's forwarding), which a real VPP answers through CLI.
func (v *VPP) Sim() *vppsim.Sim { return v.sim }

// viaRE finds the next hops in "show ip fib"'s forwarding section ("ipv4 via 192.0.2.2 loop0: ...",
// "arp-ipv4: via 192.0.2.3 loop0").
var viaRE = regexp.MustCompile(`via ([0-9A-Fa-f.:]+) `)

// ForwardingVia returns the next hops the traffic of table 0's route for p leaves by, sorted, nil when it
// drops: what VPP forwards (BFD-down adjacencies left out), not the configured paths a dump shows. The
// simulator's Forward; a real VPP's "show ip fib p" forwarding section.
func (v *VPP) ForwardingVia(p netip.Prefix) []netip.Addr {
	v.t.Helper()
	var out []netip.Addr
	if v.sim != nil {
		for _, path := range v.sim.Forward(0, p.Addr()) {
			out = append(out, path.NextHop)
		}
	} else {
		cmd := "show ip fib "
		if p.Addr().Is6() {
			cmd = "show ip6 fib "
		}
		fib := v.CLI(cmd + p.String())
		_, fwd, ok := strings.Cut(fib, "forwarding:")
		if !ok {
			v.t.Fatalf("vpptest: show ip fib %v: %s", p, fib)
		}
		for _, m := range viaRE.FindAllStringSubmatch(fwd, -1) {
			if a, err := netip.ParseAddr(m[1]); err == nil {
				out = append(out, a)
			}
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}
