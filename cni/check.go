package cni

import (
	"context"
	"net/netip"

	"github.com/containernetworking/cni/pkg/skel"
	current "github.com/containernetworking/cni/pkg/types/100"
)

// check verifies that the handle exists and holds, for this interface, every prevResult address that
// lies in the pools.
func (c *call) check(ctx context.Context, args *skel.CmdArgs) error {
	handle := handleID(c.conf.Network, args.ContainerID)
	return c.retry(ctx, "CHECK "+handle, func(ctx context.Context) error {
		v, err := c.newView(ctx, handle, readSpec{handle: true, pools: true})
		if err != nil {
			return err
		}
		if v.handle == nil {
			return withCode(ErrCheckFailed, "container %s has no allocation on network %s (no handle %s)", args.ContainerID, c.conf.Network, handle)
		}
		if err := v.loadBlocks(ctx, handleBlocks(v.handle)); err != nil {
			return err
		}
		held := v.held(handle, args.IfName)
		if len(held) == 0 {
			return withCode(ErrCheckFailed, "handle %s holds no address for interface %s", handle, args.IfName)
		}
		if c.conf.PrevResult == nil {
			return nil
		}
		prev, err := current.NewResultFromResult(c.conf.PrevResult)
		if err != nil {
			return configError("prevResult", "%v", err)
		}
		pools, err := v.selectPools(false)
		if err != nil {
			return err
		}
		for _, ip := range prev.IPs {
			addr, ok := netip.AddrFromSlice(ip.Address.IP)
			if !ok {
				continue
			}
			addr = addr.Unmap()
			if !inPools(netip.PrefixFrom(addr, addr.BitLen()), pools[familyOf(addr)]) {
				continue
			}
			found := false
			for _, a := range held {
				found = found || a.addr == addr
			}
			if !found {
				return withCode(ErrCheckFailed, "prevResult address %s is not held by handle %s for interface %s", addr, handle, args.IfName)
			}
		}
		return nil
	})
}
