package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/blockwatch"
	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/internal/backoff"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// RegistrarConfig configures the registration of this node's peer IPs.
type RegistrarConfig struct {
	Client *clientv3.Client
	// HostsPrefix is where peers register, e.g. "/vpp-calico/hosts/".
	HostsPrefix string
	NodeName    string
	// PeerIPs are registered under <prefix><node>/peerip/ipv4/1 and .../ipv6/1 (at most one per family).
	PeerIPs []netip.Addr
	// TTL of the lease the keys are attached to.
	TTL time.Duration
	// Deregister revokes the lease (deleting the keys) when Run ends; by default the keys outlive a
	// restart by up to TTL so that peers do not withdraw routes to this node.
	Deregister bool
	// RequestTimeout bounds each etcd call.
	RequestTimeout time.Duration
	// CheckInterval is how often the keys are verified to still exist.
	CheckInterval time.Duration
	Logger        *slog.Logger
	Metrics       *Metrics
}

// Registrar keeps this node's peer IPs registered in etcd on a lease for the life of the process.
type Registrar struct {
	cfg RegistrarConfig
	kvs map[string]string
	up  atomic.Bool
	m   *Metrics
}

// NewRegistrar checks the configuration and returns a registrar.
func NewRegistrar(cfg RegistrarConfig) (*Registrar, error) {
	if cfg.Client == nil || cfg.NodeName == "" || cfg.HostsPrefix == "" {
		return nil, errors.New("registrar: client, node name and hosts prefix are required")
	}
	if cfg.TTL < 5*time.Second {
		return nil, fmt.Errorf("registrar: TTL %s is below 5s", cfg.TTL)
	}
	if cfg.RequestTimeout == 0 {
		cfg.RequestTimeout = 5 * time.Second
	}
	if cfg.CheckInterval == 0 {
		cfg.CheckInterval = cfg.TTL / 3
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	r := &Registrar{cfg: cfg, kvs: map[string]string{}, m: cfg.Metrics.orNop()}
	for _, a := range cfg.PeerIPs {
		k := blockwatch.PeerKey(cfg.HostsPrefix, cfg.NodeName, calico.Family(calico.HostPrefix(a)))
		if _, dup := r.kvs[k]; dup {
			return nil, fmt.Errorf("registrar: two peer IPs of one family (%s)", k)
		}
		r.kvs[k] = a.Unmap().String()
	}
	if len(r.kvs) == 0 {
		return nil, errors.New("registrar: no peer IP to register")
	}
	return r, nil
}

// Up reports whether the registration is currently present.
func (r *Registrar) Up() bool { return r.up.Load() }

// Run registers at once and keeps the registration alive until ctx is done, re-registering whenever
// the lease is lost or a key disappears.
func (r *Registrar) Run(ctx context.Context) error {
	var lease clientv3.LeaseID
	bo := backoff.Backoff{Base: 250 * time.Millisecond, Max: 5 * time.Second}
	for {
		var err error
		var registered bool
		lease, registered, err = r.session(ctx)
		r.setUp(false)
		if ctx.Err() != nil {
			break
		}
		if registered {
			bo.Reset()
		}
		r.cfg.Logger.Warn("peer IP registration lost; registering again", "err", err)
		if !bo.Wait(ctx) {
			break
		}
	}
	if r.cfg.Deregister && lease != 0 {
		// Bounded well inside the daemon's shutdown limit, even when etcd is down.
		rctx, cancel := context.WithTimeout(context.Background(), min(r.cfg.RequestTimeout, 2*time.Second))
		defer cancel()
		if _, err := r.cfg.Client.Revoke(rctx, lease); err != nil {
			return fmt.Errorf("deregister: revoke lease %x: %w", int64(lease), err)
		}
		r.cfg.Logger.Info("deregistered peer IPs", "node", r.cfg.NodeName)
	}
	return nil
}

// session grants a lease, puts the keys on it and keeps it alive; it returns when the lease is lost,
// a key vanished, or ctx is done.
func (r *Registrar) session(ctx context.Context) (lease clientv3.LeaseID, registered bool, err error) {
	gctx, cancel := context.WithTimeout(ctx, r.cfg.RequestTimeout)
	grant, err := r.cfg.Client.Grant(gctx, int64(r.cfg.TTL/time.Second))
	cancel()
	if err != nil {
		return 0, false, fmt.Errorf("grant lease: %w", err)
	}
	if err := r.put(ctx, grant.ID); err != nil {
		return grant.ID, false, err
	}
	r.setUp(true)
	r.cfg.Logger.Info("registered peer IPs", "node", r.cfg.NodeName, "keys", r.kvs, "ttl", r.cfg.TTL)
	kctx, kcancel := context.WithCancel(ctx)
	defer kcancel()
	ka, err := r.cfg.Client.KeepAlive(kctx, grant.ID)
	if err != nil {
		return grant.ID, true, fmt.Errorf("keep lease alive: %w", err)
	}
	check := time.NewTicker(r.cfg.CheckInterval)
	defer check.Stop()
	for {
		select {
		case _, ok := <-ka:
			if !ok {
				return grant.ID, true, errors.New("lease keep-alive ended (lease expired or etcd unreachable)")
			}
		case <-check.C:
			if err := r.verify(ctx, grant.ID); err != nil {
				return grant.ID, true, err
			}
		case <-ctx.Done():
			return grant.ID, true, ctx.Err()
		}
	}
}

// put writes every key attached to the lease in one transaction.
func (r *Registrar) put(ctx context.Context, lease clientv3.LeaseID) error {
	ops := make([]clientv3.Op, 0, len(r.kvs))
	for k, v := range r.kvs {
		ops = append(ops, clientv3.OpPut(k, v, clientv3.WithLease(lease)))
	}
	pctx, cancel := context.WithTimeout(ctx, r.cfg.RequestTimeout)
	defer cancel()
	if _, err := r.cfg.Client.Txn(pctx).Then(ops...).Commit(); err != nil {
		return fmt.Errorf("put peer IP keys: %w", err)
	}
	return nil
}

// verify checks that every key still holds our value on our lease; it re-puts them if someone deleted
// or overwrote one, and fails if even that is impossible.
func (r *Registrar) verify(ctx context.Context, lease clientv3.LeaseID) error {
	vctx, cancel := context.WithTimeout(ctx, r.cfg.RequestTimeout)
	defer cancel()
	ops := make([]clientv3.Op, 0, len(r.kvs))
	for k := range r.kvs {
		ops = append(ops, clientv3.OpGet(k))
	}
	resp, err := r.cfg.Client.Txn(vctx).Then(ops...).Commit()
	if err != nil {
		// etcd unreachable: the keep-alive decides when the lease is really gone.
		r.cfg.Logger.Debug("cannot verify registration", "err", err)
		return nil
	}
	for _, op := range resp.Responses {
		kvs := op.GetResponseRange().Kvs
		if len(kvs) != 1 || string(kvs[0].Value) != r.kvs[string(kvs[0].Key)] || clientv3.LeaseID(kvs[0].Lease) != lease {
			r.cfg.Logger.Warn("peer IP registration was removed or changed in etcd; putting it back")
			return r.put(ctx, lease)
		}
	}
	return nil
}

func (r *Registrar) setUp(up bool) {
	r.up.Store(up)
	if up {
		r.m.registrationUp.Set(1)
	} else {
		r.m.registrationUp.Set(0)
	}
}
