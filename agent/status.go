package agent

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/blockwatch"
	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/vppapi"
)

// Debug is the JSON document of /debug/routes: what the agent wants, what it has programmed, what it
// cannot resolve, the peer IPs it refuses and the blocks it holds.
type Debug struct {
	Node         string               `json:"node"`
	Revision     int64                `json:"etcd_revision"`
	AsOf         time.Time            `json:"as_of"`
	TableID      uint32               `json:"table_id"`
	Uplink       uint32               `json:"uplink_sw_if_index"`
	Uplinks      []DebugUplink        `json:"uplinks"`
	Pools        []netip.Prefix       `json:"managed_pools"`
	Desired      []DesiredRoute       `json:"desired"`
	Programmed   []ProgrammedRoute    `json:"programmed"`
	Unresolved   []Unresolved         `json:"unresolved"`
	InvalidPeers []InvalidPeer        `json:"invalid_peers"`
	Held         []HeldBlock          `json:"held"`
	Foreign      []netip.Prefix       `json:"foreign_in_pools"`
	Tunnels      []DebugTunnel        `json:"tunnels"`
	Missing      map[string]time.Time `json:"peers_missing_since,omitempty"`
	// BFD are the agent's BFD sessions (--bfd) with their state; BFDDown the nodes none of whose sessions
	// is up (every path to them out of forwarding).
	BFD     []DebugBFD `json:"bfd_sessions"`
	BFDDown []string   `json:"bfd_peers_down,omitempty"`
}

// DebugUplink is one uplink as the agent stands with it, in --uplink-interface order.
type DebugUplink struct {
	Name      string `json:"name"`
	SwIfIndex uint32 `json:"sw_if_index"`
	// State is unknown (not looked up since VPP connected), waiting (VPP has no such interface) or ready.
	State string `json:"state"`
	// Rebind says that the routes through it are to be deleted and added again (it was lost).
	Rebind bool `json:"rebind,omitempty"`
}

// ProgrammedRoute is a route the agent believes is in the FIB (as of its last dump and writes): via
// NextHop on the uplink (encap none), or through a tunnel of the agent (NextHop is then the tunnel's
// peer).
type ProgrammedRoute struct {
	Prefix  netip.Prefix `json:"prefix"`
	NextHop netip.Addr   `json:"next_hop"`
	Encap   calico.Encap `json:"encap"`
	// Tunnel and TunnelIndex name the tunnel the route goes through ("" and 0 for encap none).
	Tunnel      string `json:"tunnel,omitempty"`
	TunnelIndex uint32 `json:"tunnel_sw_if_index,omitempty"`
	// Paths are every path of an ECMP route ("via 192.0.2.7 sw_if_index 1"); empty for one path.
	Paths []string `json:"paths,omitempty"`
	// PathsDown are the paths (as in Paths, or the one path) whose BFD session is not up: VPP does not
	// forward over them. PathsUp counts the others.
	PathsDown []string `json:"paths_bfd_down,omitempty"`
	PathsUp   int      `json:"paths_up"`
}

// DebugTunnel is a tunnel of the agent in VPP.
type DebugTunnel struct {
	Encap     calico.Encap `json:"encap"`
	Name      string       `json:"name"`
	SwIfIndex uint32       `json:"sw_if_index"`
	Src       netip.Addr   `json:"src"`
	Dst       netip.Addr   `json:"dst"`
	// Stale says that its source is not this node's tunnel source any more: deleted once unused.
	Stale bool `json:"stale,omitempty"`
}

// debugState is what the reconcile loop publishes for /debug/routes: the snapshot it works from and
// copies of its own state. It is immutable once published.
type debugState struct {
	// doc is the state's document as indented JSON, rendered once for every request that gets this
	// state.
	docOnce sync.Once
	doc     []byte
	docErr  error

	at         time.Time
	snap       *blockwatch.Snapshot
	pools      []netip.Prefix
	uplink     uint32
	uplinks    []DebugUplink
	programmed []ProgrammedRoute
	tunnels    []DebugTunnel
	foreign    []netip.Prefix
	missing    map[string]time.Time
	bfd        []DebugBFD
	bfdDown    []string
}

