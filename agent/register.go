package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/blockwatch"
	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/internal/backoff"
	"github.com/vpp-route-agent/vpp-route-agent/internal/netaddr"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// RegistrarConfig configures the registration of this node's peer IPs.
type RegistrarConfig struct {
	Client *clientv3.Client
	// HostsPrefix is where peers register, e.g. "/vpp-calico/hosts/".
	HostsPrefix string
	NodeName    string
	// PeerIPs are registered under <prefix><node>/peerip/ipv4/<n> and .../ipv6/<n>: the n-th address of
	// each family in this order (the uplinks' order) gets index n, from 1.
	PeerIPs []netip.Addr
	// BFDPeerIPs are those of PeerIPs on which this node answers BFD (--bfd: its uplink addresses): each
	// gets <prefix><node>/peerip/<family>/<n>/bfd, valued with the address, beside its peer key.
	BFDPeerIPs []netip.Addr
	// TTL of the lease the keys are attached to.
	TTL time.Duration
	// Deregister revokes the lease (deleting the keys) when Run ends; by default the keys outlive a
	// restart by up to TTL so that peers do not withdraw routes to this node.
	Deregister bool
	// RequestTimeout bounds each etcd call.
	RequestTimeout time.Duration
	// CheckInterval is how often the keys are read again, besides the watch on them.
	CheckInterval time.Duration
	Logger        *slog.Logger
	Metrics       *Metrics
}

// Registrar keeps this node's peer IPs registered in etcd on a lease for the life of the process,
// and holds the node name against other agents: it writes only keys that are absent or on its own
// lease (a conditional transaction), never over a live registration it did not write. When another
// agent holds the name, it reports the conflict (Problem, an ERROR log line, the
// vpp_route_agent_registration_conflict gauge) and waits for that agent's keys to go before taking
// over, so other nodes see at most one next-hop change.
//
// A registration that holds exactly this agent's values on one lease is adopted (its lease kept
// alive) instead of being a conflict: that is this agent's previous incarnation, whose lease outlives
// a restart by design. Two agents configured with the same name and the same peer IP are therefore
// not told apart; they advertise the same next hop, so no route differs.
type Registrar struct {
	cfg    RegistrarConfig
	kvs    map[string]string
	prefix string // <hosts prefix><node>/peerip/: every key of the node's registration
	up     atomic.Bool
	m      *Metrics

	mu       sync.Mutex // guards conflict
	conflict string
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
	if err := calico.CheckNodeName(cfg.NodeName); err != nil {
		return nil, fmt.Errorf("registrar: %w", err)
	}
	r := &Registrar{cfg: cfg, kvs: map[string]string{}, m: cfg.Metrics.orNop(),
		prefix: cfg.HostsPrefix + cfg.NodeName + "/peerip/"}
	var index [2]int // per family: the index of the last key
	seen := map[netip.Addr]bool{}
	for _, a := range cfg.PeerIPs {
		a = a.Unmap()
		if seen[a] {
			return nil, fmt.Errorf("registrar: peer IP %s given twice", a)
		}
		seen[a] = true
		fam := netaddr.FamilyOf(a)
		index[fam]++
		if index[fam] > blockwatch.MaxPeerIndex {
			return nil, fmt.Errorf("registrar: more than %d peer IPs of family %s", blockwatch.MaxPeerIndex, fam)
		}
		r.kvs[blockwatch.PeerKeyAt(cfg.HostsPrefix, cfg.NodeName, fam, index[fam])] = a.String()
		if slices.ContainsFunc(cfg.BFDPeerIPs, func(b netip.Addr) bool { return b.Unmap() == a }) {
			r.kvs[blockwatch.PeerBFDKeyAt(cfg.HostsPrefix, cfg.NodeName, fam, index[fam])] = a.String()
		}
	}
	if len(r.kvs) == 0 {
		return nil, errors.New("registrar: no peer IP to register")
	}
	return r, nil
}

// Up reports whether the registration is currently present.
func (r *Registrar) Up() bool { return r.up.Load() }

// Problem says why the registration is not present when another agent holds the node name; "" otherwise.
func (r *Registrar) Problem() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.conflict
}

