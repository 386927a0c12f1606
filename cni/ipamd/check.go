package ipamd

import (
	"context"
	"net/netip"
)

// check verifies that the handle exists and holds, for this interface, every prevResult address that
// lies in the pools.
func (c *call) check(ctx context.Context, containerID, ifname string) error {
	handle := handleID(c.conf.Network, containerID)
	return c.retry(ctx, "CHECK "+handle, func(ctx context.Context) error {
		v, err := c.newView(ctx, handle, readSpec{handle: true, pools: true})
		if err != nil {
			return err
		}
		if v.handle == nil {
			return withCode(ErrCheckFailed, "container %s has no allocation on network %s (no handle %s)", containerID, c.conf.Network, handle)
		}
		if err := v.loadBlocks(ctx, handleBlocks(v.handle)); err != nil {
			return err
		}
		held := v.held(handle, ifname)
		if len(held) == 0 {
			return withCode(ErrCheckFailed, "handle %s holds no address for interface %s", handle, ifname)
		}
		pools, err := v.selectPools(false)
		if err != nil {
			return err
		}
		for _, addr := range c.conf.PrevIPs {
			if !inPools(netip.PrefixFrom(addr, addr.BitLen()), pools[familyOf(addr)]) {
				continue
			}
			found := false
			for _, a := range held {
				found = found || a.Addr == addr
			}
			if !found {
				return withCode(ErrCheckFailed, "prevResult address %s is not held by handle %s for interface %s", addr, handle, ifname)
			}
		}
		return nil
	})
}
