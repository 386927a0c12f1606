package ipamd

import (
	"context"
	"errors"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
)

// status answers whether ADD can be served: etcd must answer (a read of the state's sources, which
// also brings the state up to date; else 50 naming the endpoints), and every family ADD assigns must
// have a free address in the node's blocks, a block it may claim, or (strict affinity off) an address
// it may borrow (else 50). It writes nothing.
func (c *call) status(ctx context.Context) error {
	unreachable := func(err error) error {
		if errors.Is(err, errUnavailable) || ctx.Err() != nil {
			return cniError(ErrPluginNotAvailable, "etcd unreachable at %s: %v", c.endpoints, err)
		}
		return err
	}
	blocks := c.state.missingBlocks()
	for cidr := range c.state.blocks {
		blocks = append(blocks, cidr)
	}
	res, err := c.txn(ctx, nil, c.state.refreshOps("", blocks), nil)
	if err != nil {
		return unreachable(err)
	}
	if err := c.refreshed("", blocks, res); err != nil {
		return err
	}
	_, err = c.decide(ctx, "", func(v *view) error {
		pools, err := v.selectPools(true)
		if err != nil {
			return err
		}
		for _, f := range v.conf.Families() {
			// The decision ADD would take, on the view only.
			if _, err := v.assignAuto(f, pools[f], calico.AllocationAttribute{}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		if errors.Is(err, errUnavailable) || ctx.Err() != nil {
			return unreachable(err)
		}
		return cniError(ErrPluginNotAvailable, "cannot serve ADD: %v", err)
	}
	return nil
}