// Run registers at once and keeps the registration until ctx is done: it re-registers when its lease
// is lost or a key disappears, and waits while another agent holds the name. On return the lease is
// revoked when Deregister is set, else left to expire (or to be adopted by the next start).
func (r *Registrar) Run(ctx context.Context) error {
	var sess *concurrency.Session
	bo := backoff.Backoff{Base: 250 * time.Millisecond, Max: 5 * time.Second}
	for ctx.Err() == nil {
		progressed, err := r.step(ctx, &sess)
		if ctx.Err() != nil {
			break
		}
		if progressed {
			bo.Reset()
		}
		if err != nil {
			r.cfg.Logger.Warn("peer IP registration: retrying", "err", err)
			if !bo.Wait(ctx) {
				break
			}
		}
	}
	r.setUp(false)
	if sess == nil {
		return nil
	}
	lease := sess.Lease()
	sess.Orphan() // stop the keep-alive; the lease lives on for its TTL unless revoked below
	if r.cfg.Deregister {
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

// claim is what the registrar may do with the node's keys as they are in etcd.
type claim struct {
	// free: every key is absent or on our lease; adopt: a previous registration with exactly our
	// values on lease adopt; else another agent holds the name and conflict describes it.
	free     bool
	adopt    clientv3.LeaseID
	conflict string
	// theirs is the other registration's keys and values (logged with the conflict).
	theirs map[string]string
}

// judge decides, from the keys under the node's prefix, whether the registrar may write. ours is the
// lease of its live session (0 when it has none). It is pure.
func (r *Registrar) judge(kvs []*mvccpb.KeyValue, ours clientv3.LeaseID) claim {
	theirs := map[string]string{}
	leases := map[clientv3.LeaseID]bool{}
	adoptable := true
	for _, kv := range kvs {
		lease := clientv3.LeaseID(kv.Lease)
		if ours != 0 && lease == ours {
			continue
		}
		k := string(kv.Key)
		theirs[k] = string(kv.Value)
		leases[lease] = true
		if v, mine := r.kvs[k]; !mine || v != string(kv.Value) || lease == 0 {
			adoptable = false
		}
	}
	switch {
	case len(theirs) == 0:
		return claim{free: true}
	case adoptable && len(leases) == 1 && ours == 0:
		for l := range leases {
			return claim{adopt: l}
		}
	}
	var their []string
	for _, k := range slices.Sorted(maps.Keys(theirs)) {
		their = append(their, strings.TrimPrefix(k, r.prefix)+"="+theirs[k])
	}
	var mine []string
	for _, k := range slices.Sorted(maps.Keys(r.kvs)) {
		mine = append(mine, strings.TrimPrefix(k, r.prefix)+"="+r.kvs[k])
	}
	until := "that registration's lease ends (two agents configured with one node name?)"
	if leases[0] {
		until = "it is deleted (it was written without a lease, by hand or by an old agent)"
	}
	return claim{theirs: theirs, conflict: fmt.Sprintf("node name %q is registered by another agent (%s); this agent has %s: "+
		"not registering until %s", r.cfg.NodeName, strings.Join(their, ", "), strings.Join(mine, ", "), until)}
}

// step reads the node's keys, registers if it may, and waits until something changes: the keys, the
// lease, or the periodic check. It reports whether it registered or confirmed the registration.
func (r *Registrar) step(ctx context.Context, sess **concurrency.Session) (bool, error) {
	if *sess != nil {
		select {
		case <-(*sess).Done():
			r.setUp(false)
			r.cfg.Logger.Warn("peer IP registration lease lost (expired or etcd unreachable); registering again", "node", r.cfg.NodeName)
			*sess = nil
		default:
		}
	}
	var ours clientv3.LeaseID
	if *sess != nil {
		ours = (*sess).Lease()
	}
	gctx, cancel := context.WithTimeout(ctx, r.cfg.RequestTimeout)
	resp, err := r.cfg.Client.Get(gctx, r.prefix, clientv3.WithPrefix())
	cancel()
	if err != nil {
		return false, fmt.Errorf("read registration %s: %w", r.prefix, err)
	}
	c := r.judge(resp.Kvs, ours)
	if c.conflict != "" {
		r.setConflict(c.conflict, c.theirs)
		return false, r.wait(ctx, *sess, resp.Header.Revision, 0)
	}
	if *sess == nil {
		s, err := r.newSession(ctx, c.adopt)
		if err != nil {
			return false, err
		}
		*sess = s
		if c.adopt != 0 {
			r.cfg.Logger.Info("adopted the registration this node's previous agent left (same peer IPs)", "node", r.cfg.NodeName,
				"lease", fmt.Sprintf("%x", int64(c.adopt)))
		}
	}
	lease := (*sess).Lease()
	rev, err := r.put(ctx, resp.Kvs, resp.Header.Revision, lease)
	if err != nil {
		return false, err
	}
	if rev == 0 {
		return false, nil // someone wrote in between: judge again
	}
	r.setConflict("", nil)
	if !r.up.Load() {
		r.cfg.Logger.Info("registered peer IPs", "node", r.cfg.NodeName, "keys", r.kvs, "ttl", r.cfg.TTL,
			"lease", fmt.Sprintf("%x", int64(lease)))
	}
	r.setUp(true)
	return true, r.wait(ctx, *sess, rev, lease)
}

// newSession grants a lease (or adopts lease) and keeps it alive until ctx ends.
func (r *Registrar) newSession(ctx context.Context, lease clientv3.LeaseID) (*concurrency.Session, error) {
	if lease == 0 {
		gctx, cancel := context.WithTimeout(ctx, r.cfg.RequestTimeout)
		grant, err := r.cfg.Client.Grant(gctx, int64(r.cfg.TTL/time.Second))
		cancel()
		if err != nil {
			return nil, fmt.Errorf("grant lease: %w", err)
		}
		lease = grant.ID
	}
	s, err := concurrency.NewSession(r.cfg.Client, concurrency.WithLease(lease), concurrency.WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("keep lease %x alive: %w", int64(lease), err)
	}
	return s, nil
}

// put writes the keys that do not already hold our value on our lease, in one transaction that
// succeeds only if none of them changed since they were read (seen, at revision seenRev). It returns
// the revision the registration is current at (seenRev when nothing needed writing), or 0 when the
// condition failed.
func (r *Registrar) put(ctx context.Context, seen []*mvccpb.KeyValue, seenRev int64, lease clientv3.LeaseID) (int64, error) {
	have := map[string]*mvccpb.KeyValue{}
	for _, kv := range seen {
		have[string(kv.Key)] = kv
	}
	var cmps []clientv3.Cmp
	var ops []clientv3.Op
	for _, k := range slices.Sorted(maps.Keys(r.kvs)) {
		kv := have[k]
		if kv != nil && clientv3.LeaseID(kv.Lease) == lease && string(kv.Value) == r.kvs[k] {
			continue
		}
		var rev int64
		if kv != nil {
			rev = kv.ModRevision
		}
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k), "=", rev))
		ops = append(ops, clientv3.OpPut(k, r.kvs[k], clientv3.WithLease(lease)))
	}
	if len(ops) == 0 {
		return seenRev, nil // the read that found them is the confirmation: wait watches from there
	}
	pctx, cancel := context.WithTimeout(ctx, r.cfg.RequestTimeout)
	defer cancel()
	resp, err := r.cfg.Client.Txn(pctx).If(cmps...).Then(ops...).Commit()
	if err != nil {
		return 0, fmt.Errorf("put peer IP keys: %w", err)
	}
	if !resp.Succeeded {
		return 0, nil
	}
	return resp.Header.Revision, nil
}

