// Package blockwatch keeps a consistent view of Calico's IPAM blocks, the peer IPs route agents
// register, Calico's IP pools, the routing fields of Calico's Nodes (addresses, VXLAN tunnel
// endpoints) and this node's tunnel settings (FelixConfigurations "default" and "node.<name>"), read
// from etcd, and hands it out as immutable snapshots. Who owns
// each block comes from the block values or, with Calico's strict affinity, from the affinity keys
// (Config.Ownership, see Ownership); the snapshot is the same routing view either way.
//
// # Consistency
//
// Run lists every watched prefix at one etcd revision R (the first request fixes R, every later page
// and prefix is read WithRev(R)), builds a fresh view, and only then replaces the previous one and
// emits a Full snapshot. It then watches each prefix from R itself (WithRequireLeader,
// WithProgressNotify; the events of revision R are delivered again and ignored, as no newer than the
// view) and emits incremental snapshots. Any watch error, cancellation, closed channel or compaction,
// a watch stream that does not acknowledge a probe (a frozen member; see probeLoop), and a Relist
// call, make it list again at a new revision, diff the result against the view it had, and emit a
// Full snapshot whose change set is that difference. After a compaction the new revision is the
// compaction revision, read serializably after a random wait (Config.CompactedRelistSpread): every
// watcher behind one etcd gRPC proxy learns of the compaction at once, and their identical requests
// are then answered from the proxy's cache instead of by etcd, once for each. A snapshot is therefore
// never a partial view: a block missing from a snapshot is absent from etcd (at the revision the
// snapshot reflects), never merely not read yet. (The parts of the first list that Listing hands out
// before its Full snapshot are not snapshots, and say nothing of what they do not hold.) Each prefix's watch applies events in revision order
// and only when newer than the revision already applied to the key; the prefixes' watches are
// independent streams, so a snapshot taken between their responses may reflect one prefix at a slightly later
// revision than another.
//
// # Malformed values
//
// A key or value that cannot be decoded (bad JSON, a block whose value's cidr differs from its key, a
// key calico.ParseKey rejects or a foreign key under a prefix, a peer value that is not an address
// of the key's family, a bad pool, a Node or FelixConfiguration that is not JSON or whose
// metadata.name differs from its key) is logged with its key, counted in
// vpp_route_agent_malformed_values_total{source}, and skipped; it never stops the watch. A key whose new value
// is malformed KEEPS its last good value, so a bad write never withdraws routes; only a delete (or a
// block value with deleted:true) removes a key. A block key whose value is malformed is also listed
// in Snapshot.Held, with the reason, whether or not a good value was seen before: its key names the
// CIDR, so a consumer that starts after the value went bad still knows to keep what it has for that
// CIDR. Other keys that were never seen with a good value are absent.
// "Last good value" is the last one this Watcher saw of the key's current incarnation: a relist that
// finds a malformed value keeps the previous view's value only if the key has not been deleted and
// re-created since (its create revision says so), so a deleted block is never resurrected; a good
// value written and then overwritten by a malformed one while the watch was down is never seen, and
// the older good value stays. Block invariants beyond the CIDR (calico.Block.Validate) are not
// checked: routing needs only the owner and the borrowed addresses.
//
// A field of a resource that decodes but cannot be used as written (calico.FieldProblem: a pool
// mode Calico would refuse, a Node address or VTEP MAC that does not parse, a FelixConfiguration
// setting out of range) does not make the value malformed: the resource is kept with the problem
// recorded (calico.NodeFamily.Problems, Snapshot.TunnelProblems; a pool's calico.IPPool.EncapProblems),
// and the problem is logged once per key when it appears and counted in
// vpp_route_agent_field_problems_total{kind,field}. A pool whose modes have problems is kept with its
// modes as written: calico.IPPool.Encap gives felix's reading of them, and whether to re-encapsulate
// on such a value is the consumer's decision.
//
// Only routing data is kept in memory (Block, Peer, calico.IPPool, calico.Node without its labels,
// the two FelixConfigurations' tunnel settings), not the raw values; FelixConfigurations of other
// nodes are not decoded at all.
package blockwatch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/internal/backoff"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/metadata"
)