// debugEvery bounds how often the loop copies its state for /debug/routes (only while someone asks).
const debugEvery = time.Second

// DebugRoutes returns the agent's routes from the state the reconcile loop last published, without
// waiting on the loop: the loop copies its state at most once per second, and only while someone asks,
// so polling this never slows event handling. The desired routes are computed here, from the loop's
// immutable snapshot. It waits (up to ctx) only for the first state after a quiet period.
func (a *Agent) DebugRoutes(ctx context.Context) (Debug, error) {
	st, err := a.debugState(ctx)
	if err != nil {
		return Debug{}, err
	}
	return a.debugView(st), nil
}

// DebugJSON is DebugRoutes as indented JSON. Every request served from one published state shares
// one rendering, so frequent pollers cost little more than the bytes they read.
func (a *Agent) DebugJSON(ctx context.Context) ([]byte, error) {
	st, err := a.debugState(ctx)
	if err != nil {
		return nil, err
	}
	st.docOnce.Do(func() { st.doc, st.docErr = json.MarshalIndent(a.debugView(st), "", "  ") })
	return st.doc, st.docErr
}

// debugState returns the last published state, asking the loop for a fresh one and waiting (up to
// ctx) when it is older than a few publishing periods.
func (a *Agent) debugState(ctx context.Context) (*debugState, error) {
	a.debugWanted.Store(true)
	st := a.debugPub.Load()
	for st == nil || time.Since(st.at) > 3*debugEvery {
		select {
		case <-ctx.Done():
			if st != nil {
				return st, nil
			}
			return nil, fmt.Errorf("no state published yet: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
		a.debugWanted.Store(true)
		st = a.debugPub.Load()
	}
	return st, nil
}

// publishDebug copies the loop's state for DebugRoutes when it was asked for and the last copy is
// older than debugEvery.
func (a *Agent) publishDebug() {
	if !a.debugWanted.Load() || time.Since(a.debugAt) < debugEvery {
		return
	}
	a.debugWanted.Store(false)
	a.debugAt = time.Now()
	st := &debugState{at: a.debugAt, snap: a.snap, pools: a.pools, uplink: a.uplinks[0].index,
		programmed: make([]ProgrammedRoute, 0, len(a.programmed)), missing: make(map[string]time.Time, len(a.missingSince))}
	down := a.bfdDownAdjacencies()
	for _, r := range a.programmed {
		st.programmed = append(st.programmed, a.programmedRoute(r, down))
	}
	st.bfd, st.bfdDown = a.debugBFD(), a.bfdDownPeers()
	for _, u := range a.uplinks {
		st.uplinks = append(st.uplinks, DebugUplink{Name: u.cfg.String(), SwIfIndex: u.index, State: u.phase.String(), Rebind: u.stale})
	}
	for idx, t := range a.tun.byIndex {
		st.tunnels = append(st.tunnels, DebugTunnel{Encap: t.key.encap, Name: t.name(), SwIfIndex: idx, Src: t.src,
			Dst: t.key.peer, Stale: a.tun.byKey[t.key] != t})
	}
	slices.SortFunc(st.tunnels, func(x, y DebugTunnel) int { return cmp.Compare(x.SwIfIndex, y.SwIfIndex) })
	for p := range a.foreign {
		st.foreign = append(st.foreign, p)
	}
	for pf, t := range a.missingSince {
		st.missing[pf.String()] = t
	}
	a.debugPub.Store(st)
}

// debugView builds the document from a published state; it runs on the caller's goroutine.
func (a *Agent) debugView(st *debugState) Debug {
	d := Debug{Node: a.cfg.NodeName, AsOf: st.at, TableID: a.cfg.TableID, Uplink: st.uplink, Uplinks: st.uplinks, Pools: st.pools,
		Programmed: slices.Clone(st.programmed), Foreign: slices.Clone(st.foreign), Missing: st.missing,
		Tunnels: append([]DebugTunnel{}, st.tunnels...), BFD: st.bfd, BFDDown: st.bfdDown,
		Desired: []DesiredRoute{}, Unresolved: []Unresolved{}, InvalidPeers: []InvalidPeer{}, Held: []HeldBlock{}}
	slices.SortFunc(d.Programmed, func(x, y ProgrammedRoute) int { return x.Prefix.Compare(y.Prefix) })
	slices.SortFunc(d.Foreign, netip.Prefix.Compare)
	if st.snap != nil {
		d.Revision = st.snap.Revision
		opts := a.cfg.options()
		opts.Pools = st.pools
		v := View(st.snap, opts)
		d.Desired, d.Unresolved, d.InvalidPeers, d.Held = v.Desired, v.Unresolved, v.InvalidPeers, v.Held
	}
	return d
}

// publish updates the readiness view and the gauges after each turn of the loop.
func (a *Agent) publish() {
	a.live.Turn()
	a.publishDebug()
	synced := a.src.Status().Synced
	a.setView(func(v *readiness) {
		v.snapshotApplied = a.snap != nil
		v.vppConnected = a.vppUp
		v.uplinkReady = a.uplinksReady()
		v.waitingUplink = a.waitingUplinks()
		v.etcdSynced = synced
		v.bfdNotes = a.bfdNotes()
	})
	if time.Since(a.encapCountAt) >= time.Second {
		// A pass over every route: at most once a second.
		a.encapCountAt = time.Now()
		n := map[calico.Encap]int{}
		ecmp := 0
		for _, r := range a.programmed {
			if r.More.Len() > 0 {
				ecmp++
			}
			if t, ok := a.tun.byIndex[r.SwIfIndex]; ok {
				n[t.key.encap]++
			} else {
				n[calico.EncapNone]++
			}
		}
		a.m.ecmpRoutes.Set(float64(ecmp))
		for _, e := range []calico.Encap{calico.EncapNone, calico.EncapIPIP, calico.EncapVXLAN} {
			a.m.routesByEncap.WithLabelValues(e.String()).Set(float64(n[e]))
		}
		noVXLAN := 0
		if st := a.dp.Status(); st.Connected && !st.VXLAN && a.desired.enc.hasVXLAN() {
			for _, t := range a.desired.targets {
				if t.resolved && t.route.Encap == calico.EncapVXLAN && !t.route.Hold {
					noVXLAN++
				}
			}
		}
		a.m.noVXLAN.Set(float64(noVXLAN))
		a.setView(func(v *readiness) { v.noVXLAN = noVXLAN })
	}
	a.m.desired.Set(float64(a.desired.resolvedCount()))
	a.m.programmed.Set(float64(len(a.programmed)))
	a.m.unresolved.Set(float64(a.desired.unresolvedCount))
	if a.snap != nil {
		a.m.peers.Set(float64(len(a.snap.Peers)))
		a.m.held.Set(float64(len(a.snap.Held)))
	}
	a.m.invalidPeers.Set(float64(len(a.desired.invalid)))
	a.m.setBlocks(a.desired.blocks)
}

// programmedRoute describes a programmed route for /debug/routes.
func (a *Agent) programmedRoute(r vppapi.Route, bfdDown map[vppapi.Hop]struct{}) ProgrammedRoute {
	out := ProgrammedRoute{Prefix: r.Prefix, NextHop: r.NextHop}
	if r.More.Len() > 0 {
		for _, h := range r.Hops() {
			out.Paths = append(out.Paths, h.String())
		}
	}
	for _, h := range r.Hops() {
		if _, ok := bfdDown[vppapi.Hop{NextHop: h.NextHop, SwIfIndex: h.SwIfIndex}]; ok {
			out.PathsDown = append(out.PathsDown, h.String())
		} else {
			out.PathsUp++
		}
	}
	if t, ok := a.tun.byIndex[r.SwIfIndex]; ok {
		out.Encap, out.NextHop, out.Tunnel, out.TunnelIndex = t.key.encap, t.key.peer, t.name(), r.SwIfIndex
		if t.key.encap == calico.EncapVXLAN {
			out.NextHop = r.NextHop // the remote VTEP; the tunnel leads to its node IP
		}
	}
	return out
}

func (a *Agent) setView(f func(v *readiness)) {
	a.mu.Lock()
	defer a.mu.Unlock()
	f(&a.view)
}

// EtcdHealth tells whether etcd serves (etcdconfig.Guard): one out of space or without a leader still
// answers the watch, and a frozen one keeps the connection "ready".
type EtcdHealth interface {
	Problem() string
}

// Ready reports whether the node is fully serving: the first snapshot is applied, VPP is connected and
// the uplink set up, the first full resync is done, the etcd watch is in sync with no problem reported
// (blockwatch.Status.Problem: ownership read from the affinities without strict affinity), etcd serves
// (Config.EtcdHealth: it answers, has a leader and room for writes such as the registration's) and the
// registration is present. When it is not, missing lists what is lacking.
func (a *Agent) Ready() (ok bool, missing []string) {
	a.mu.Lock()
	v := a.view
	a.mu.Unlock()
	if !v.snapshotApplied {
		missing = append(missing, "first etcd snapshot not applied")
	}
	if !v.etcdSynced {
		missing = append(missing, "etcd watch not in sync")
	}
	if p := a.src.Status().Problem; p != "" {
		missing = append(missing, p)
	}
	if a.cfg.EtcdHealth != nil {
		if p := a.cfg.EtcdHealth.Problem(); p != "" {
			missing = append(missing, p)
		}
	}
	// The connection is read live: the loop's own view lags while it works on a long resync.
	switch st := a.dp.Status(); {
	case !st.Connected && st.LastError != "":
		missing = append(missing, "VPP not connected: "+st.LastError)
	case !st.Connected:
		missing = append(missing, "VPP not connected")
	case st.Stalled:
		missing = append(missing, "VPP not answering since "+st.StalledSince.UTC().Format(time.RFC3339))
	case len(v.waitingUplink) > 0:
		missing = append(missing, "waiting for "+strings.Join(v.waitingUplink, ", "))
	case !v.vppConnected || !v.uplinkReady:
		missing = append(missing, "uplink not set up yet")
	}
	if !v.resynced {
		missing = append(missing, "first full resync not done")
	}
	if v.noVXLAN > 0 {
		missing = append(missing, fmt.Sprintf("VPP has no vxlan plugin (vxlan_plugin.so), which %d routes of VXLAN pools need", v.noVXLAN))
	}
	if a.reg != nil && !a.reg.Up() {
		if p := a.reg.Problem(); p != "" {
			missing = append(missing, p)
		} else {
			missing = append(missing, "peer IP registration not present")
		}
	}
	return len(missing) == 0, missing
}

// Notes are what /readyz shows beside readiness without making the node unready: the nodes whose BFD
// sessions are all down (a dead peer is not this node's fault), a VPP without BFD.
func (a *Agent) Notes() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.view.bfdNotes)
}

// Resynced reports whether the first full resync has completed (systemd's READY=1).
func (a *Agent) Resynced() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.view.resynced
}

// HealthyWithin reports whether the reconcile loop has turned within d (it turns at least every second
// when idle), or is doing VPP work whose deadline has not passed (a long resync). It does not depend on
// etcd or VPP being reachable.
func (a *Agent) HealthyWithin(d time.Duration) bool {
	return a.live.HealthyWithin(d)
}
