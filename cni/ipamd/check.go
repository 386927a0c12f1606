package ipamd

import (
	"net/netip"

	"github.com/vpp-route-agent/vpp-route-agent/internal/netaddr"
)

// check decides a CHECK (a batch of one, see serve): the handle exists and holds, for this
// interface, every prevResult address that lies in the pools. It reads the handle; the blocks it
// names come from the node state when they are the node's. A failure is answered on a fresh read
// (recheck).
func (v *view) check(r *request, _ bool) error {
	if !v.handleRead {
		return v.needHandle()
	}
	if err := v.checkHeld(r); err != nil {
		return v.recheck(err)
	}
	return nil
}

func (v *view) checkHeld(r *request) error {
	if v.handle == nil {
		return withCode(ErrCheckFailed, "container %s has no allocation on network %s (no handle %s)", v.conf.ContainerID, v.conf.Network, v.handleID)
	}
	if err := v.require(handleBlocks(v.handle)...); err != nil {
		return err
	}
	held := v.held(v.handleID, r.ifname)
	if len(held) == 0 {
		return withCode(ErrCheckFailed, "handle %s holds no address for interface %s", v.handleID, r.ifname)
	}
	pools, err := v.selectPools(false)
	if err != nil {
		return err
	}
	for _, addr := range v.conf.PrevIPs {
		if !inPools(netip.PrefixFrom(addr, addr.BitLen()), pools[netaddr.FamilyOf(addr)]) {
			continue
		}
		found := false
		for _, a := range held {
			found = found || a.Addr == addr
		}
		if !found {
			return withCode(ErrCheckFailed, "prevResult address %s is not held by handle %s for interface %s", addr, v.handleID, r.ifname)
		}
	}
	return nil
}
