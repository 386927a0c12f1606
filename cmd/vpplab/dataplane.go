package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"

	"go.fd.io/govpp/api"
	"go.fd.io/govpp/binapi/interface_types"
	"go.fd.io/govpp/binapi/ip_types"
	"go.fd.io/govpp/binapi/ipip"

	"github.com/vpp-route-agent/vpp-route-agent/internal/vppproc"
	"github.com/vpp-route-agent/vpp-route-agent/internal/vpptopo"
	"github.com/vpp-route-agent/vpp-route-agent/test/vppsim"
)

// dataplane is a lab node's VPP: the simulator (the default) or a real VPP process (--vpp).
type dataplane interface {
	socket() string
	uplink() string
	pid() uint32
	// restart restarts VPP: a new pid and an empty FIB.
	restart(ctx context.Context) error
	// apiRoutes returns the API routes of table 0.
	apiRoutes(ctx context.Context) ([]vppproc.Route, error)
	// ipipTunnels returns the IPIP tunnels' destinations by sw_if_index.
	ipipTunnels(ctx context.Context) (map[uint32]netip.Addr, error)
	// ctl is the vppctl command line for the node, "" for the simulator.
	ctl() string
	close()
}

var (
	_ dataplane = (*simPlane)(nil)
	_ dataplane = (*realPlane)(nil)
	_ dataplane = (*topoPlane)(nil)
)

// simUplink is the uplink of a simulated node.
const simUplink = "GigabitEthernet0/8/0"

type simPlane struct {
	sim  *vppsim.Sim
	sock string
}

func newSimPlane(dir string, i int) (*simPlane, error) {
	sock := filepath.Join(dir, fmt.Sprintf("vpp-%d.sock", i))
	if len(sock) > 100 {
		return nil, fmt.Errorf("--data-dir %s is too long for a unix socket path", dir)
	}
	sim, err := vppsim.New(vppsim.Config{Interfaces: []string{simUplink}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return nil, err
	}
	if err := sim.Listen(sock); err != nil {
		return nil, err
	}
	return &simPlane{sim: sim, sock: sock}, nil
}

func (p *simPlane) socket() string                { return p.sock }
func (p *simPlane) uplink() string                { return simUplink }
func (p *simPlane) pid() uint32                   { return p.sim.PID() }
func (p *simPlane) restart(context.Context) error { return p.sim.Restart() }
func (p *simPlane) ctl() string                   { return "" }
func (p *simPlane) close()                        { p.sim.Close() }
func (p *simPlane) apiRoutes(context.Context) ([]vppproc.Route, error) {
	var out []vppproc.Route
	for _, r := range p.sim.APIRoutes(0) {
		vr := vppproc.Route{Prefix: r.Prefix, Source: vppproc.SourceAPI}
		for _, path := range r.Paths {
			vr.Paths = append(vr.Paths, vppproc.Path{NextHop: path.NextHop, SwIfIndex: path.SwIfIndex})
		}
		out = append(out, vr)
	}
	return out, nil
}

func (p *simPlane) ipipTunnels(context.Context) (map[uint32]netip.Addr, error) {
	out := map[uint32]netip.Addr{}
	for _, t := range p.sim.Tunnels() {
		out[t.SwIfIndex] = t.Dst
	}
	return out, nil
}

// realPlane is a real VPP in its own run directory; its uplink loop0 is created by startup-config, 2 s
// after VPP starts, as on a real node.
type realPlane struct{ vpp *vppproc.VPP }

func newRealPlane(ctx context.Context, bin vppproc.Binaries, dir string, i int) (*realPlane, error) {
	run := filepath.Join(dir, fmt.Sprintf("vpp-%d", i))
	v, err := vppproc.Start(ctx, bin, vppproc.Options{Dir: run})
	if err != nil {
		return nil, fmt.Errorf("start VPP %d: %w", i, err)
	}
	return &realPlane{vpp: v}, nil
}

func (p *realPlane) socket() string { return p.vpp.Socket() }
func (p *realPlane) uplink() string { return vppproc.Uplink }
func (p *realPlane) pid() uint32    { return uint32(p.vpp.PID()) }
func (p *realPlane) ctl() string    { return p.vpp.CtlCommand() }
func (p *realPlane) close()         { p.vpp.Stop() }
func (p *realPlane) restart(ctx context.Context) error {
	return p.vpp.Restart(ctx)
}
func (p *realPlane) apiRoutes(ctx context.Context) ([]vppproc.Route, error) {
	return p.vpp.Routes(ctx, vppproc.SourceAPI)
}
func (p *realPlane) ipipTunnels(ctx context.Context) (map[uint32]netip.Addr, error) {
	return dumpIPIP(ctx, p.vpp)
}

// topoPlane is a node VPP of the wired lab's memif topology (vpptopo): its uplink is the memif towards
// the router, its pods' addresses go on vpptopo.PodInterface. The topology stops it.
type topoPlane struct{ node *vpptopo.Node }

func (p *topoPlane) socket() string { return p.node.VPP.Socket() }
func (p *topoPlane) uplink() string { return vpptopo.UplinkInterface }
func (p *topoPlane) pid() uint32    { return uint32(p.node.VPP.PID()) }
func (p *topoPlane) ctl() string    { return p.node.VPP.CtlCommand() }
func (p *topoPlane) close()         {}
func (p *topoPlane) restart(ctx context.Context) error {
	return p.node.VPP.Restart(ctx)
}
func (p *topoPlane) apiRoutes(ctx context.Context) ([]vppproc.Route, error) {
	return p.node.VPP.Routes(ctx, vppproc.SourceAPI)
}
func (p *topoPlane) ipipTunnels(ctx context.Context) (map[uint32]netip.Addr, error) {
	return dumpIPIP(ctx, p.node.VPP)
}

// dumpIPIP returns v's IPIP tunnels' destinations by sw_if_index.
func dumpIPIP(ctx context.Context, v *vppproc.VPP) (map[uint32]netip.Addr, error) {
	out := map[uint32]netip.Addr{}
	err := v.Call(ctx, func(ch api.Channel) error {
		req := ch.SendMultiRequest(&ipip.IpipTunnelDump{SwIfIndex: ^interface_types.InterfaceIndex(0)})
		for {
			d := new(ipip.IpipTunnelDetails)
			last, err := req.ReceiveReply(d)
			if err != nil || last {
				return err
			}
			if d.Tunnel.Dst.Af == ip_types.ADDRESS_IP4 {
				out[uint32(d.Tunnel.SwIfIndex)] = netip.AddrFrom4(d.Tunnel.Dst.Un.GetIP4())
			} else {
				out[uint32(d.Tunnel.SwIfIndex)] = netip.AddrFrom16(d.Tunnel.Dst.Un.GetIP6())
			}
		}
	})
	return out, err
}