// Backoff between failed list or watch attempts.
const (
	backoffBase = 100 * time.Millisecond
	backoffMax  = 5 * time.Second
	// healthyWatch is how long a watch must have run for the backoff to start again from backoffBase.
	healthyWatch = 2 * backoffMax
	// maxBatch bounds how many ready watch responses are folded into one snapshot.
	maxBatch = 256
)

// ErrRunning is returned by Run when another Run of the same Watcher is active.
var ErrRunning = errors.New("blockwatch: Run is already running")

// Status is the state of a Watcher's connection to etcd.
type Status struct {
	// Synced is true while the watches are established and answering: false while listing or backing
	// off, which includes the relist that follows a probe of the watch stream (sent after
	// ProbeInterval of silence) left unanswered for 2×ProbeInterval.
	Synced bool
	// Revision is the highest etcd revision applied to the view.
	Revision int64
	// LastError is the last list or watch error ("" if none yet); it is kept after recovery.
	LastError string
	// Relists counts completed lists after the initial one. Revision and Relists advance only after
	// the snapshot that reflects them has been emitted.
	Relists uint64
	// Ownership and Problem are those of the last snapshot emitted (Snapshot.Ownership and
	// Snapshot.Problem).
	Ownership Ownership
	Problem   string
}

// Watcher lists and watches the block (or affinity), hosts, pool, Node and FelixConfiguration
// prefixes, and the IPAM config unless ownership comes from the blocks, and emits snapshots on
// Updates.
type Watcher struct {
	cfg     Config
	dec     decoder
	log     *slog.Logger
	metrics *metrics
	// prefixes are the watched prefixes ("" for a source not watched), set by each list from the
	// ownership source (owned by Run).
	prefixes [numSources]string
	// source is where the next list reads block owners from (owned by Run).
	source   Ownership
	streamID string // isolates the Watcher's gRPC watch stream from other watches on the client
	attempt  int    // counts watch attempts: each gets a stream of its own (owned by Run)

	updates chan *Snapshot
	listing chan *Listed
	relist  chan struct{}
	running atomic.Bool

	// view is owned by the goroutine running Run.
	view *cache
	// compactRev is the compaction revision of the last ErrCompacted watch response; owned by Run.
	compactRev int64

	mu     sync.Mutex // guards status
	status Status

	// testHookPage, when set, runs after every list page (tests only).
	testHookPage func(src source, page int)
}