// wait returns when the node's keys change after rev in a way that is not our own write on lease
// ours (0: any delete counts), when the session ends, after CheckInterval, or when ctx ends.
func (r *Registrar) wait(ctx context.Context, sess *concurrency.Session, rev int64, ours clientv3.LeaseID) error {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := r.cfg.Client.Watch(wctx, r.prefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	check := time.NewTimer(r.cfg.CheckInterval)
	defer check.Stop()
	var done <-chan struct{}
	if sess != nil {
		done = sess.Done()
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-done:
			return nil
		case <-check.C:
			return nil
		case resp, ok := <-wch:
			if !ok {
				return errors.New("watch on the registration closed")
			}
			if err := resp.Err(); err != nil {
				return fmt.Errorf("watch on the registration: %w", err)
			}
			for _, ev := range resp.Events {
				if ev.Type == mvccpb.DELETE || ours == 0 || clientv3.LeaseID(ev.Kv.Lease) != ours {
					if ours != 0 {
						r.cfg.Logger.Warn("peer IP registration changed in etcd by someone else", "key", string(ev.Kv.Key),
							"type", ev.Type.String(), "value", string(ev.Kv.Value))
					}
					return nil
				}
			}
		}
	}
}

// setConflict records the conflict (or its end, with text ""), logging each new one at ERROR.
func (r *Registrar) setConflict(text string, theirs map[string]string) {
	r.mu.Lock()
	prev := r.conflict
	r.conflict = text
	r.mu.Unlock()
	if text == prev {
		return
	}
	if text != "" {
		r.setUp(false)
		r.m.registrationConflict.Set(1)
		r.cfg.Logger.Error("peer IP registration conflict: another agent holds this node name", "node", r.cfg.NodeName,
			"theirs", theirs, "ours", r.kvs)
		return
	}
	r.m.registrationConflict.Set(0)
	r.cfg.Logger.Info("the other registration of this node name is gone; this agent holds it now", "node", r.cfg.NodeName)
}

func (r *Registrar) setUp(up bool) {
	r.up.Store(up)
	if up {
		r.m.registrationUp.Set(1)
	} else {
		r.m.registrationUp.Set(0)
	}
}
