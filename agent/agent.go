// Package agent is the reconciler of vpp-route-agent: it keeps the routes this node owns in the VPP FIB
// equal to the routes derived from the latest complete view of Calico's blocks and the registered peers.
//
// One goroutine (Run) owns all reconcile state. It is level-triggered: a full resync dumps VPP's table,
// takes as "owned" exactly the API-sourced routes in the table whose every path goes via the uplink and
// whose prefix lies in a managed pool, and adds, replaces, then deletes until owned == desired. VPP tells
// the API source apart with ip_route_v2_dump; a VPP without it is dumped with ip_route_dump, and a route
// that stays after the agent deleted it (VPP's own recursive-resolution or adjacency /32) is foreign from
// then on. Full resyncs run at start, after every VPP (re)connect, after every etcd relist and every
// ResyncInterval; between them each etcd change updates only the route prefixes it touches. An uplink
// that VPP has not created yet is waited for, polled every 100ms.
//
// Every full resync looks the uplink up again, and VPP's interface events say at once when it is
// deleted. VPP keeps the routes through a deleted interface, dumped as before, but they drop their
// traffic for good, even once an interface of the same name takes the same index again (measured on
// 26.06). So an uplink found missing is waited for like a late one, and once it is back (set up again)
// every route through it, or through the index it had, is deleted and added anew.
//
// A desired prefix that a route not the agent's holds (another client's, an interface address's, whose
// API route VPP's dump by source then leaves out) is left alone, logged once and counted as a conflict.
// A VPP that leaves a request unanswered is left alone until it answers (vppapi.Status.Stalled), so that
// etcd's changes are still taken and /readyz names VPP.
//
// At start the routes are programmed while etcd is being listed: each part of the first list
// (blockwatch.Listed) goes into the desired routes, and those VPP has no route for are added at once,
// against a dump of the table taken when the first part came. Nothing is replaced or deleted before
// the list is complete; its full resync then uses that dump and the adds VPP acknowledged since,
// instead of dumping the table again.
//
// Deletes happen only from a complete, fresh view: never while the watch is out of sync (etcd down),
// never inside a block whose value cannot be read (held: its key names the CIDR), and a route whose
// owner's registration disappeared — or was refused as a next hop (CheckNextHop, this node's own
// address, an address another node registered first) — is kept for PeerLossGrace before it is
// withdrawn.
package agent

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"maps"
	"net/netip"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/blockwatch"
	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/internal/liveness"
	"github.com/vpp-route-agent/vpp-route-agent/internal/netaddr"
	"github.com/vpp-route-agent/vpp-route-agent/vppapi"
)

// Dataplane is what the agent needs of VPP; *vppapi.Client implements it.
type Dataplane interface {
	Events() <-chan vppapi.Event
	SetupUplink(ctx context.Context, u vppapi.Uplink) (uint32, error)
	LookupUplink(ctx context.Context, u vppapi.Uplink) (uint32, error)
	EnsureTable(ctx context.Context, tableID uint32) error
	DumpRoutes(ctx context.Context, tableID uint32) ([]vppapi.FIBEntry, error)
	DumpAPIRoutes(ctx context.Context, tableID uint32) ([]vppapi.FIBEntry, error)
	DumpBestRoutes(ctx context.Context, tableID uint32) ([]vppapi.FIBEntry, error)
	Apply(ctx context.Context, adds, deletes []vppapi.Route) vppapi.Result
	Status() vppapi.Status
	InterfaceMTU(ctx context.Context, swIfIndex uint32) (uint32, error)
	EnsureIPIPTunnel(ctx context.Context, spec vppapi.IPIPSpec) (uint32, error)
	DumpIPIPTunnels(ctx context.Context) ([]vppapi.IPIPTunnel, error)
	IPIPTunnelAt(ctx context.Context, swIfIndex uint32) (vppapi.IPIPTunnel, bool, error)
	SetTunnelMTU(ctx context.Context, swIfIndex, mtu uint32) error
	DeleteIPIPTunnel(ctx context.Context, swIfIndex uint32) error
	EnsureVXLANTunnel(ctx context.Context, spec vppapi.VXLANSpec) (uint32, error)
	DumpVXLANTunnels(ctx context.Context) ([]vppapi.VXLANTunnel, error)
	DeleteVXLANTunnel(ctx context.Context, spec vppapi.VXLANSpec) error
	EnsureNeighbor(ctx context.Context, swIfIndex uint32, ip netip.Addr, mac vppapi.MAC) error
	DeleteNeighbor(ctx context.Context, swIfIndex uint32, ip netip.Addr) error
	DumpNeighbors(ctx context.Context, swIfIndex uint32) ([]vppapi.Neighbor, error)
	HasBFD() bool
	AddBFDSession(ctx context.Context, s vppapi.BFDSession) error
	ModifyBFDSession(ctx context.Context, s vppapi.BFDSession) error
	DeleteBFDSession(ctx context.Context, k vppapi.BFDKey) error
	DumpBFDSessions(ctx context.Context) ([]vppapi.BFDSessionState, error)
	BFDEvents() <-chan vppapi.BFDEvent
	BFDResync() <-chan struct{}
}

// Source is the agent's view of etcd; *blockwatch.Watcher implements it.
type Source interface {
	Updates() <-chan *blockwatch.Snapshot
	// Listing delivers the parts of the first list before its Full snapshot (see blockwatch.Listed).
	Listing() <-chan *blockwatch.Listed
	Status() blockwatch.Status
	Relist()
}

// Registration reports whether this node's peer IPs are registered, and if not because of a
// conflict, what it is; *Registrar implements it.
type Registration interface {
	Up() bool
	Problem() string
}

var (
	_ Dataplane    = (*vppapi.Client)(nil)
	_ Source       = (*blockwatch.Watcher)(nil)
	_ Registration = (*Registrar)(nil)
)

// Config is the reconciler's configuration.
type Config struct {
	// NodeName is this node; its own blocks get no route.
	NodeName string
	// TableID is the VPP FIB table the agent programs (both families).
	TableID uint32
	// Pools are the managed pool CIDRs; nil means the enabled Calico IP pools from etcd.
	Pools []netip.Prefix
	// Uplink is the interface routes go out of; when it has Addresses the agent configures them.
	Uplink vppapi.Uplink
	// MoreUplinks are the further uplinks of a multi-homed node, after Uplink in --uplink-interface
	// order. A remote block's route goes over every (uplink, owner's peer IP on that uplink's subnet)
	// pair as one ECMP route; tunnels use Uplink only.
	MoreUplinks []vppapi.Uplink
	// ResyncInterval is the period of the full resync that repairs drift.
	ResyncInterval time.Duration
	// PeerLossGrace is how long routes to a node whose registration vanished are kept; 0 withdraws
	// them at once (the daemon's default is DefaultPeerLossGrace).
	PeerLossGrace time.Duration
	// SyncTimeout bounds one full resync (dump and apply).
	SyncTimeout time.Duration
	// DryRun computes and logs FIB changes and writes nothing to VPP.
	DryRun bool
	// WithdrawOnExit removes every owned route when Run ends.
	WithdrawOnExit bool
	// PeerIPs are this node's own peer IPs (the uplink addresses are counted too): another node that
	// registers one of them is refused as a next hop.
	PeerIPs []netip.Addr
	Logger  *slog.Logger
	// EtcdHealth, when set, says why etcd cannot serve ("" when it can); Ready reports it.
	EtcdHealth EtcdHealth
	// BFD configures the BFD sessions to the other nodes (see bfd.go); off by default.
	BFD BFDConfig
}

