package main

import (
	"cmp"
	"context"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/vppapi"
	"go.fd.io/govpp/adapter/socketclient"
	"go.fd.io/govpp/api"
	"go.fd.io/govpp/binapi/fib_types"
	"go.fd.io/govpp/binapi/ip"
	"go.fd.io/govpp/binapi/ip_types"
	"go.fd.io/govpp/core"
)

// fibLookup asks VPP which FIB entry forwards q in table: ip_route_lookup with exact=0, VPP's own
// longest-prefix match (fib_table_lookup: the longest entry no longer than q that contains it). It
// opens a connection of its own for this one request (vppapi.Client keeps none for one-shot use), and
// gives up after timeout, connection included.
func fibLookup(ctx context.Context, socket string, timeout time.Duration, table uint32, q netip.Prefix) (vppapi.FIBEntry, error) {
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
			return vppapi.FIBEntry{}, fmt.Errorf("connect to VPP at %s: %w", socket, c.err)
		}
		conn = c.conn
	case <-ctx.Done():
		go func() {
			if c := <-done; c.conn != nil {
				c.conn.Disconnect()
			}
		}()
		return vppapi.FIBEntry{}, fmt.Errorf("connect to VPP at %s: %w", socket, ctx.Err())
	}
	defer conn.Disconnect()

	req := &ip.IPRouteLookup{TableID: table, Prefix: apiPrefix(q)}
	reply := new(ip.IPRouteLookupReply)
	if err := conn.Invoke(ctx, req, reply); err != nil {
		return vppapi.FIBEntry{}, fmt.Errorf("ip_route_lookup %s in table %d: %w", q, table, err)
	}
	if err := api.RetvalToVPPApiError(reply.Retval); err != nil {
		return vppapi.FIBEntry{}, fmt.Errorf("ip_route_lookup %s in table %d: %w", q, table, err)
	}
	return fibEntry(reply.Route), nil
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
