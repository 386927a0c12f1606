package release

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/cni/ipamd"
)

// TrackPrefix holds one key per node the elected daemon has seen alive, TrackPrefix+<node>, a JSON
// Track. Only a node tracked there is ever released automatically: a node that never ran a
// block-ipam daemon or a route agent (a Linux node with calico-ipam, whose IPAM has neither) is not
// taken for dead. The key outlives leader changes, so a new leader keeps the first time a node was
// seen dead.
const TrackPrefix = "/vpp-calico/ipam/nodes/"

// Track is the value of a TrackPrefix key.
type Track struct {
	SeenAlive time.Time `json:"seen_alive"`
	// DeadSince is when the node was first seen with neither liveness key nor registration; unset
	// while it is alive.
	DeadSince *time.Time `json:"dead_since,omitempty"`
}

// Results of an automatic release (block_ipam_node_releases_total's result label).
const (
	ResultReleased = "released" // everything released
	ResultPartial  = "partial"  // released, but values that cannot be read were left (named in the record)
	ResultAborted  = "aborted"  // a condition failed (the node came back, or a concurrent change)
	ResultFailed   = "failed"   // etcd failed; retried at the next pass
)

// ReaperConfig configures the automatic release of dead nodes.
type ReaperConfig struct {
	Client *clientv3.Client
	// Node is this daemon's node (named in the records).
	Node string
	// After is how long a node must have been dead before it is released (--release-dead-nodes-after).
	After time.Duration
	// Interval between passes (default min(After/4, 30 s), at least 1 s).
	Interval time.Duration
	// Leader reports whether this daemon is the elected one (Liveness.Leader): only it runs passes.
	Leader      func() bool
	HostsPrefix string
	CallTimeout time.Duration
	Logger      *slog.Logger
	// Now is the clock (tests); default time.Now.
	Now func() time.Time
}

// Reaper releases, on the elected daemon, the nodes dead for longer than After.
type Reaper struct {
	cfg      ReaperConfig
	releases *prometheus.CounterVec
	// beforeCommit runs between a release's plan and its commit (tests: the race with a node
	// coming back).
	beforeCommit func(node string)
}

