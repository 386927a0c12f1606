package main

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/agent"
	"github.com/vpp-route-agent/vpp-route-agent/vppapi"
)

// fibLookup asks this node's VPP which FIB entry forwards q in table (vppapi.Client.LookupRoute: VPP's
// own longest-prefix match) and which tunnels it has (IPIP, and VXLAN when the plugin is loaded, with
// their tags), to tell the agent's tunnelled routes from others. It uses the agent's client, with a
// connection of its own for these requests, and gives up after timeout, connection included.
func fibLookup(ctx context.Context, socket string, timeout time.Duration, table uint32, q netip.Prefix) (vppapi.FIBEntry, agent.Tunnels, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c, err := vppapi.New(vppapi.Config{Socket: socket, ReplyTimeout: timeout})
	if err != nil {
		return vppapi.FIBEntry{}, nil, err
	}
	// Run owns the connection until runCtx ends; it retries a failed connect, so the first event, or
	// the deadline with the last attempt's error, decides.
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = c.Run(runCtx)
	}()
	defer func() {
		stop()
		<-done
	}()
	select {
	case ev := <-c.Events():
		if ev.Kind != vppapi.Connected {
			return vppapi.FIBEntry{}, nil, fmt.Errorf("connect to VPP at %s: %v", socket, ev.Err)
		}
	case <-ctx.Done():
		if why := c.Status().LastError; why != "" { // "connect to VPP at ...: ..."
			return vppapi.FIBEntry{}, nil, fmt.Errorf("%s (no connection within %s)", why, timeout)
		}
		return vppapi.FIBEntry{}, nil, fmt.Errorf("connect to VPP at %s: no connection within %s", socket, timeout)
	}
	e, err := c.LookupRoute(ctx, table, q)
	if err != nil {
		return vppapi.FIBEntry{}, nil, err
	}
	ipips, err := c.DumpIPIPTunnels(ctx)
	if err != nil {
		return vppapi.FIBEntry{}, nil, err
	}
	tunnels := agent.Tunnels{}
	tunnels.AddIPIP(ipips)
	if c.HasVXLAN() {
		vxlans, err := c.DumpVXLANTunnels(ctx)
		if err != nil {
			return vppapi.FIBEntry{}, nil, err
		}
		tunnels.AddVXLAN(vxlans)
	}
	return e, tunnels, nil
}
