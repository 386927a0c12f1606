package ipamd

import (
	"context"
	"errors"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
)

// status answers whether ADD can be served: etcd must answer (else 50 naming the endpoints), and every
// family ADD assigns must have a free address in the node's blocks, a block it may claim, or (strict
// affinity off) an address it may borrow (else 50). It decides on the node state the followers keep:
// no round trip while the node's blocks have room and the connection to etcd is up; a read only of
// what the decision needs (the family's listing to claim, its blocks to borrow), or, when the
// connection is reported down (etcdLost), one read to see whether etcd answers again; "not ready" is
// answered only on a fresh read (recheck). A problem of etcd's (etcdconfig.Guard: it does not answer,
// has no leader, is out of space) is not ready at once, naming it. It writes nothing.
func (c *call) status(ctx context.Context, etcdLost bool, problem string) error {
	if problem != "" {
		return cniError(ErrPluginNotAvailable, "%s", problem)
	}
	unreachable := func(err error) error {
		return cniError(ErrPluginNotAvailable, "etcd unreachable at %s: %v", c.endpoints, err)
	}
	if etcdLost {
		if _, err := c.txn(ctx, nil, []op{getOp(calico.IPAMConfigKey)}, nil); err != nil {
			return unreachable(err)
		}
	}
	_, err := c.decide(ctx, "", func(v *view) error {
		pools, err := v.selectPools(true)
		if err != nil {
			return v.recheck(err)
		}
		for _, f := range v.conf.Families() {
			// The decision ADD would take, on the view only.
			if _, err := v.assignAuto(f, pools[f], calico.AllocationAttribute{}); err != nil {
				return v.recheck(err)
			}
		}
		return nil
	})
	switch {
	case err == nil:
		return nil
	case errors.Is(err, errUnavailable) || ctx.Err() != nil:
		return unreachable(err)
	default:
		return cniError(ErrPluginNotAvailable, "cannot serve ADD: %v", err)
	}
}