// New returns a Watcher for cfg; it does no I/O. Run starts it.
func New(cfg Config) (*Watcher, error) {
	if cfg.Client == nil {
		return nil, errors.New("blockwatch config: Client is nil")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	w := &Watcher{
		cfg:     cfg,
		dec:     newDecoder(cfg),
		log:     cfg.Logger.With("component", "blockwatch"),
		metrics: m,
		source:  cfg.Ownership,
		updates: make(chan *Snapshot, 1),
		listing: make(chan *Listed, 1),
		relist:  make(chan struct{}, 1),
	}
	if w.source == OwnershipAuto {
		w.source = "" // chosen by the first list (initialOwnership)
	}
	w.prefixes = w.prefixesFor(w.source)
	w.streamID = fmt.Sprintf("%p", w)
	return w, nil
}

// Updates delivers snapshots. It has capacity 1 and coalesces: if the consumer has not taken the
// previous snapshot, the new one replaces it and carries the union of both change sets (Full ORed,
// the earliest ReceivedAt), so a consumer that only reads the latest still sees every changed key.
// The Watcher never blocks on the consumer.
func (w *Watcher) Updates() <-chan *Snapshot { return w.updates }

// Relist asks Run to relist everything and emit a Full snapshot (reason "requested"). It never
// blocks; requests made before Run has taken the previous one are merged.
func (w *Watcher) Relist() {
	select {
	case w.relist <- struct{}{}:
	default:
	}
}

// Status reports whether the watch is established and in sync, the revision, and the last error.
func (w *Watcher) Status() Status {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.status
}

// Run lists and watches until ctx is done, then returns nil. It never returns on etcd errors: it
// backs off (capped at 5s, jittered, honouring ctx) and relists. Every goroutine it starts has
// stopped when it returns. Only one Run may be active at a time (ErrRunning); a later Run continues
// from the view the previous one left.
func (w *Watcher) Run(ctx context.Context) error {
	if !w.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer w.running.Store(false)
	defer w.setSynced(false)

	reason := ReasonInitial
	if w.view != nil {
		reason = ReasonRestarted
	}
	bo := backoff.Backoff{Base: backoffBase, Max: backoffMax}
	var at int64 // the revision to list at after a compaction (0: the current one)
	for {
		// A Relist request made before the list starts is served by this list.
		select {
		case <-w.relist:
		default:
		}
		if w.source == "" {
			o, err := w.initialOwnership(ctx)
			if ctx.Err() != nil {
				return nil
			}
			if err != nil {
				w.failed(err)
				if !w.sleep(ctx, bo.Next()) {
					return nil
				}
				continue
			}
			w.source = o
		}
		full, err := w.list(ctx, reason, at)
		if at != 0 && (errors.Is(err, rpctypes.ErrCompacted) || errors.Is(err, rpctypes.ErrFutureRev)) {
			// Compacted again, or a member behind that revision: list at the current one.
			w.log.Info("cannot list at the compaction revision; listing at the current one", "revision", at, "err", err)
			at = 0
			full, err = w.list(ctx, reason, 0)
		}
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, errOwnershipChanged) {
			// list has switched w.source: list again from the other source.
			w.log.Info("the IPAM config changed during the list; listing again", "ownership", w.source)
			at = 0
			continue
		}
		if err != nil {
			// Any other failure retries at the same revision, after the backoff.
			w.failed(err)
			if !w.sleep(ctx, bo.Next()) {
				return nil
			}
			continue
		}
		at = 0
		started := time.Now()
		reason, err = w.watch(ctx, full)
		if ctx.Err() != nil {
			return nil
		}
		w.setSynced(false)
		if time.Since(started) >= healthyWatch {
			bo.Reset()
		}
		if err != nil {
			w.failed(err)
		}
		switch reason {
		case ReasonRequested:
		case ReasonOwnership:
			// The watch waited its share of the spread before it returned.
			w.source = w.view.ipam.want(w.source)
		case ReasonCompacted:
			// Every watcher behind one gRPC proxy learns of a compaction at the same moment: spread
			// the relists, and read at the compaction revision, so that the proxy can answer most of
			// them from its cache (see Config.CompactedRelistSpread). Never below the view's revision:
			// another prefix's watch or a progress notification may have taken the view past the
			// compaction, and a Full snapshot from before it would undo changes already emitted.
			at = max(w.compactRev, w.view.rev)
			if spread := w.relistSpread(); spread > 0 && !w.sleep(ctx, rand.N(spread)) {
				return nil
			}
		default:
			if !w.sleep(ctx, bo.Next()) {
				return nil
			}
		}
	}
}

// relistSpread is the window over which the relists after a compaction are spread: the configured
// spread per started hundred registered nodes, as every node relists at once and the time they need
// together grows with their number.
func (w *Watcher) relistSpread() time.Duration {
	if w.cfg.CompactedRelistSpread <= 0 {
		return 0
	}
	return w.cfg.CompactedRelistSpread * time.Duration(1+len(w.view.peers)/100)
}

// sleep waits d, and reports false if ctx ended first. A Relist request ends the wait early (and is
// left for the list to take).
func (w *Watcher) sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
	case <-w.relist:
	}
	return true
}

func (w *Watcher) failed(err error) {
	w.log.Warn("etcd list or watch failed; relisting", "err", err)
	w.lostSync(err)
}

// lostSync records that the view is no longer known to be current, and why.
func (w *Watcher) lostSync(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.status.Synced = false
	w.status.LastError = err.Error()
}

func (w *Watcher) setSynced(synced bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.status.Synced = synced
}

