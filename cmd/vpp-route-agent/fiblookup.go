package main

import (
	"cmp"
	"context"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/agent"
	"github.com/vpp-route-agent/vpp-route-agent/vppapi"
	"go.fd.io/govpp/adapter/socketclient"
	"go.fd.io/govpp/api"
	"go.fd.io/govpp/binapi/fib_types"
	interfaces "go.fd.io/govpp/binapi/interface"
	"go.fd.io/govpp/binapi/interface_types"
	"go.fd.io/govpp/binapi/ip"
	"go.fd.io/govpp/binapi/ip_types"
	"go.fd.io/govpp/binapi/ipip"
	"go.fd.io/govpp/binapi/memclnt"
	"go.fd.io/govpp/binapi/vxlan"
	"go.fd.io/govpp/core"
)

// fibLookup asks VPP which FIB entry forwards q in table: ip_route_lookup with exact=0, VPP's own
// longest-prefix match (fib_table_lookup: the longest entry no longer than q that contains it); and
// which tunnels it has (IPIP, and VXLAN when the plugin is loaded, with their interfaces' tags), to
// tell the agent's tunnelled routes from others. It opens a connection of its own for these requests
// (vppapi.Client keeps none for one-shot use), and gives up after timeout, connection included.
func fibLookup(ctx context.Context, socket string, timeout time.Duration, table uint32, q netip.Prefix) (vppapi.FIBEntry, agent.Tunnels, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	adapter := socketclient.NewVppClient(socket)
	adapter.SetClientName("vpp-route-agent-explain")
	adapter.SetConnectTimeout(timeout)
	type connected struct {
		conn *core.Connection
		err  error
	}
	// core.Connect takes no context: it runs in a goroutine whose result is awaited until ctx ends, and
	// a connection that arrives after that is closed by the goroutine itself.
	done := make(chan connected, 1)
	go func() {
		conn, err := core.Connect(adapter)
		done <- connected{conn, err}
	}()
	var conn *core.Connection
	select {
	case c := <-done:
		if c.err != nil {
			return vppapi.FIBEntry{}, nil, fmt.Errorf("connect to VPP at %s: %w", socket, c.err)
		}
		conn = c.conn
	case <-ctx.Done():
		go func() {
			if c := <-done; c.conn != nil {
				c.conn.Disconnect()
			}
		}()
		return vppapi.FIBEntry{}, nil, fmt.Errorf("connect to VPP at %s: %w", socket, ctx.Err())
	}
	defer conn.Disconnect()

	req := &ip.IPRouteLookup{TableID: table, Prefix: apiPrefix(q)}
	reply := new(ip.IPRouteLookupReply)
	if err := conn.Invoke(ctx, req, reply); err != nil {
		return vppapi.FIBEntry{}, nil, fmt.Errorf("ip_route_lookup %s in table %d: %w", q, table, err)
	}
	if err := api.RetvalToVPPApiError(reply.Retval); err != nil {
		return vppapi.FIBEntry{}, nil, fmt.Errorf("ip_route_lookup %s in table %d: %w", q, table, err)
	}
	tunnels, err := dumpTunnels(ctx, conn)
	if err != nil {
		return vppapi.FIBEntry{}, nil, err
	}
	return fibEntry(reply.Route), tunnels, nil
}

// dumpTunnels reads VPP's IPIP tunnels, its VXLAN tunnels if the vxlan plugin is loaded, and the tags
// of their interfaces (sw_interface_dump: the tunnel dumps have none).
func dumpTunnels(ctx context.Context, conn *core.Connection) (agent.Tunnels, error) {
	var ipips []vppapi.IPIPTunnel
	err := dump(ctx, conn, &ipip.IpipTunnelDump{SwIfIndex: ^interface_types.InterfaceIndex(0)}, func(m api.Message) {
		if d, ok := m.(*ipip.IpipTunnelDetails); ok {
			ipips = append(ipips, vppapi.IPIPTunnel{SwIfIndex: uint32(d.Tunnel.SwIfIndex), Instance: d.Tunnel.Instance,
				Src: addrOf(d.Tunnel.Src), Dst: addrOf(d.Tunnel.Dst), TableID: d.Tunnel.TableID, Mode: vppapi.TunnelMode(d.Tunnel.Mode)})
		}
	})
	if err != nil {
		return nil, fmt.Errorf("dump IPIP tunnels: %w", err)
	}
	var vxlans []vppapi.VXLANTunnel
	if hasVXLAN(conn) {
		err := dump(ctx, conn, &vxlan.VxlanTunnelV2Dump{SwIfIndex: ^interface_types.InterfaceIndex(0)}, func(m api.Message) {
			if d, ok := m.(*vxlan.VxlanTunnelV2Details); ok {
				vxlans = append(vxlans, vppapi.VXLANTunnel{SwIfIndex: uint32(d.SwIfIndex), Instance: d.Instance,
					Src: addrOf(d.SrcAddress), Dst: addrOf(d.DstAddress), VNI: d.Vni, TableID: d.EncapVrfID})
			}
		})
		if err != nil {
			return nil, fmt.Errorf("dump VXLAN tunnels: %w", err)
		}
	}
	tags := map[uint32]string{}
	if len(ipips)+len(vxlans) > 0 {
		err := dump(ctx, conn, &interfaces.SwInterfaceDump{SwIfIndex: ^interface_types.InterfaceIndex(0)}, func(m api.Message) {
			if d, ok := m.(*interfaces.SwInterfaceDetails); ok {
				tags[uint32(d.SwIfIndex)] = d.Tag
			}
		})
		if err != nil {
			return nil, fmt.Errorf("dump interfaces: %w", err)
		}
	}
	for i := range ipips {
		ipips[i].Tag = tags[ipips[i].SwIfIndex]
	}
	for i := range vxlans {
		vxlans[i].Tag = tags[vxlans[i].SwIfIndex]
	}
	ts := agent.Tunnels{}
	ts.AddIPIP(ipips)
	ts.AddVXLAN(vxlans)
	return ts, nil
}