// Defaults of Config.
const (
	DefaultResyncInterval = 90 * time.Second
	DefaultPeerLossGrace  = 60 * time.Second
	DefaultSyncTimeout    = 2 * time.Minute
	// WithdrawTimeout bounds the removal of owned routes on exit (WithdrawOnExit).
	WithdrawTimeout = 10 * time.Second
	// uplinkPoll is how often a missing uplink is looked for. VPP creates interfaces of its startup-config
	// 2 s after it starts; polling this often (one small dump) leaves room, within 0.5 s of its appearance,
	// for a resync of 20,000 routes (0.25 s on VPP 26.06).
	uplinkPoll = 100 * time.Millisecond
	// retryDelay is how long after a failed resync or FIB write the next attempt comes.
	retryDelay = 2 * time.Second
)

// Validate checks the configuration and fills in defaults.
func (c *Config) Validate() error {
	if err := calico.CheckNodeName(c.NodeName); err != nil {
		return err
	}
	if err := checkUplinks(c.uplinks()); err != nil {
		return err
	}
	for _, p := range c.Pools {
		if !p.IsValid() || p != p.Masked() {
			return fmt.Errorf("pool %s is not a canonical prefix", p)
		}
	}
	if c.ResyncInterval == 0 {
		c.ResyncInterval = DefaultResyncInterval
	}
	if c.SyncTimeout == 0 {
		c.SyncTimeout = DefaultSyncTimeout
	}
	if c.ResyncInterval < 50*time.Millisecond || c.PeerLossGrace < 0 || c.SyncTimeout < time.Second {
		return fmt.Errorf("resync interval %s, peer-loss grace %s, sync timeout %s: out of range",
			c.ResyncInterval, c.PeerLossGrace, c.SyncTimeout)
	}
	if err := c.BFD.validate(); err != nil {
		return err
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// uplinks returns Uplink and MoreUplinks, in order.
func (c *Config) uplinks() []vppapi.Uplink {
	return append([]vppapi.Uplink{c.Uplink}, c.MoreUplinks...)
}

// checkUplinks reports a missing interface, an interface or an address given for two uplinks.
func checkUplinks(us []vppapi.Uplink) error {
	names := map[string]int{}
	indexes := map[uint32]int{}
	addrs := map[netip.Addr]int{}
	for i, u := range us {
		n := i + 1
		switch {
		case u.Name == "" && !u.HasIndex:
			return fmt.Errorf("uplink %d: no interface: give its name or its sw_if_index", n)
		case u.Name != "":
			if m, dup := names[u.Name]; dup {
				return fmt.Errorf("uplinks %d and %d are both interface %s", m, n, u.Name)
			}
			names[u.Name] = n
		default:
			if m, dup := indexes[u.SwIfIndex]; dup {
				return fmt.Errorf("uplinks %d and %d are both sw_if_index %d", m, n, u.SwIfIndex)
			}
			indexes[u.SwIfIndex] = n
		}
		for _, p := range u.Addresses {
			if m, dup := addrs[p.Addr()]; dup && m != n {
				return fmt.Errorf("address %s is on uplinks %d and %d", p.Addr(), m, n)
			}
			addrs[p.Addr()] = n
		}
	}
	return nil
}

// options are the Options of this agent's view.
func (c *Config) options() Options {
	o := Options{NodeName: c.NodeName, Pools: c.Pools, PeerIPs: slices.Clone(c.PeerIPs)}
	for _, u := range c.uplinks() {
		for _, p := range u.Addresses {
			o.PeerIPs = append(o.PeerIPs, p.Addr())
			o.UplinkPrefixes = append(o.UplinkPrefixes, p)
		}
	}
	return o
}

// Agent reconciles the VPP FIB with the desired routes.
type Agent struct {
	cfg Config
	dp  Dataplane
	src Source
	reg Registration
	log *slog.Logger
	m   *Metrics

	// Owned by Run.
	snap            *blockwatch.Snapshot
	desired         *desiredSet
	pools           []netip.Prefix
	programmed      map[netip.Prefix]vppapi.Route
	programmedValid bool // programmed was read from VPP since the last (re)connect
	// listedRev is the revision of the first list's parts in desired (0: none); dumpedListing says that
	// the table was dumped while that list went on (programmed and foreign are that dump and this
	// agent's acknowledged adds since), for the first full resync to use.
	listedRev     int64
	listedTotal   int // the blocks etcd counted for that list: room to make in programmed
	dumpedListing bool
	// foreign are the prefixes in the managed pools whose entry in the table is not the agent's, with the
	// source it forwards with (0: not known, a dump by paths).
	foreign map[netip.Prefix]vppapi.Source
	// takenOver are the desired prefixes a foreign entry holds, as last logged (see noteConflicts).
	takenOver map[netip.Prefix]struct{}
	// dumpMode is how the last dump told the routes of the agent apart (dumpBySource, dumpAll); "" before any.
	dumpMode string
	// deleted are the routes VPP acknowledged deleting since the last dump, and undeletable the prefixes
	// of routes VPP kept after such a delete: its own entries, foreign from then on (ip_route_dump only).
	deleted     map[netip.Prefix]vppapi.Route
	undeletable map[netip.Prefix]struct{}
	// uplinks are the uplinks' states, Config.Uplink first; the first is the one tunnels use.
	uplinks []*uplinkState
	// tun are the agent's tunnels (and others' it must leave alone), read from VPP with each dump;
	// tunnelsRead says they were read since VPP (re)connected.
	tun         tunnelState
	tunnelsRead bool
	// tunPending are the tunnels this process asked VPP for whose set-up did not finish (the reply or a
	// later step lost with the connection): VPP may have made one, untagged. Such a tunnel is the
	// agent's, not another's, and the next creation finishes it (VPP answers with the existing index).
	tunPending map[tunnelKey]struct{}
	// tunnelCfg is this node's FelixConfiguration tunnel settings, from the latest snapshot or, while the
	// first list goes on, its parts (tunnels made then get their MTU from it too).
	tunnelCfg calico.TunnelConfig
	// encapLogged are the pools whose modes the agent logged about (VXLAN pending, problems), by name,
	// with what it logged.
	encapLogged map[string]string
	// mtuWarned is the last MTU warning logged ("" none).
	mtuWarned string
	// ownNode is this node's Calico Node resource (its VTEP MAC), from the latest snapshot.
	ownNode calico.Node
	// vxlanMissingLogged says that the missing vxlan plugin was logged since VPP (re)connected.
	vxlanMissingLogged bool
	// encapCountAt is when the routes-by-encapsulation gauge was last computed.
	encapCountAt time.Time
	vppUp        bool
	needFull     string                   // reason of a full resync that is due as soon as it can run
	missingSince map[peerFamily]time.Time // registrations seen missing, for the peer-loss grace
	retry        *time.Timer
	retryKind    string // the resync kind the retry timer runs
	grace        *time.Timer
	graceAt      time.Time // when grace fires; zero when not armed
	// offUplink are the peer IPs found on no uplink's subnet, as logged (see hopsOf).
	offUplink map[netip.Addr]struct{}
	// gapLogged are the nodes whose registration has a gap in its indexes, as logged (see trackPeers).
	gapLogged map[string]struct{}
	// bfd are the agent's BFD sessions (bfd.go).
	bfd bfdState

	// live marks the reconcile loop's turns and the deadline of the VPP work it does now: the loop
	// is alive until then even if it does not turn.
	live        liveness.Loop
	debugWanted atomic.Bool // DebugRoutes asked for a fresh state
	debugPub    atomic.Pointer[debugState]
	debugAt     time.Time // when the loop last published debugPub; owned by Run

	mu   sync.Mutex // guards view
	view readiness
}

type readiness struct {
	snapshotApplied bool
	vppConnected    bool // as the reconcile loop last saw it
	uplinkReady     bool
	waitingUplink   []string // the uplinks VPP lacks
	resynced        bool
	etcdSynced      bool
	// noVXLAN counts the routes that need VXLAN while VPP has no vxlan plugin.
	noVXLAN int
	// bfdNotes are Notes.
	bfdNotes []string
}

// New returns an agent; reg may be nil when nothing is registered (dry runs, tests).
func New(cfg Config, dp Dataplane, src Source, reg Registration, m *Metrics) (*Agent, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	a := &Agent{
		cfg: cfg, dp: dp, src: src, reg: reg, log: cfg.Logger,
		desired:      newDesiredSet(cfg.options().peerCheck()),
		programmed:   map[netip.Prefix]vppapi.Route{},
		foreign:      map[netip.Prefix]vppapi.Source{},
		takenOver:    map[netip.Prefix]struct{}{},
		deleted:      map[netip.Prefix]vppapi.Route{},
		undeletable:  map[netip.Prefix]struct{}{},
		missingSince: map[peerFamily]time.Time{},
		tun:          newTunnelState(),
		encapLogged:  map[string]string{},
		offUplink:    map[netip.Addr]struct{}{},
		gapLogged:    map[string]struct{}{},
		bfd:          newBFDState(),
		m:            m.orNop(),
	}
	for _, u := range cfg.uplinks() {
		a.uplinks = append(a.uplinks, &uplinkState{cfg: u})
	}
	a.live.Turn()
	return a, nil
}

// Run reconciles until ctx is done. It returns nil on cancellation; it never gives up on VPP or etcd.
func (a *Agent) Run(ctx context.Context) error {
	resync := time.NewTicker(a.cfg.ResyncInterval)
	defer resync.Stop()
	beat := time.NewTicker(time.Second)
	defer beat.Stop()
	a.retry = stoppedTimer()
	a.grace = stoppedTimer()
	defer a.retry.Stop()
	defer a.grace.Stop()
	for {
		select {
		case <-ctx.Done():
			if a.cfg.WithdrawOnExit {
				a.withdrawAll()
			}
			return nil
		case snap := <-a.src.Updates():
			a.onSnapshot(ctx, snap)
		case part := <-a.src.Listing():
			a.onListed(ctx, part)
		case ev := <-a.dp.Events():
			a.onVPPEvent(ctx, ev)
		case ev := <-a.dp.BFDEvents():
			a.onBFDEvent(ev)
		case <-a.dp.BFDResync():
			a.bfd.dumpDue = true
			a.withBusy(ctx, func(ctx context.Context) { a.syncBFD(ctx, true) })
		case <-resync.C:
			a.fullSync(ctx, "periodic")
		case <-a.retry.C:
			a.fullSync(ctx, a.retryKind)
		case <-a.grace.C:
			a.expireGrace(ctx)
		case <-beat.C:
		}
		if a.needFull != "" {
			a.fullSync(ctx, a.needFull)
		}
		a.publish()
	}
}

// Relist asks for a fresh list of etcd and a full resync (SIGHUP).
func (a *Agent) Relist() { a.src.Relist() }

func (a *Agent) onSnapshot(ctx context.Context, snap *blockwatch.Snapshot) {
	a.m.snapshots.Inc()
	defer a.checkMTU() // with the pools and encapsulation this snapshot leaves
	first := a.snap == nil
	if first {
		// The list's last part, sent before its snapshot, may not have been taken yet.
		select {
		case part := <-a.src.Listing():
			a.onListed(ctx, part)
		default:
		}
	}
	prev := a.snap
	a.snap = snap
	a.tunnelCfg = snap.Tunnel
	a.ownNode = snap.Nodes[a.cfg.NodeName]
	pools := ManagedPools(snap, a.cfg.Pools)
	// A pool disabled or deleted that was disabled changes which routes are parked (see parked).
	parkedChanged := prev != nil && a.cfg.Pools == nil && !slices.Equal(disabledPools(prev), disabledPools(snap))
	// A pool's mode edited, or this node's subnet changed: every route's encapsulation is decided again.
	enc := newEncapView(a.desired.check, snap.Pools, snap.Nodes)
	encapChanged := !enc.equal(a.desired.enc)
	a.noteEncap(snap)
	if snap.Full || first || !slices.Equal(pools, a.pools) || parkedChanged || encapChanged {
		a.desired.enc = enc
		if first && a.listedRev != 0 && !encapChanged && a.desired.catchUp(snap, pools) {
			a.log.Debug("the desired routes were built while listing", "blocks", snap.Blocks.Len(), "table_dumped", a.dumpedListing)
		} else {
			a.dumpedListing = false
			a.desired.reset(snap, pools)
		}
		a.listedRev, a.listedTotal = 0, 0
		a.pools = pools
		a.trackPeers()
		reason := snap.RelistReason
		if reason == "" {
			reason = "initial"
		}
		if !first && !snap.Full {
			reason = "pools"
		}
		a.needFull = "relist-" + reason
		return
	}
	dirty := a.desired.update(snap)
	a.trackPeers()
	a.releaseHeld(prev, snap, dirty)
	if snap.TunnelChanged && (a.tunnelMTU() != 0 || a.desired.enc.hasVXLAN()) {
		// The tunnels' MTU (the resync reads and sets it), the VXLAN VNI and port (new tunnels).
		a.needFull = "tunnel-config"
	}
	if slices.Contains(snap.ChangedNodes, a.cfg.NodeName) && a.desired.enc.hasVXLAN() {
		a.needFull = "vtep-mac" // this node's VTEP MAC, the MAC of its VXLAN tunnels (the resync sets it)
	}
	if !a.vppUp || !a.uplinksReady() || a.rebinding() {
		return // the full resync after (re)connect picks it up
	}
	if a.vppStalled() {
		if a.needFull == "" {
			a.needFull = "retry" // once VPP answers again
		}
		return
	}
	ctx, done := a.busy(ctx)
	defer done()
	ops := a.applyDirty(ctx, maps.Keys(dirty), a.src.Status().Synced)
	if ops > 0 && !snap.ReceivedAt.IsZero() {
		a.m.eventToFIB.Observe(time.Since(snap.ReceivedAt).Seconds())
	}
	if len(snap.ChangedPeers) > 0 {
		a.syncBFD(ctx, false) // sessions follow the peers
	}
}

// withBusy runs f with the loop marked busy on VPP (see busy).
func (a *Agent) withBusy(ctx context.Context, f func(ctx context.Context)) {
	ctx, done := a.busy(ctx)
	defer done()
	f(ctx)
}

// onListed takes a part of the first list, before its Full snapshot: its blocks go into the desired
// routes, and those of their routes VPP has no route for are added at once, while etcd is still being
// listed. Nothing is replaced or deleted before the complete view: the first full resync does that.
// The table is dumped when the first part comes (or VPP (re)connects), not again by that full resync.
// The first snapshot then only brings the desired routes up to date with what changed since the list
// (it may be folded with later changes: the agent's own registration, say).
func (a *Agent) onListed(ctx context.Context, part *blockwatch.Listed) {
	if a.snap != nil {
		return // a complete view is in charge
	}
	if part.Revision != a.listedRev {
		// The first part of the list, or of a list retried at a new revision.
		a.pools = managedPools(part.Pools, a.cfg.Pools)
		a.desired.enc = newEncapView(a.desired.check, part.Pools, part.Nodes)
		a.tunnelCfg = part.Tunnel
		a.ownNode = part.Nodes[a.cfg.NodeName]
		a.desired.begin(part.Peers, part.Nodes, a.pools, part.Total)
		a.trackPeers()
		a.listedRev, a.listedTotal = part.Revision, part.Total
	}
	a.programListed(ctx, a.desired.addBlocks(part.Blocks))
}

// programListed adds, while the first list goes on, the listed routes of the prefixes in dirty (nil:
// all) that VPP has no route for, dumping the table first if it has not been since VPP connected.
func (a *Agent) programListed(ctx context.Context, dirty map[netip.Prefix]struct{}) {
	if !a.vppUp || a.cfg.DryRun || a.vppStalled() {
		return // the first full resync adds what is missing
	}
	ctx, done := a.busy(ctx)
	defer done()
	if !a.uplinksReady() && a.setupUplinks(ctx) != nil || a.rebinding() {
		return // the full resync reports it, or re-adds every route
	}
	if !a.programmedValid {
		entries, err := a.dumpTable(ctx)
		if err != nil {
			return // the full resync reports it
		}
		owned, foreign := a.classify(entries)
		a.noteUndeletable(owned, foreign)
		a.programmed, a.foreign = owned, foreign
		a.programmedValid, a.dumpedListing = true, true
		dirty = nil // the routes of earlier parts too
	}
	var adds []vppapi.Route
	add := func(p netip.Prefix, tgt target) {
		_, have := a.programmed[p]
		_, isForeign := a.foreign[p]
		if tgt.resolved && !have && !isForeign {
			if want, ok := a.wantRoute(ctx, p, tgt, vppapi.Route{}, false); ok {
				adds = append(adds, want)
			}
		}
	}
	if dirty == nil {
		for p, tgt := range a.desired.targets {
			add(p, tgt)
		}
	}
	for p := range dirty {
		if tgt, ok := a.desired.targets[p]; ok {
			add(p, tgt)
		}
	}
	a.apply(ctx, adds, nil)
}

func (a *Agent) onVPPEvent(ctx context.Context, ev vppapi.Event) {
	if ev.Kind == vppapi.InterfaceUp {
		// Changes no route nor the table (a dump taken while listing stays good): only the BFD sessions.
		for _, u := range a.uplinks {
			if a.vppUp && u.phase == uplinkReady && ev.SwIfIndex == u.index {
				a.withBusy(ctx, func(ctx context.Context) { a.reassertBFD(ctx, u.index) })
			}
		}
		return
	}
	a.dumpedListing = false
	switch ev.Kind {
	// vppapi logs connection changes; the agent only reacts to them.
	case vppapi.Connected:
		a.vppUp = true
		a.tunnelsRead = false
		a.vxlanMissingLogged = false // this VPP may have the plugin, or lack it
		a.forgetUplinks()
		a.programmedValid = false
		a.bfd.read = false // read again by the full resync below, and adopted
		clear(a.deleted)
		if ev.Restarted {
			clear(a.bfd.sessions) // a restarted VPP has none: the full resync creates them again
			clear(a.programmed)   // a restarted VPP has an empty FIB, and no tunnels
			clear(a.undeletable)
			refused := a.tun.refused
			a.tun = newTunnelState()
			a.tun.refused = refused
		}
		a.needFull = "vpp-connect"
		if ev.Restarted {
			a.needFull = "vpp-restart"
		}
		if a.snap == nil && a.listedRev != 0 {
			a.programListed(ctx, nil) // what the first list has brought so far
		}
	case vppapi.Disconnected, vppapi.Incompatible:
		a.vppUp = false
		a.bfd.read = false
		a.forgetUplinks()
		a.programmedValid = false
		for _, u := range a.uplinks {
			a.setWaitingUplink(u, false)
		}
	case vppapi.InterfaceDeleted:
		for _, u := range a.uplinks {
			if a.vppUp && u.phase == uplinkReady && ev.SwIfIndex == u.index {
				a.uplinkLost(u, "VPP deleted it")
			}
		}
	}
}

// forgetUplinks marks every uplink as not set up since VPP (re)connected.
func (a *Agent) forgetUplinks() {
	for _, u := range a.uplinks {
		if u.phase == uplinkReady {
			u.phase = uplinkUnknown
		}
	}
}

// uplinkLost records that uplink u, which routes go through, is gone: the agent waits for an interface
// of its name (or index) again, and then re-adds every route through it (rebind).
func (a *Agent) uplinkLost(u *uplinkState, why string) {
	a.log.Warn("the uplink interface is gone from VPP: its routes drop traffic until it is back; waiting for it",
		"uplink", u.cfg.String(), "sw_if_index", u.index, "why", why, "routes", len(a.programmed))
	u.phase = uplinkWaiting // logged above, instead of setWaitingUplink's line for a first wait
	u.stale, u.lostIndex, u.lostKnown = true, u.index, true
	a.m.uplinkWaiting.Set(1)
	a.needFull = "uplink-lost"
}

// vppStalled reports whether the connected VPP is not answering (vppapi.Status.Stalled): the loop then
// leaves VPP alone, each request would only wait out its timeout, and goes on taking etcd's changes,
// so that what is missing is VPP, not a view of etcd held up behind it; a full resync runs once VPP
// answers again (or reconnects).
func (a *Agent) vppStalled() bool { return a.dp.Status().Stalled }

// errWaitingUplink is doFullSync's error while VPP has no uplink interface yet: a state, not a failure.
var errWaitingUplink = errors.New("waiting for the uplink interface")

// setupUplinks sets every uplink up (setupUplink), then the table; errWaitingUplink when VPP lacks one
// (the others are set up all the same).
func (a *Agent) setupUplinks(ctx context.Context) error {
	var waiting bool
	for _, u := range a.uplinks {
		err := a.setupUplink(ctx, u)
		if errors.Is(err, errWaitingUplink) {
			waiting = true
			continue
		}
		if err != nil {
			return err
		}
	}
	if waiting {
		return errWaitingUplink
	}
	if !a.cfg.DryRun {
		if err := a.dp.EnsureTable(ctx, a.cfg.TableID); err != nil {
			return fmt.Errorf("set up uplink: %w", err)
		}
	}
	return nil
}

// setupUplink configures (or in a dry run only looks up) uplink u.
func (a *Agent) setupUplink(ctx context.Context, u *uplinkState) error {
	var idx uint32
	var err error
	if a.cfg.DryRun {
		idx, err = a.dp.LookupUplink(ctx, u.cfg)
	} else {
		idx, err = a.dp.SetupUplink(ctx, u.cfg)
	}
	if errors.Is(err, vppapi.ErrNoInterface) {
		if u.phase == uplinkReady {
			a.uplinkLost(u, "a resync found it missing")
		} else {
			// Whatever routes the table has through it (a restarted agent's, say) are dead.
			u.stale = true
			a.setWaitingUplink(u, true)
		}
		return errWaitingUplink
	}
	if err != nil {
		return fmt.Errorf("set up uplink: %w", err)
	}
	if u.phase == uplinkReady && idx != u.index {
		a.log.Warn("the uplink interface has a new sw_if_index: re-adding every route through it",
			"uplink", u.cfg.String(), "sw_if_index", idx, "was", u.index)
		u.stale, u.lostIndex, u.lostKnown = true, u.index, true
	}
	a.setWaitingUplink(u, false)
	u.index, u.phase = idx, uplinkReady
	if mtu, err := a.dp.InterfaceMTU(ctx, idx); err == nil {
		u.mtu = mtu
		if u == a.uplinks[0] {
			a.checkMTU()
		}
	} else {
		a.log.Debug("cannot read the uplink's MTU", "uplink", u.cfg.String(), "err", err)
	}
	return nil
}

// setWaitingUplink records whether VPP lacks uplink u, logging and exporting the change.
func (a *Agent) setWaitingUplink(u *uplinkState, waiting bool) {
	if waiting == (u.phase == uplinkWaiting) {
		return
	}
	if waiting {
		u.phase = uplinkWaiting
		a.log.Info("VPP has no uplink interface yet; waiting for it", "uplink", u.cfg.String(), "poll", uplinkPoll)
		a.m.uplinkWaiting.Set(1)
		return
	}
	u.phase = uplinkUnknown
	if !slices.ContainsFunc(a.uplinks, func(u *uplinkState) bool { return u.phase == uplinkWaiting }) {
		a.m.uplinkWaiting.Set(0)
	}
	if a.vppUp {
		a.log.Info("uplink interface appeared", "uplink", u.cfg.String())
	}
}

// busy marks the loop as working on VPP until ctx's deadline, which it sets to SyncTimeout when ctx has
// none; done ends the mark. /healthz and the systemd watchdog read the mark: a long resync is not a
// stalled loop, and every VPP request in it has a deadline.
func (a *Agent) busy(ctx context.Context) (context.Context, func()) {
	ctx, cancel := context.WithTimeout(ctx, a.cfg.SyncTimeout)
	deadline, _ := ctx.Deadline()
	done := a.live.Busy(deadline)
	return ctx, func() {
		done()
		cancel()
	}
}

// fullSync reads the table from VPP and makes the owned routes equal the desired ones.
func (a *Agent) fullSync(ctx context.Context, kind string) {
	if a.snap == nil || !a.vppUp || a.vppStalled() {
		a.needFull = kind // runs as soon as there is a snapshot and a connection that answers
		return
	}
	a.needFull = ""
	start := time.Now()
	ctx, done := a.busy(ctx)
	defer done()
	err := a.doFullSync(ctx, kind)
	if errors.Is(err, errWaitingUplink) {
		// Not a failure: the uplink is looked for again shortly, by the resync kind that found it missing.
		a.retryKind = kind
		a.retry.Reset(uplinkPoll)
		return
	}
	a.m.syncDone(kind, start, err)
	if err != nil {
		a.log.Warn("full resync failed; retrying", "kind", kind, "err", err)
		a.scheduleRetry()
		return
	}
	// Routes first, then the BFD sessions, read back from VPP on every full resync (after a (re)connect,
	// periodically): a new session counts as down until the peer answers.
	a.syncBFD(ctx, true)
	a.log.Debug("full resync done", "kind", kind, "took", time.Since(start), "programmed", len(a.programmed))
	if strings.HasPrefix(kind, "relist-") {
		// A (re)list decoded every value and built the view and the routes anew: garbage of several
		// times the live state (100,000 blocks: 130 MB resident against 75 MB live), which the runtime
		// would keep until the next collections. Hand it back now, once per list,
		// before the agent says it is ready.
		debug.FreeOSMemory()
	}
	a.setView(func(v *readiness) { v.resynced = true })
}

func (a *Agent) doFullSync(ctx context.Context, kind string) error {
	// Looked up on every resync, also when set up: how a deleted uplink is noticed without VPP's events.
	if err := a.setupUplinks(ctx); err != nil {
		return err
	}
	if a.rebinding() {
		return a.rebindRoutes(ctx)
	}
	if a.dumpedListing && a.programmedValid {
		// The first full resync after the first list: the table was dumped while listing.
		a.dumpedListing = false
		return a.reconcileAll(ctx)
	}
	entries, err := a.dumpTable(ctx)
	if err != nil {
		return err
	}
	owned, foreign := a.classify(entries)
	a.noteUndeletable(owned, foreign)
	a.findShadowed(ctx, owned, foreign)
	if a.programmedValid {
		drift := 0
		for p, r := range owned {
			if have, ok := a.programmed[p]; !ok || have != r {
				drift++
			}
		}
		for p := range a.programmed {
			_, ok := owned[p]
			_, taken := foreign[p] // a conflict (noteConflicts), not drift to repair
			if !ok && !taken {
				drift++
			}
		}
		if drift > 0 {
			a.log.Warn("FIB drifted from what the agent programmed; repairing", "routes", drift, "kind", kind)
			a.m.drift.Add(float64(drift))
		}
	}
	a.programmed, a.foreign = owned, foreign
	a.programmedValid = true
	return a.reconcileAll(ctx)
}

// rebindRoutes deletes every route of the agent in the table through a lost uplink (through the index
// it has or the one it had before it was lost; every route when that is the first uplink, whose address
// the tunnels borrow), adds them back through the uplinks as they are, then reconciles as usual: VPP keeps a
// route through a deleted interface dead even when an interface of the same name and index comes back,
// and an identical re-add does not revive it (measured on 26.06).
func (a *Agent) rebindRoutes(ctx context.Context) error {
	entries, err := a.dumpTable(ctx)
	if err != nil {
		return err
	}
	owned, foreign := a.classify(entries) // the lost indexes count as the uplinks' while stale
	a.noteUndeletable(owned, foreign)
	a.programmed, a.foreign = owned, foreign
	a.programmedValid = true
	a.dumpedListing = false
	// moved maps the indexes of stale uplinks, old and new, to the uplink's index now.
	moved := map[uint32]uint32{}
	for _, u := range a.uplinks {
		if u.stale {
			moved[u.index] = u.index
			if u.lostKnown {
				moved[u.lostIndex] = u.index
			}
		}
	}
	first := a.uplinks[0]
	var dead []vppapi.Route
	for _, r := range owned {
		if first.stale || slices.ContainsFunc(r.Hops(), func(h vppapi.Hop) bool { _, ok := moved[h.SwIfIndex]; return ok }) {
			dead = append(dead, r)
		}
	}
	if len(dead) > 0 && !a.cfg.DryRun {
		a.log.Info("the uplink is back: deleting and adding again every route through it", "uplinks", a.staleUplinks(),
			"routes", len(dead))
		before := len(a.programmed)
		a.apply(ctx, nil, dead)
		if deleted := before - len(a.programmed); deleted < len(dead) {
			return fmt.Errorf("delete the routes through the lost uplink: %d failed", len(dead)-deleted)
		}
		if first.stale {
			// The tunnels borrowed the lost uplink's address: borrow it again before routes go through them.
			a.reattachTunnels(ctx)
		}
		// Back as they were, through the uplinks as they are now: the reconcile below then changes only what
		// it would have changed anyway (it keeps the routes inside held blocks, those of peers in their
		// grace, and every route while etcd is out of sync).
		adds := make([]vppapi.Route, 0, len(dead))
		for _, r := range dead {
			if r.More.Len() == 0 {
				if r.NextHop.IsValid() { // through a tunnel without a next hop: the reconcile sets those
					idx, ok := moved[r.SwIfIndex]
					if !ok {
						idx = first.index
					}
					r.SwIfIndex = idx
					adds = append(adds, r)
				}
				continue
			}
			hops := r.Hops()
			for i, h := range hops {
				if idx, ok := moved[h.SwIfIndex]; ok {
					hops[i].SwIfIndex = idx
				}
			}
			adds = append(adds, vppapi.NewRoute(r.Prefix, r.TableID, hops))
		}
		a.apply(ctx, adds, nil)
	}
	for _, u := range a.uplinks {
		u.stale, u.lostKnown = false, false
	}
	return a.reconcileAll(ctx)
}

// staleUplinks names the uplinks whose routes are being re-added.
func (a *Agent) staleUplinks() string {
	var names []string
	for _, u := range a.uplinks {
		if u.stale {
			names = append(names, u.cfg.String())
		}
	}
	return strings.Join(names, ", ")
}

// reconcileAll brings every programmed and every desired route prefix to its target.
func (a *Agent) reconcileAll(ctx context.Context) error {
	// Each prefix once, without building the union (200,000 inserts at 100,000 routes).
	all := func(yield func(netip.Prefix) bool) {
		for p := range a.programmed {
			if !yield(p) {
				return
			}
		}
		for p := range a.desired.targets {
			if _, done := a.programmed[p]; !done && !yield(p) {
				return
			}
		}
	}
	a.applyDirty(ctx, all, a.src.Status().Synced)
	a.noteConflicts()
	return nil
}

// findShadowed adds to foreign the desired prefixes missing from a dump of API routes because an entry of
// a higher-priority source holds them: VPP's ip_route_v2_dump leaves out an API route that an interface
// address of the same prefix shadows (its traffic is gleaned on that interface instead), so without
// this the agent would take it for deleted and "repair" it, unseen, at every resync. It costs a dump of
// every source, made only when some desired route is missing.
func (a *Agent) findShadowed(ctx context.Context, owned map[netip.Prefix]vppapi.Route, foreign map[netip.Prefix]vppapi.Source) {
	if a.dumpMode != dumpBySource {
		return // ip_route_dump shows the shadowing entry itself, foreign by its paths
	}
	missing := false
	for p, t := range a.desired.targets {
		_, have := owned[p]
		_, isForeign := foreign[p]
		if t.resolved && !have && !isForeign {
			missing = true
			break
		}
	}
	if !missing {
		return
	}
	entries, err := a.dp.DumpBestRoutes(ctx, a.cfg.TableID)
	if err != nil {
		a.log.Debug("cannot dump the table by source to tell shadowed routes apart", "err", err)
		return
	}
	for _, e := range entries {
		if e.TableID != a.cfg.TableID || e.Source == vppapi.SourceAPI {
			continue
		}
		if t, ok := a.desired.targets[e.Prefix]; ok && t.resolved {
			foreign[e.Prefix] = e.Source
		}
	}
}

// noteConflicts logs each desired prefix that a route of someone else (another client, an interface
// address, VPP's own entry) holds, once when it starts and once when it ends, and counts the starts:
// the agent leaves such a prefix alone.
func (a *Agent) noteConflicts() {
	for p := range a.takenOver {
		if _, still := a.foreign[p]; still {
			if t, ok := a.desired.targets[p]; ok && t.resolved {
				continue
			}
		}
		delete(a.takenOver, p)
		a.log.Info("a route prefix is no longer held by a route that is not the agent's", "prefix", p)
	}
	for p, src := range a.foreign {
		t, ok := a.desired.targets[p]
		if _, known := a.takenOver[p]; known || !ok || !t.resolved {
			continue
		}
		a.takenOver[p] = struct{}{}
		a.m.conflicts.Inc()
		a.log.Warn("a route the agent programs is held by a route that is not its own; leaving it alone",
			"prefix", p, "want_via", t.route.NextHop, "held_by", src.String())
	}
	a.m.conflicting.Set(float64(len(a.takenOver)))
}

// Dump modes: how the last dump told the agent's routes apart.
const (
	dumpBySource = "ip_route_v2_dump"
	dumpAll      = "ip_route_dump"
)

// dumpTable reads the tunnels (refreshTunnels: classify needs them), then dumps the API routes of the
// table, or, from a VPP that cannot filter by source, every route.
func (a *Agent) dumpTable(ctx context.Context) ([]vppapi.FIBEntry, error) {
	if err := a.refreshTunnels(ctx); err != nil {
		return nil, fmt.Errorf("read the tunnels: %w", err)
	}
	mode := dumpBySource
	entries, err := a.dp.DumpAPIRoutes(ctx, a.cfg.TableID)
	if errors.Is(err, vppapi.ErrUnsupported) {
		mode = dumpAll
		entries, err = a.dp.DumpRoutes(ctx, a.cfg.TableID)
	}
	if err != nil {
		return nil, fmt.Errorf("dump table %d: %w", a.cfg.TableID, err)
	}
	if mode != a.dumpMode {
		a.dumpMode = mode
		if mode == dumpAll {
			a.log.Warn("VPP has no ip_route_v2_dump: telling the agent's routes apart by their paths; a route VPP keeps after a delete is treated as VPP's own from then on")
		} else {
			a.log.Info("telling the agent's routes apart by VPP's route source", "dump", mode)
		}
	}
	return entries, nil
}

// noteUndeletable moves to foreign, for good, the routes VPP kept although it acknowledged their delete:
// with ip_route_dump, VPP's own recursive-resolution and adjacency /32s look like routes of the agent,
// and "deleting" them changes nothing. Each is logged and counted once.
func (a *Agent) noteUndeletable(owned map[netip.Prefix]vppapi.Route, foreign map[netip.Prefix]vppapi.Source) {
	for p, r := range a.deleted {
		if have, ok := owned[p]; ok && have == r {
			a.undeletable[p] = struct{}{}
			a.m.undeletable.Inc()
			a.log.Warn("VPP kept a route the agent deleted; treating it as VPP's own from now on",
				"prefix", p, "via", r.NextHop)
		}
	}
	clear(a.deleted)
	for p := range a.undeletable {
		if _, ok := owned[p]; ok {
			delete(owned, p)
			foreign[p] = 0
		}
	}
}

// classify splits a table dump into the routes this agent owns and the prefixes of other routes inside
// the managed pools (which it must never touch). A route the agent programmed stays its own when its
// pool is deleted, so that it is withdrawn like any route whose source went (see leftBehind).
func (a *Agent) classify(entries []vppapi.FIBEntry) (map[netip.Prefix]vppapi.Route, map[netip.Prefix]vppapi.Source) {
	// Room for every entry, or while the first list goes on, for the routes it will add.
	owned := make(map[netip.Prefix]vppapi.Route, max(len(entries), a.listedTotal))
	foreign := make(map[netip.Prefix]vppapi.Source)
	for _, e := range entries {
		if e.TableID != a.cfg.TableID {
			continue
		}
		if !inPools(a.pools, e.Prefix) {
			if r, ok := a.ownedRoute(e); ok && a.leftBehind(r) {
				owned[e.Prefix] = r
			}
			continue
		}
		if r, ok := a.ownedRoute(e); ok {
			owned[e.Prefix] = r
		} else {
			foreign[e.Prefix] = e.Source
		}
	}
	return owned, foreign
}

// leftBehind reports whether r, outside the managed pools, is a route this agent programmed (as it is
// now): its pool was deleted or disabled since. It stays the agent's, to be withdrawn once nothing
// wants it, unless its pool is only disabled (parked).
func (a *Agent) leftBehind(r vppapi.Route) bool {
	have, ok := a.programmed[r.Prefix]
	return ok && have == r
}

// parked reports whether route prefix p lies outside the managed pools but inside a disabled pool: a
// route the agent programmed there stays as it is (a migration: see docs/limitations.md) until the
// pool is enabled again or deleted.
func (a *Agent) parked(p netip.Prefix) bool {
	if a.snap == nil || a.cfg.Pools != nil || inPools(a.pools, p) {
		return false
	}
	for _, pool := range a.snap.Pools {
		if pool.Disabled && netaddr.Covers(pool.CIDR, p) {
			return true
		}
	}
	return false
}

// ownedRoute reports whether e is one of ours: every path a plain path via one of the uplinks with a
// next hop, or through one of the agent's tunnels without one. An ECMP route is read with all its paths
// (in canonical order); a route that differs from the desired one is replaced as a whole by the next add.
func (a *Agent) ownedRoute(e vppapi.FIBEntry) (vppapi.Route, bool) {
	if len(e.Paths) == 0 {
		return vppapi.Route{}, false
	}
	e = ipipHostPath(e, func(idx uint32) bool { return a.isTunnel(idx) && !a.isVXLAN(idx) })
	for _, p := range e.Paths {
		viaUplink := a.isUplink(p.SwIfIndex) && p.NextHop.IsValid()
		// An IPIP tunnel is point-to-point (no next hop); a route through a VXLAN one names the VTEP.
		viaTunnel := a.isTunnel(p.SwIfIndex) && p.NextHop.IsValid() == a.isVXLAN(p.SwIfIndex)
		if p.Type != vppapi.PathNormal || !viaUplink && !viaTunnel {
			return vppapi.Route{}, false
		}
	}
	if len(e.Paths) == 1 {
		return vppapi.Route{Prefix: e.Prefix, NextHop: e.Paths[0].NextHop, SwIfIndex: e.Paths[0].SwIfIndex, TableID: e.TableID}, true
	}
	hops := make([]vppapi.Hop, len(e.Paths))
	for i, p := range e.Paths {
		hops[i] = vppapi.Hop{NextHop: p.NextHop, SwIfIndex: p.SwIfIndex}
	}
	return vppapi.NewRoute(e.Prefix, e.TableID, hops), true
}

// ipipHostPath returns e as it was added when it is a host prefix (/32, /128: an address borrowed in
// another node's block) through an IPIP tunnel: VPP gives a host prefix's path out of an interface with
// no next hop the prefix's own address as next hop (fib_table_route_path_fixup), and dumps it so.
func ipipHostPath(e vppapi.FIBEntry, isIPIP func(swIfIndex uint32) bool) vppapi.FIBEntry {
	if len(e.Paths) != 1 || !e.Prefix.IsSingleIP() {
		return e
	}
	if p := e.Paths[0]; p.NextHop == e.Prefix.Addr() && isIPIP(p.SwIfIndex) {
		e.Paths = []vppapi.Path{{SwIfIndex: p.SwIfIndex, Type: p.Type}}
	}
	return e
}

func inPools(pools []netip.Prefix, p netip.Prefix) bool {
	return slices.ContainsFunc(pools, func(pool netip.Prefix) bool { return netaddr.Covers(pool, p) })
}

// applyDirty brings the given prefixes, each yielded once, to their targets and returns the number of
// FIB operations done. Deletes wait for a fresh view (allowDelete) and for the peer-loss grace of a
// vanished owner. It changes programmed only after dirty is exhausted.
func (a *Agent) applyDirty(ctx context.Context, dirty iter.Seq[netip.Prefix], allowDelete bool) int {
	var adds, dels []vppapi.Route
	now := time.Now()
	for p := range dirty {
		tgt, ok := a.desired.targets[p]
		have, programmed := a.programmed[p]
		switch {
		case ok && tgt.resolved:
			if _, isForeign := a.foreign[p]; isForeign {
				continue
			}
			want, ok := a.wantRoute(ctx, p, tgt, have, programmed)
			if ok && (!programmed || have != want) {
				adds = append(adds, want)
			}
		case programmed:
			if a.parked(p) {
				continue
			}
			if !ok && a.held(p) {
				continue // inside a block whose value cannot be read: keep it as it is
			}
			if ok && tgt.missingPeer.node != "" {
				since, seen := a.missingSince[tgt.missingPeer]
				if !seen {
					since = now
					a.missingSince[tgt.missingPeer] = now
				}
				if until := since.Add(a.cfg.PeerLossGrace); now.Before(until) {
					a.armGrace(until)
					continue
				}
			}
			if !allowDelete {
				continue
			}
			dels = append(dels, have)
		}
	}
	n := a.apply(ctx, adds, dels)
	a.gcTunnels(ctx)
	return n
}

// apply makes the FIB changes (or logs them in a dry run), records in programmed what VPP acknowledged,
// and returns the number of operations done.
func (a *Agent) apply(ctx context.Context, adds, dels []vppapi.Route) int {
	if len(adds) == 0 && len(dels) == 0 {
		return 0
	}
	sortRoutes(adds)
	sortRoutes(dels)
	if a.cfg.DryRun {
		for _, r := range adds {
			a.log.Info("dry run: would add", "prefix", r.Prefix, "via", r.NextHop, "sw_if_index", r.SwIfIndex, "table", r.TableID)
		}
		for _, r := range dels {
			a.log.Info("dry run: would delete", "prefix", r.Prefix, "table", r.TableID)
		}
		a.m.ops.WithLabelValues("add", "dry_run").Add(float64(len(adds)))
		a.m.ops.WithLabelValues("delete", "dry_run").Add(float64(len(dels)))
		return 0
	}
	res := a.dp.Apply(ctx, adds, dels)
	failed := make(map[netip.Prefix]vppapi.RouteError, len(res.Failed))
	for _, f := range res.Failed {
		failed[f.Route.Prefix] = f
	}
	for _, r := range adds {
		if old, ok := a.programmed[r.Prefix]; ok && old != r && a.isTunnel(old.SwIfIndex) {
			// Another tunnel, or another next hop on a VXLAN one (whose neighbour may be unused now).
			a.tun.unusedMaybe[old.SwIfIndex] = struct{}{}
		}
		if _, bad := failed[r.Prefix]; bad {
			if a.isTunnel(r.SwIfIndex) {
				a.tun.unusedMaybe[r.SwIfIndex] = struct{}{} // made for it, perhaps used by no route
			}
		} else {
			a.programmed[r.Prefix] = r
			delete(a.deleted, r.Prefix) // added again since (a rebind): not one VPP kept
		}
	}
	for _, r := range dels {
		if a.isTunnel(r.SwIfIndex) {
			a.tun.unusedMaybe[r.SwIfIndex] = struct{}{}
		}
		if _, bad := failed[r.Prefix]; !bad {
			delete(a.programmed, r.Prefix)
			if a.dumpMode == dumpAll {
				a.deleted[r.Prefix] = r
			}
		}
	}
	a.m.countOps(len(adds), len(dels), res.Failed)
	if len(res.Failed) > 0 {
		a.log.Warn("some FIB operations failed; will retry", "failed", len(res.Failed), "err", res.Err())
		a.scheduleRetry()
	}
	return len(adds) + len(dels) - len(res.Failed)
}

// trackPeers keeps missingSince in step with the usable peers: a registration that is back (and
// valid) is no longer missing. It also logs refused peer IPs the first time they are seen.
func (a *Agent) trackPeers() {
	for pf := range a.missingSince {
		if pf.registered(a.desired.peers) {
			delete(a.missingSince, pf)
		}
	}
	for _, inv := range a.desired.newlyInvalid {
		a.log.Warn("refusing a peer IP as next hop; routes to that node are handled as if it had registered none",
			"node", inv.Node, "peer_ip", inv.Addr, "reason", inv.Reason)
	}
	a.desired.newlyInvalid = nil
	for node := range a.gapLogged {
		if p, ok := a.desired.peers[node]; !ok || !p.Gap {
			delete(a.gapLogged, node)
		}
	}
	for node, p := range a.desired.peers {
		if _, logged := a.gapLogged[node]; p.Gap && !logged {
			a.gapLogged[node] = struct{}{}
			a.m.peerGaps.Inc()
			a.log.Warn("a node's registration has a gap in its peer IP indexes (peerip/<family>/1, /2, ...); using the addresses it has, in index order",
				"node", node, "ipv4", p.IPv4s(), "ipv6", p.IPv6s())
		}
	}
	for _, cidr := range a.desired.newlyDefault {
		a.log.Warn("ignoring a block of prefix length 0: a default route is never programmed from a block", "block", cidr)
		a.m.defaultBlocks.Inc()
	}
	a.desired.newlyDefault = nil
}

// held reports whether route prefix p lies inside a held block (its value cannot be read).
func (a *Agent) held(p netip.Prefix) bool {
	if a.snap == nil {
		return false
	}
	for cidr := range a.snap.Held {
		if netaddr.Covers(cidr, p) {
			return true
		}
	}
	return false
}

// releaseHeld adds to dirty the programmed routes inside blocks that were held in prev and are not in
// snap: a readable value now decides about them, even those it does not mention.
func (a *Agent) releaseHeld(prev, snap *blockwatch.Snapshot, dirty map[netip.Prefix]struct{}) {
	if prev == nil || len(prev.Held) == 0 {
		return
	}
	for cidr := range prev.Held {
		if _, still := snap.Held[cidr]; still {
			continue
		}
		for p := range a.programmed {
			if netaddr.Covers(cidr, p) {
				dirty[p] = struct{}{}
			}
		}
	}
}

// expireGrace re-evaluates the routes of registrations whose grace period is over.
func (a *Agent) expireGrace(ctx context.Context) {
	now := time.Now()
	dirty := map[netip.Prefix]struct{}{}
	a.graceAt = time.Time{}
	for pf, since := range a.missingSince {
		if until := since.Add(a.cfg.PeerLossGrace); now.Before(until) {
			a.armGrace(until)
			continue
		}
		a.log.Info("peer registration gone for longer than the grace period; withdrawing its routes", "peer", pf.String(),
			"missing_since", since)
		for p := range a.desired.prefixesOf(pf.node) {
			if p.Addr().Is6() == pf.ipv6 {
				dirty[p] = struct{}{}
			}
		}
	}
	if len(dirty) > 0 && a.vppStalled() {
		if a.needFull == "" {
			a.needFull = "retry" // once VPP answers again
		}
		return
	}
	if a.vppUp && a.uplinksReady() && !a.rebinding() && len(dirty) > 0 {
		ctx, done := a.busy(ctx)
		defer done()
		a.applyDirty(ctx, maps.Keys(dirty), a.src.Status().Synced)
	}
}

// armGrace makes the grace timer fire at until, unless it is already due earlier.
func (a *Agent) armGrace(until time.Time) {
	if !a.graceAt.IsZero() && !until.Before(a.graceAt) {
		return
	}
	a.graceAt = until
	a.grace.Reset(time.Until(until) + 10*time.Millisecond)
}

func (a *Agent) scheduleRetry() {
	a.retryKind = "retry"
	a.retry.Reset(retryDelay)
}

// withdrawAll removes every owned route (--withdraw-on-exit), with its own deadline.
func (a *Agent) withdrawAll() {
	if !a.vppUp || !a.uplinksReady() || a.cfg.DryRun {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), WithdrawTimeout)
	defer cancel()
	entries, err := a.dumpTable(ctx)
	if err != nil {
		a.log.Error("withdraw on exit: dump failed", "err", err)
		return
	}
	owned, foreign := a.classify(entries)
	a.noteUndeletable(owned, foreign)
	dels := make([]vppapi.Route, 0, len(owned))
	for _, r := range owned {
		dels = append(dels, r)
	}
	res := a.dp.Apply(ctx, nil, dels)
	a.m.countOps(0, len(dels), res.Failed)
	a.log.Info("withdrew owned routes on exit", "routes", len(dels)-len(res.Failed), "failed", len(res.Failed))
	if len(res.Failed) > 0 {
		return // a tunnel a route still uses stays
	}
	for idx := range a.tun.byIndex {
		if err := a.dp.DeleteIPIPTunnel(ctx, idx); err != nil {
			a.log.Error("withdraw on exit: cannot delete a tunnel", "sw_if_index", idx, "err", err)
		}
	}
}

func sortRoutes(rs []vppapi.Route) {
	slices.SortFunc(rs, func(a, b vppapi.Route) int { return a.Prefix.Compare(b.Prefix) })
}

func stoppedTimer() *time.Timer {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return t
}

// uplinkPhase is where the agent stands with one uplink interface.
type uplinkPhase uint8

const (
	// uplinkUnknown: not looked up since VPP (re)connected.
	uplinkUnknown uplinkPhase = iota
	// uplinkWaiting: VPP has no such interface; looked for every uplinkPoll.
	uplinkWaiting
	// uplinkReady: set up; routes go through its index.
	uplinkReady
)

func (p uplinkPhase) String() string {
	return [...]string{"unknown", "waiting", "ready"}[p]
}

// uplinkState is what the agent knows of one uplink (Config.Uplink, then Config.MoreUplinks). It is
// owned by Run.
type uplinkState struct {
	cfg   vppapi.Uplink
	phase uplinkPhase
	index uint32 // its sw_if_index once ready (and the last one it had)
	mtu   uint32 // its L3 MTU as last read; 0 when unknown
	// stale says that the uplink was missing since the routes in the table were written: those through
	// it are dead and must be deleted and added again once it is back (rebindRoutes). lostIndex is the
	// index it had, when known (lostKnown).
	stale     bool
	lostIndex uint32
	lostKnown bool
}

// uplinksReady reports whether every uplink is set up: routes are programmed only then.
func (a *Agent) uplinksReady() bool {
	return !slices.ContainsFunc(a.uplinks, func(u *uplinkState) bool { return u.phase != uplinkReady })
}

// rebinding reports whether the routes through some uplink must be deleted and added again.
func (a *Agent) rebinding() bool {
	return slices.ContainsFunc(a.uplinks, func(u *uplinkState) bool { return u.stale })
}

// isUplink reports whether idx is the index of a set-up uplink, or the one a lost uplink had while its
// routes wait to be re-added (their paths are the agent's).
func (a *Agent) isUplink(idx uint32) bool {
	return slices.ContainsFunc(a.uplinks, func(u *uplinkState) bool {
		return u.phase == uplinkReady && u.index == idx || u.stale && u.lostKnown && u.lostIndex == idx
	})
}

// waitingUplinks names the uplinks VPP lacks.
func (a *Agent) waitingUplinks() []string {
	var out []string
	for _, u := range a.uplinks {
		if u.phase == uplinkWaiting {
			out = append(out, u.cfg.String())
		}
	}
	return out
}