// watch watches the listed prefixes from the revision of the Full snapshot full until a watch
// fails, a relist is requested or ctx ends. It emits full once the watches are established (or have
// failed: the view has been replaced, so the snapshot must go out either way), then a snapshot for
// every batch of responses that changes routing data. It returns the relist reason and the error
// that ended it (nil for a requested relist).
//
// Each source's watch has a goroutine forwarding its responses, in order, to one channel (forward),
// so that one select serves every source; they, and the probe's, stop with the watch's context,
// and watch returns only once they have.
func (w *Watcher) watch(ctx context.Context, full *Snapshot) (string, error) {
	rev := full.Revision
	// The client shares one gRPC stream between watches whose contexts carry the same metadata; a
	// key of our own keeps our probes (and anything the server broadcasts per stream) to our watches.
	// A new attempt gets a new stream: the client would otherwise add the new watches to the old
	// stream if it is still open, and a stream stuck on a frozen member stays open for as long as the
	// gRPC keepalive takes to give up on the connection (10 s and more).
	w.attempt++
	wctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(
		clientv3.WithRequireLeader(ctx), "blockwatch-stream", fmt.Sprintf("%s-%d", w.streamID, w.attempt)))
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()

	events, established := w.startWatches(wctx, cancel, rev, &wg)
	w.emitFull(full, established)
	if !established {
		return ReasonWatchError, fmt.Errorf("create watches from revision %d: not established within %s",
			rev, w.cfg.RequestTimeout)
	}
	p := prober{probe: make(chan int64, 1), answered: make(chan struct{}, 1), lastHeard: time.Now()}
	wg.Go(func() { w.probeLoop(wctx, p.probe, p.answered) })
	// Ticks a few times per interval, so that silence and an unanswered probe are seen within a
	// quarter interval of their deadline.
	ticker := time.NewTicker(w.cfg.ProbeInterval / 4)
	defer ticker.Stop()
	for {
		var reason string
		var err error
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-w.relist:
			return ReasonRequested, nil
		case now := <-ticker.C:
			reason, err = w.tick(&p, now)
		case <-p.answered:
			p.lastHeard, p.probeSent = time.Now(), time.Time{}
			w.setSynced(true)
		case ev := <-events:
			reason, err = w.applyBatch(ev, events, rev, &p)
		}
		if reason != "" {
			return reason, err
		}
	}
}

// watchEvent is one response of one source's watch, or the end of its channel (ok false).
type watchEvent struct {
	src  source
	resp clientv3.WatchResponse
	ok   bool
}

// startWatches creates a watch of every listed prefix from rev, each forwarded to the returned
// channel by a goroutine of wg that stops with wctx. Creating a watch blocks until the server has
// created it: established is false if that took longer than the request timeout (cancel has then
// ended wctx).
func (w *Watcher) startWatches(wctx context.Context, cancel context.CancelFunc, rev int64, wg *sync.WaitGroup) (<-chan watchEvent, bool) {
	deadline := time.AfterFunc(w.cfg.RequestTimeout, cancel)
	events := make(chan watchEvent)
	for src, prefix := range w.prefixes {
		if prefix == "" {
			continue
		}
		// From rev, not rev+1: see the package comment.
		key, end := keyRange(source(src), prefix)
		wch := w.cfg.Client.Watch(wctx, key, clientv3.WithRange(end), clientv3.WithRev(rev), clientv3.WithProgressNotify())
		wg.Go(func() { forward(wctx, source(src), wch, events) })
	}
	return events, deadline.Stop()
}

// forward sends the responses of one source's watch to events, in order, then the end of its
// channel; it returns when it has sent that, or when wctx ends.
func forward(wctx context.Context, src source, wch clientv3.WatchChan, events chan<- watchEvent) {
	for {
		var ev watchEvent
		select {
		case ev.resp, ev.ok = <-wch:
			ev.src = src
		case <-wctx.Done():
			return
		}
		select {
		case events <- ev:
		case <-wctx.Done():
			return
		}
		if !ev.ok {
			return
		}
	}
}

// emitFull emits the Full snapshot of a list and records its revision in the status.
func (w *Watcher) emitFull(full *Snapshot, established bool) {
	w.emit(full)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.status.Revision, w.status.Synced = full.Revision, established
	w.status.Ownership, w.status.Problem = full.Ownership, full.Problem
	if full.RelistReason != ReasonInitial {
		w.status.Relists++
	}
}

// prober is the watch loop's knowledge of whether its stream answers (see probeLoop), and when to
// switch the ownership source.
type prober struct {
	probe    chan int64    // to probeLoop: probe the stream (from this revision)
	answered chan struct{} // from probeLoop: a probe was acknowledged
	// lastHeard is when the stream last answered; probeSent when the unanswered probe was sent
	// (zero if none).
	lastHeard, probeSent time.Time
	// switchAt is when to relist from the other ownership source the IPAM config asks for; zero if
	// it asks for the one in force.
	switchAt time.Time
}

