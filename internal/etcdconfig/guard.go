package etcdconfig

import (
	"context"
	"log/slog"
	"slices"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Guard defaults: a member that has not answered a status request within GuardTimeout, asked every
// GuardInterval, is taken out of the client's endpoints, so that the next request or watch stream
// goes to a member that answers. Detection takes at most GuardInterval+GuardTimeout.
const (
	GuardInterval = time.Second
	GuardTimeout  = time.Second
)

// Guard keeps a client of several endpoints off members that stopped answering (frozen, not dead: a
// dead member closes its connections and gRPC moves on by itself; a frozen one keeps them open until
// the keepalive gives up, 10-13 s later). It checks each endpoint over a connection of its own with a
// Maintenance.Status call, which needs no quorum, no key and no permission.
type Guard struct {
	cfg      *Config
	cli      *clientv3.Client
	log      *slog.Logger
	interval time.Duration
	timeout  time.Duration
	// onChange, when set, is called with the endpoints in use after every change (tests).
	onChange func(healthy []string)
}

// NewGuard returns a guard of cli, whose endpoints are cfg.Endpoints; it logs as component=etcdguard.
func NewGuard(cfg *Config, cli *clientv3.Client, log *slog.Logger) *Guard {
	return &Guard{cfg: cfg, cli: cli, log: log.With("component", "etcdguard"), interval: GuardInterval, timeout: GuardTimeout}
}

// Run checks the endpoints until ctx is done. With a single endpoint there is nothing to choose from
// and it returns at once.
func (g *Guard) Run(ctx context.Context) error {
	if len(g.cfg.Endpoints) < 2 {
		return nil
	}
	tlsCfg, err := g.cfg.TLS()
	if err != nil {
		return err
	}
	probes := make([]*clientv3.Client, len(g.cfg.Endpoints))
	for i, ep := range g.cfg.Endpoints {
		c, err := clientv3.New(g.cfg.clientConfig([]string{ep}, tlsCfg))
		if err != nil {
			return err
		}
		defer c.Close()
		probes[i] = c
	}
	inUse := slices.Clone(g.cfg.Endpoints)
	tick := time.NewTicker(g.interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		healthy := g.check(ctx, probes)
		if ctx.Err() != nil {
			return nil
		}
		if len(healthy) == 0 {
			healthy = g.cfg.Endpoints // none answers: let gRPC try them all
		}
		if slices.Equal(healthy, inUse) {
			continue
		}
		for _, ep := range inUse {
			if !slices.Contains(healthy, ep) {
				g.log.Warn("etcd member stopped answering; moving off it", "endpoint", Redacted([]string{ep}), "timeout", g.timeout)
			}
		}
		for _, ep := range healthy {
			if !slices.Contains(inUse, ep) {
				g.log.Info("etcd member answers again", "endpoint", Redacted([]string{ep}))
			}
		}
		g.cli.SetEndpoints(healthy...)
		inUse = healthy
		if g.onChange != nil {
			g.onChange(healthy)
		}
	}
}

// check asks every endpoint for its status in parallel and returns those that answered in time, in
// configuration order.
func (g *Guard) check(ctx context.Context, probes []*clientv3.Client) []string {
	ok := make([]bool, len(probes))
	done := make(chan int, len(probes))
	for i, c := range probes {
		go func() {
			cctx, cancel := context.WithTimeout(ctx, g.timeout)
			defer cancel()
			conn := c.ActiveConnection()
			_, err := pb.NewMaintenanceClient(conn).Status(cctx, &pb.StatusRequest{})
			ok[i] = err == nil
			done <- i
		}()
	}
	for range probes {
		<-done
	}
	var out []string
	for i, ep := range g.cfg.Endpoints {
		if ok[i] {
			out = append(out, ep)
		}
	}
	return out
}
