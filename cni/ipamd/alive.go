package ipamd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/internal/backoff"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Keys of the daemons' liveness and of the election of the one that exports the cluster's capacity.
const (
	// AlivePrefix holds one key per node, AlivePrefix+<node>, on the lease of that node's daemon: the
	// node's IPAM daemon is alive while the key exists. Its value is the daemon's lease in hex.
	AlivePrefix = "/vpp-calico/ipam/alive/"
	// ExporterElection is the prefix of the concurrency.Election among the daemons, each campaigning
	// on its liveness lease with its node name: the leader exports the cluster-wide gauges.
	ExporterElection = "/vpp-calico/ipam/exporter/"
	// DefaultLivenessTTL is the liveness lease's TTL (--liveness-ttl).
	DefaultLivenessTTL = 30 * time.Second
	// MinLivenessTTL is the shortest TTL accepted: etcd raises shorter ones to its own minimum.
	MinLivenessTTL = 2 * time.Second
)

// AliveKey returns the liveness key of node's IPAM daemon.
func AliveKey(node string) string { return AlivePrefix + node }

// LivenessConfig configures the daemon's liveness lease and its part in the exporter election.
type LivenessConfig struct {
	Client *clientv3.Client
	Node   string
	// TTL of the lease (default DefaultLivenessTTL). A daemon that dies (kill -9 included) loses
	// its key and, if it led, the election within TTL.
	TTL time.Duration
	// CallTimeout bounds each etcd call (default 5 s).
	CallTimeout time.Duration
	Logger      *slog.Logger
}

// Liveness keeps the node's liveness key on a lease kept alive for the life of the daemon, and
// campaigns on that lease for the exporter election. When Run ends the daemon resigns, so that
// another takes over at once, and leaves the lease to expire: a restart does not make the node look
// dead.
type Liveness struct {
	cfg    LivenessConfig
	alive  atomic.Bool
	leader atomic.Bool
}

// NewLiveness checks the configuration.
func NewLiveness(cfg LivenessConfig) (*Liveness, error) {
	if cfg.Client == nil || cfg.Node == "" {
		return nil, errors.New("liveness: client and node name are required")
	}
	if cfg.TTL == 0 {
		cfg.TTL = DefaultLivenessTTL
	}
	if cfg.TTL < MinLivenessTTL || cfg.TTL%time.Second != 0 {
		return nil, fmt.Errorf("--liveness-ttl %s: a whole number of seconds, at least %s", cfg.TTL, MinLivenessTTL)
	}
	if cfg.CallTimeout == 0 {
		cfg.CallTimeout = 5 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Liveness{cfg: cfg}, nil
}

// Alive reports whether the liveness key is on the daemon's live lease.
func (l *Liveness) Alive() bool { return l.alive.Load() }

// Leader reports whether this daemon leads the exporter election.
func (l *Liveness) Leader() bool { return l.leader.Load() }

// Run keeps the liveness key and campaigns until ctx ends, starting again with a new lease when
// the lease is lost (expired while etcd was out of reach).
func (l *Liveness) Run(ctx context.Context) error {
	bo := backoff.Backoff{Base: 250 * time.Millisecond, Max: 5 * time.Second}
	for ctx.Err() == nil {
		err := l.term(ctx)
		l.alive.Store(false)
		l.leader.Store(false)
		if ctx.Err() != nil {
			break
		}
		l.cfg.Logger.Warn("IPAM liveness lease lost; starting again", "node", l.cfg.Node, "err", err)
		if !bo.Wait(ctx) {
			break
		}
	}
	return nil
}

// term runs one lease: grant, put the key, campaign, lead until the lease or ctx ends.
func (l *Liveness) term(ctx context.Context) error {
	gctx, cancel := context.WithTimeout(ctx, l.cfg.CallTimeout)
	grant, err := l.cfg.Client.Grant(gctx, int64(l.cfg.TTL/time.Second))
	cancel()
	if err != nil {
		return fmt.Errorf("grant liveness lease: %w", err)
	}
	sess, err := concurrency.NewSession(l.cfg.Client, concurrency.WithLease(grant.ID), concurrency.WithContext(ctx))
	if err != nil {
		return fmt.Errorf("keep liveness lease %x alive: %w", int64(grant.ID), err)
	}
	// The lease outlives the daemon by up to TTL (Orphan stops only the keep-alive).
	defer sess.Orphan()
	key := AliveKey(l.cfg.Node)
	pctx, cancel := context.WithTimeout(ctx, l.cfg.CallTimeout)
	_, err = l.cfg.Client.Put(pctx, key, fmt.Sprintf("%x", int64(grant.ID)), clientv3.WithLease(grant.ID))
	cancel()
	if err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	l.alive.Store(true)
	l.cfg.Logger.Info("IPAM liveness key on lease", "key", key, "ttl", l.cfg.TTL, "lease", fmt.Sprintf("%x", int64(grant.ID)))

	// The campaign ends with the lease as well as with ctx.
	cctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		select {
		case <-sess.Done():
			stop()
		case <-cctx.Done():
		}
	}()
	e := concurrency.NewElection(sess, ExporterElection)
	if err := e.Campaign(cctx, l.cfg.Node); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("campaign for capacity exporter: %w", err)
	}
	l.leader.Store(true)
	l.cfg.Logger.Info("exporting the cluster's IPAM capacity (elected)", "node", l.cfg.Node)
	<-cctx.Done()
	l.leader.Store(false)
	if ctx.Err() == nil {
		return errors.New("liveness lease expired or etcd out of reach")
	}
	// Stopping: hand the election over now rather than after TTL.
	rctx, cancel := context.WithTimeout(context.Background(), min(l.cfg.CallTimeout, 2*time.Second))
	defer cancel()
	if err := e.Resign(rctx); err != nil {
		l.cfg.Logger.Warn("resign as capacity exporter (another daemon takes over when the lease expires)", "err", err)
	}
	return nil
}