// tick checks, at now, whether the ownership source must switch, whether the stream has been silent
// long enough to probe, and whether the probe has gone unanswered too long. It returns the relist
// reason ("" for none) and the error that goes with it.
func (w *Watcher) tick(p *prober, now time.Time) (string, error) {
	if !p.switchAt.IsZero() && !now.Before(p.switchAt) {
		return ReasonOwnership, nil
	}
	switch {
	case p.probeSent.IsZero() && now.Sub(p.lastHeard) >= w.cfg.ProbeInterval:
		select {
		case p.probe <- w.view.rev:
		default:
		}
		p.probeSent = now
	case !p.probeSent.IsZero() && now.Sub(p.probeSent) >= 2*w.cfg.ProbeInterval:
		err := fmt.Errorf("etcd watch stalled: probe not answered for %s (silent for %s)",
			now.Sub(p.probeSent).Round(time.Millisecond), now.Sub(p.lastHeard).Round(time.Millisecond))
		if w.reconnecting() {
			// The client has lost its connection (etcd or the gRPC proxy restarts) and resumes the
			// watches where they were once it is back: a relist would make every watcher of a
			// restarted proxy list everything again. Report it and probe again.
			w.lostSync(err)
			p.probeSent = time.Time{}
			return "", nil
		}
		// The member serving the stream does not answer (frozen, partitioned, overloaded): watch
		// again on a new stream, which the client places on a member that answers.
		return ReasonWatchError, err
	}
	return "", nil
}

// applyBatch applies ev and the responses already waiting on events (up to maxBatch more), emits one
// snapshot if they changed routing data, and updates the status. It returns the relist reason ("" for
// none) and the error that goes with it.
func (w *Watcher) applyBatch(ev watchEvent, events <-chan watchEvent, listed int64, p *prober) (string, error) {
	var ch changes
	reason, err := w.handle(ev, listed, &ch)
batch:
	for n := 0; err == nil && n < maxBatch; n++ {
		select {
		case ev = <-events:
			reason, err = w.handle(ev, listed, &ch)
		default:
			break batch
		}
	}
	// Changes applied before an error are emitted first: the relist diffs against the view that
	// already holds them. Otherwise the status is updated before the snapshot goes out, so that it is
	// never behind a snapshot a consumer holds.
	var snap *Snapshot
	if !ch.empty() {
		snap = w.view.snapshot(&ch, false, "")
	}
	if err != nil {
		if snap != nil {
			w.emit(snap)
		}
		return reason, err
	}
	defer func() {
		if snap != nil {
			w.emit(snap)
		}
	}()
	p.lastHeard, p.probeSent = time.Now(), time.Time{}
	p.switchAt = w.scheduleSwitch(p.switchAt)
	problem := w.view.problem()
	w.mu.Lock()
	w.status.Revision = w.view.rev
	w.status.Synced = true
	was := w.status.Problem
	w.status.Problem = problem
	w.mu.Unlock()
	if problem != was {
		if problem != "" {
			w.log.Warn(problem)
		} else {
			w.log.Info("the IPAM config has strict affinity on again: ownership from the affinities is complete")
		}
	}
	if !p.switchAt.IsZero() && !time.Now().Before(p.switchAt) {
		return ReasonOwnership, nil
	}
	return "", nil
}

// scheduleSwitch returns when the watch must end to relist from the ownership source the IPAM
// config asks for (OwnershipAuto): at, if already scheduled; a random time within the relist spread
// from now if newly asked for; zero if the source in force is the one asked for.
func (w *Watcher) scheduleSwitch(at time.Time) time.Time {
	if w.cfg.Ownership != OwnershipAuto || w.view.ipam.want(w.view.ownership) == w.view.ownership {
		return time.Time{}
	}
	if !at.IsZero() {
		return at
	}
	var wait time.Duration
	if spread := w.relistSpread(); spread > 0 {
		wait = rand.N(spread)
	}
	w.log.Info("strict affinity changed in the IPAM config; switching the ownership source",
		"from", w.view.ownership, "to", w.view.ipam.want(w.view.ownership), "in", wait.Round(time.Millisecond))
	return time.Now().Add(wait)
}