// NewReaper checks cfg and registers block_ipam_node_releases_total with reg (nil: not registered).
func NewReaper(cfg ReaperConfig, reg prometheus.Registerer) (*Reaper, error) {
	if cfg.Client == nil || cfg.Node == "" || cfg.After <= 0 {
		return nil, errors.New("release: reaper needs a client, the node name and a positive After")
	}
	if cfg.Interval == 0 {
		cfg.Interval = max(min(cfg.After/4, 30*time.Second), time.Second)
	}
	if cfg.Leader == nil {
		cfg.Leader = func() bool { return false }
	}
	if cfg.HostsPrefix == "" {
		cfg.HostsPrefix = ipamd.DefaultHostsPrefix
	}
	if cfg.CallTimeout == 0 {
		cfg.CallTimeout = 5 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	r := &Reaper{cfg: cfg, releases: newReleasesCounter()}
	if reg != nil {
		if err := reg.Register(r.releases); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// Run makes a pass every Interval while this daemon leads, until ctx ends.
func (r *Reaper) Run(ctx context.Context) error {
	t := time.NewTicker(r.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if !r.cfg.Leader() {
			continue
		}
		if err := r.Pass(ctx); err != nil && ctx.Err() == nil {
			r.cfg.Logger.Warn("release dead nodes: pass failed", "err", err)
		}
	}
}

// Pass reads who is alive and who is tracked, tracks the nodes seen alive, starts the clock of
// those newly dead, and releases those dead for longer than After.
func (r *Reaper) Pass(ctx context.Context) error {
	now := r.cfg.Now().UTC()
	cctx, cancel := context.WithTimeout(ctx, r.cfg.CallTimeout)
	resp, err := r.cfg.Client.Txn(cctx).Then(
		clientv3.OpGet(ipamd.AlivePrefix, clientv3.WithPrefix(), clientv3.WithKeysOnly()),
		clientv3.OpGet(r.cfg.HostsPrefix, clientv3.WithPrefix(), clientv3.WithKeysOnly()),
		clientv3.OpGet(TrackPrefix, clientv3.WithPrefix()),
	).Commit()
	cancel()
	if err != nil {
		return fmt.Errorf("read liveness, registrations and %s: %w", TrackPrefix, err)
	}
	alive := map[string]bool{}
	for i, prefix := range []string{ipamd.AlivePrefix, r.cfg.HostsPrefix} {
		for _, kv := range resp.Responses[i].GetResponseRange().Kvs {
			node, _, _ := strings.Cut(strings.TrimPrefix(string(kv.Key), prefix), "/")
			alive[node] = true
		}
	}
	type tracked struct {
		t      Track
		modRev int64
	}
	tracks := map[string]tracked{}
	for _, kv := range resp.Responses[2].GetResponseRange().Kvs {
		node := strings.TrimPrefix(string(kv.Key), TrackPrefix)
		var t Track
		if err := json.Unmarshal(kv.Value, &t); err != nil {
			// Rewritten below as for a node seen for the first time.
			r.cfg.Logger.Warn("release dead nodes: tracking value does not decode; tracking the node anew", "key", string(kv.Key), "err", err)
			tracks[node] = tracked{modRev: kv.ModRevision}
			continue
		}
		tracks[node] = tracked{t: t, modRev: kv.ModRevision}
	}
	var errs []error
	put := func(node string, t Track, modRev int64) {
		v, _ := json.Marshal(t)
		key := TrackPrefix + node
		cctx, cancel := context.WithTimeout(ctx, r.cfg.CallTimeout)
		defer cancel()
		if _, err := r.cfg.Client.Txn(cctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", modRev)).
			Then(clientv3.OpPut(key, string(v))).Commit(); err != nil {
			errs = append(errs, fmt.Errorf("put %s: %w", key, err))
		}
	}
	for node := range alive {
		if calico.CheckNodeName(node) != nil {
			continue
		}
		if t, ok := tracks[node]; !ok || t.t.DeadSince != nil || t.t.SeenAlive.IsZero() {
			put(node, Track{SeenAlive: now}, t.modRev)
		}
	}
	for node, t := range tracks {
		if alive[node] {
			continue
		}
		if t.t.DeadSince == nil {
			since := now
			t.t.DeadSince = &since
			if t.t.SeenAlive.IsZero() {
				t.t.SeenAlive = now
			}
			r.cfg.Logger.Info("release dead nodes: node seen dead", "node", node, "release_after", r.cfg.After)
			put(node, t.t, t.modRev)
			continue
		}
		if now.Sub(*t.t.DeadSince) <= r.cfg.After {
			continue
		}
		if err := r.release(ctx, node, *t.t.DeadSince, t.modRev); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// release releases one node dead since since; once nothing is left, its tracking key goes too (only
// if unchanged since read: a node that came back keeps it).
func (r *Reaper) release(ctx context.Context, node string, since time.Time, trackRev int64) error {
	log := r.cfg.Logger.With("node", node, "dead_since", since)
	o := Options{Client: r.cfg.Client, Node: node, HostsPrefix: r.cfg.HostsPrefix, CallTimeout: r.cfg.CallTimeout,
		Logger: r.cfg.Logger, By: "block-ipamd on " + r.cfg.Node + " (--release-dead-nodes-after " + r.cfg.After.String() + ")"}
	if err := o.defaults(); err != nil {
		return err
	}
	p, err := NewPlan(ctx, o)
	if errors.Is(err, ErrUnknownNode) {
		p, err = &Plan{Node: node}, nil
	}
	if err != nil {
		r.releases.WithLabelValues(ResultFailed).Inc()
		return fmt.Errorf("plan the release of node %s: %w", node, err)
	}
	if len(p.Alive) > 0 {
		// Came back between the pass's read and the plan: the next pass tracks it alive.
		return nil
	}
	res := &Result{}
	if !p.Empty() {
		if r.beforeCommit != nil {
			r.beforeCommit(node)
		}
		res, err = Commit(ctx, o, p)
		result := ResultReleased
		switch {
		case errors.Is(err, ErrAborted):
			result = ResultAborted
		case err != nil:
			result = ResultFailed
		case len(res.Skipped) > 0:
			result = ResultPartial
		}
		r.releases.WithLabelValues(result).Inc()
		attrs := []any{"result", result, "addresses", len(res.Released), "blocks_deleted", len(res.BlocksDeleted),
			"blocks_unowned", len(res.BlocksUnowned), "affinities_deleted", len(res.AffinitiesDeleted), "record", res.Record}
		switch {
		case err != nil:
			log.Warn("release dead node: not finished", append(attrs, "err", err)...)
			if !errors.Is(err, ErrAborted) {
				return err
			}
			return nil
		case len(res.Skipped) > 0:
			log.Warn("released dead node's addresses, leaving values that cannot be read", append(attrs, "skipped", res.Skipped)...)
		default:
			log.Info("released dead node's addresses", attrs...)
		}
	}
	if len(res.Skipped) > 0 {
		return nil // tracked still: the operator sees it in the record and the log
	}
	// Nothing left: stop tracking, unless the node came back meanwhile.
	key := TrackPrefix + node
	cctx, cancel := context.WithTimeout(ctx, r.cfg.CallTimeout)
	defer cancel()
	o.Force = false
	if _, err := r.cfg.Client.Txn(cctx).If(append(o.guards(), clientv3.Compare(clientv3.ModRevision(key), "=", trackRev))...).
		Then(clientv3.OpDelete(key)).Commit(); err != nil {
		return fmt.Errorf("delete %s: %w", key, err)
	}
	return nil
}