// hasVXLAN reports whether VPP knows the VXLAN dump's messages (the vxlan plugin is loaded).
func hasVXLAN(conn *core.Connection) bool {
	ch, err := conn.NewAPIChannel()
	if err != nil {
		return false
	}
	defer ch.Close()
	return ch.CheckCompatiblity((*vxlan.VxlanTunnelV2Dump)(nil), (*vxlan.VxlanTunnelV2Details)(nil)) == nil
}

// dump sends req and a control ping on a stream of conn and hands each reply before the ping's to each.
func dump(ctx context.Context, conn *core.Connection, req api.Message, each func(api.Message)) error {
	s, err := conn.NewStream(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = s.Close() }()
	if err := s.SendMsg(req); err != nil {
		return err
	}
	if err := s.SendMsg(&memclnt.ControlPing{}); err != nil {
		return err
	}
	for {
		m, err := s.RecvMsg()
		if err != nil {
			return err
		}
		if _, done := m.(*memclnt.ControlPingReply); done {
			return nil
		}
		each(m)
	}
}

func apiAddr(a netip.Addr) ip_types.Address {
	if a.Is4() {
		return ip_types.Address{Af: ip_types.ADDRESS_IP4, Un: ip_types.AddressUnionIP4(a.As4())}
	}
	return ip_types.Address{Af: ip_types.ADDRESS_IP6, Un: ip_types.AddressUnionIP6(a.As16())}
}

func apiPrefix(p netip.Prefix) ip_types.Prefix {
	return ip_types.Prefix{Address: apiAddr(p.Addr()), Len: uint8(p.Bits())}
}

func addrOf(a ip_types.Address) netip.Addr {
	if a.Af == ip_types.ADDRESS_IP6 {
		return netip.AddrFrom16(a.Un.GetIP6())
	}
	return netip.AddrFrom4(a.Un.GetIP4())
}

// fibEntry converts a route of a reply the way vppapi normalises a dump: the prefix masked, the paths
// sorted, a zero next hop as none.
func fibEntry(r ip.IPRoute) vppapi.FIBEntry {
	a := addrOf(r.Prefix.Address)
	e := vppapi.FIBEntry{TableID: r.TableID, Prefix: netip.PrefixFrom(a, min(int(r.Prefix.Len), a.BitLen())).Masked()}
	for i, p := range r.Paths {
		if i >= int(r.NPaths) {
			break
		}
		var nh netip.Addr
		if p.Proto == fib_types.FIB_API_PATH_NH_PROTO_IP6 {
			nh = netip.AddrFrom16(p.Nh.Address.GetIP6())
		} else {
			nh = netip.AddrFrom4(p.Nh.Address.GetIP4())
		}
		if nh.IsUnspecified() {
			nh = netip.Addr{}
		}
		e.Paths = append(e.Paths, vppapi.Path{NextHop: nh, SwIfIndex: p.SwIfIndex, Type: vppapi.PathType(p.Type)})
	}
	slices.SortFunc(e.Paths, func(x, y vppapi.Path) int {
		if x.Type != y.Type {
			return cmp.Compare(x.Type, y.Type)
		}
		if c := x.NextHop.Compare(y.NextHop); c != 0 {
			return c
		}
		return cmp.Compare(x.SwIfIndex, y.SwIfIndex)
	})
	return e
}