// handle applies one watch response to the view, or returns the relist reason and error it carries.
// Events of revision listed or older (the watch starts at the list's revision) are already in the view
// and skipped.
func (w *Watcher) handle(ev watchEvent, listed int64, ch *changes) (string, error) {
	src, resp := ev.src, ev.resp
	prefix := w.prefixes[src]
	if !ev.ok {
		return ReasonWatchClosed, fmt.Errorf("watch %s: channel closed", prefix)
	}
	if err := resp.Err(); err != nil {
		if resp.CompactRevision != 0 || errors.Is(err, rpctypes.ErrCompacted) {
			w.compactRev = resp.CompactRevision
			return ReasonCompacted, fmt.Errorf("watch %s (compacted at revision %d): %w", prefix, resp.CompactRevision, err)
		}
		return ReasonWatchError, fmt.Errorf("watch %s: %w", prefix, err)
	}
	if resp.Canceled {
		return ReasonWatchError, fmt.Errorf("watch %s: canceled by the server", prefix)
	}
	if ch.received.IsZero() {
		ch.received = time.Now()
	}
	v := w.view
	for _, ev := range resp.Events {
		if ev.Kv.ModRevision <= listed {
			continue
		}
		w.metrics.event(src, ev.Type)
		d := w.decode(src, ev.Kv, ev.Type == mvccpb.DELETE)
		w.install(v, v, &d, ch)
		v.rev = max(v.rev, ev.Kv.ModRevision)
	}
	if resp.IsProgressNotify() {
		v.rev = max(v.rev, resp.Header.Revision)
	}
	return "", nil
}

// reconnecting reports whether the client's connection is down (connecting or failing), as opposed
// to up but not answering.
func (w *Watcher) reconnecting() bool {
	conn := w.cfg.Client.ActiveConnection()
	return conn != nil && conn.GetState() != connectivity.Ready
}

// probeLoop checks, whenever the watch loop finds the watch stream silent, that the stream still
// answers: it opens one more watch (of the pools prefix, from the revision after rev) on the same
// stream and reports on answered when its creation is acknowledged, then cancels it. This is what
// shows a dead stream in Status while the client reconnects behind the scenes.
//
// A watch creation is acknowledged at once by etcd and by etcd's gRPC proxy (which joins it to the
// watch it already has of that prefix, without asking etcd). A progress request is not: etcd answers
// it only once the store's revision has reached the start revision of every watch on the stream (so
// never on a store idle since the list), and the gRPC proxy ignores it.
func (w *Watcher) probeLoop(wctx context.Context, probe <-chan int64, answered chan<- struct{}) {
	for {
		select {
		case <-wctx.Done():
			return
		case rev := <-probe:
			// The client creates a stream for a request whose stream has gone; do not ask once the
			// watches are being torn down.
			if wctx.Err() != nil {
				return
			}
			if w.probeOnce(wctx, rev) {
				select {
				case answered <- struct{}{}:
				default:
				}
			}
		}
	}
}

// probeOnce opens and cancels a probe watch; it reports whether the creation was acknowledged within
// the request timeout.
func (w *Watcher) probeOnce(wctx context.Context, rev int64) bool {
	pctx, cancel := context.WithTimeout(wctx, w.cfg.RequestTimeout)
	defer cancel()
	ch := w.cfg.Client.Watch(pctx, w.prefixes[srcPools], clientv3.WithPrefix(), clientv3.WithRev(rev+1),
		clientv3.WithCreatedNotify())
	for resp := range ch {
		if resp.Created {
			return resp.Err() == nil
		}
	}
	if wctx.Err() == nil {
		w.log.Debug("etcd watch probe not acknowledged", "timeout", w.cfg.RequestTimeout)
	}
	return false
}

func (w *Watcher) malformed(src source, key string, rev int64, err error) {
	w.metrics.malformedValue(src)
	w.log.Warn("skipping malformed etcd value", "source", src.String(), "key", key, "mod_revision", rev, "err", err)
}

// emit hands s to the consumer without blocking, folding it into the snapshot the consumer has not
// taken yet, if any.
func (w *Watcher) emit(s *Snapshot) {
	if !sendMerged(w.updates, s, coalesce) {
		w.log.Error("blockwatch: snapshot dropped: Updates has another sender")
	}
}

// sendMerged sends v on ch (of capacity 1) without blocking, merged with the value the consumer has
// not taken yet, if any. It fails only if ch has another sender: for its one sender, once the channel
// is drained the send cannot fail.
func sendMerged[T any](ch chan T, v T, merge func(old, new T) T) bool {
	select {
	case ch <- v:
		return true
	default:
	}
	select {
	case old := <-ch:
		v = merge(old, v)
	default:
	}
	select {
	case ch <- v:
		return true
	default:
		return false
	}
}
