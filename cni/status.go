package cni

import (
	"context"
	"errors"
	"strings"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
)

// status answers whether ADD can be served: etcd must answer within statusTimeout (else 50 naming the
// endpoints), and every family ADD assigns must have a free address in the node's blocks, a block it
// may claim, or (strict affinity off) an address it may borrow (else 50). It writes nothing.
func (c *call) status(ctx context.Context) error {
	v, err := c.newView(ctx, "", readSpec{config: true, pools: true, affinity: true, resources: true})
	if err != nil {
		if errors.Is(err, errUnavailable) || ctx.Err() != nil {
			return cniError(ErrPluginNotAvailable, "etcd unreachable at %s: %v", strings.Join(c.conf.Endpoints, ","), err)
		}
		return err
	}
	pools, err := v.selectPools(true)
	if err != nil {
		return err
	}
	if err := v.loadBlocks(ctx, v.affineCIDRs(pools)); err != nil {
		return cniError(ErrPluginNotAvailable, "etcd at %s: %v", strings.Join(c.conf.Endpoints, ","), err)
	}
	for _, f := range []Family{V4, V6} {
		if !c.conf.Assign[f] {
			continue
		}
		// Try an assignment on the view without committing it: the same decision ADD would take.
		if _, err := v.assignAuto(ctx, f, pools[f], calico.AllocationAttribute{}); err != nil {
			return cniError(ErrPluginNotAvailable, "cannot serve ADD: %v", err)
		}
	}
	return nil
}
