package etcdconfig

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
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

// silentRounds is how many check rounds in a row no member must answer before Problem says etcd does
// not answer: one round that times out on a loaded machine is no outage.
const silentRounds = 2

// Guard keeps a client of several endpoints off members that stopped answering (frozen, not dead: a
// dead member closes its connections and gRPC moves on by itself; a frozen one keeps them open until
// the keepalive gives up, 10-13 s later). It checks each endpoint over a connection of its own with a
// Maintenance.Status call, which needs no quorum, no key and no permission.
//
// It also tells whether etcd can serve at all (Problem), with one endpoint as with several: no member
// answering (every one frozen or down), a member reporting an alarm (NOSPACE: etcd is out of space
// and refuses every write), or no member knowing a leader. gRPC shows none of these by itself: a
// frozen member's connection stays "ready", and a request waits out its deadline.
type Guard struct {
	cfg      *Config
	cli      *clientv3.Client
	log      *slog.Logger
	interval time.Duration
	timeout  time.Duration
	// onChange, when set, is called with the endpoints in use after every change (tests).
	onChange func(healthy []string)

	mu      sync.Mutex // guards problem
	problem string
}

// NewGuard returns a guard of cli, whose endpoints are cfg.Endpoints; it logs as component=etcdguard.
func NewGuard(cfg *Config, cli *clientv3.Client, log *slog.Logger) *Guard {
	return &Guard{cfg: cfg, cli: cli, log: log.With("component", "etcdguard"), interval: GuardInterval, timeout: GuardTimeout}
}

// Problem returns why etcd cannot serve, as of the last check ("" when a member answered with a
// leader and no alarm, or before the first check).
func (g *Guard) Problem() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.problem
}

func (g *Guard) setProblem(p string) {
	g.mu.Lock()
	was := g.problem
	g.problem = p
	g.mu.Unlock()
	switch {
	case p == was:
	case p != "":
		g.log.Warn("etcd cannot serve", "problem", p)
	default:
		g.log.Info("etcd serves again", "was", was)
	}
}

// Run checks the endpoints until ctx is done. With a single endpoint there is no other to move to:
// it only tells whether etcd serves (Problem).
func (g *Guard) Run(ctx context.Context) error {
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
	silent := 0
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		results := g.check(ctx, probes)
		if ctx.Err() != nil {
			return nil
		}
		var healthy []string
		for i, ep := range g.cfg.Endpoints {
			if results[i] != nil {
				healthy = append(healthy, ep)
			}
		}
		if len(healthy) == 0 {
			silent++
		} else {
			silent = 0
		}
		g.setProblem(g.verdict(results, silent))
		if len(g.cfg.Endpoints) < 2 {
			continue
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

// verdict is Problem after a round of checks: results holds each endpoint's status answer (nil: no
// answer in time), silent counts the rounds in a row that none answered.
func (g *Guard) verdict(results []*pb.StatusResponse, silent int) string {
	answered, leaderless := 0, 0
	for i, r := range results {
		if r == nil {
			continue
		}
		answered++
		for _, e := range r.Errors {
			// Alarms read "memberID:<id> alarm:<NAME> "; they hold for the whole cluster.
			if _, alarm, ok := strings.Cut(e, "alarm:"); ok {
				alarm = strings.TrimSpace(alarm)
				if alarm == pb.AlarmType_NOSPACE.String() {
					return fmt.Sprintf("etcd at %s is out of space (alarm NOSPACE): every write fails with %q until it is compacted, defragmented and the alarm disarmed",
						Redacted(g.cfg.Endpoints[i:i+1]), "etcdserver: mvcc: database space exceeded")
				}
				return fmt.Sprintf("etcd at %s reports alarm %s", Redacted(g.cfg.Endpoints[i:i+1]), alarm)
			}
		}
		if r.Leader == 0 {
			leaderless++
		}
	}
	switch {
	case answered == 0 && silent >= silentRounds:
		return fmt.Sprintf("etcd at %s does not answer: no member answered a status request within %s, %d rounds in a row (frozen, overloaded or unreachable)",
			Redacted(g.cfg.Endpoints), g.timeout, silentRounds)
	case answered == 0:
		return g.Problem() // not yet decided: keep the verdict until the next round
	case leaderless == answered:
		return fmt.Sprintf("etcd at %s has no leader (quorum lost)", Redacted(g.cfg.Endpoints))
	}
	return ""
}

// check asks every endpoint for its status in parallel and returns each answer (nil: none in time),
// in configuration order.
func (g *Guard) check(ctx context.Context, probes []*clientv3.Client) []*pb.StatusResponse {
	out := make([]*pb.StatusResponse, len(probes))
	done := make(chan int, len(probes))
	for i, c := range probes {
		go func() {
			cctx, cancel := context.WithTimeout(ctx, g.timeout)
			defer cancel()
			conn := c.ActiveConnection()
			if resp, err := pb.NewMaintenanceClient(conn).Status(cctx, &pb.StatusRequest{}); err == nil {
				out[i] = resp
			}
			done <- i
		}()
	}
	for range probes {
		<-done
	}
	return out
}
