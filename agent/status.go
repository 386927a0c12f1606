package agent

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"time"
)

// Debug is the JSON document of /debug/routes: what the agent wants, what it has programmed, and what
// it cannot resolve.
type Debug struct {
	Node       string               `json:"node"`
	Revision   int64                `json:"etcd_revision"`
	TableID    uint32               `json:"table_id"`
	Uplink     uint32               `json:"uplink_sw_if_index"`
	Pools      []netip.Prefix       `json:"managed_pools"`
	Desired    []DesiredRoute       `json:"desired"`
	Programmed []ProgrammedRoute    `json:"programmed"`
	Unresolved []Unresolved         `json:"unresolved"`
	Foreign    []netip.Prefix       `json:"foreign_in_pools"`
	Missing    map[string]time.Time `json:"peers_missing_since,omitempty"`
}

// ProgrammedRoute is a route the agent believes is in the FIB (as of its last dump and writes).
type ProgrammedRoute struct {
	Prefix  netip.Prefix `json:"prefix"`
	NextHop netip.Addr   `json:"next_hop"`
}

// DebugRoutes asks the reconcile loop for its current routes; it fails if the loop does not answer
// before ctx is done.
func (a *Agent) DebugRoutes(ctx context.Context) (Debug, error) {
	ch := make(chan Debug, 1)
	select {
	case a.debugReq <- ch:
	case <-ctx.Done():
		return Debug{}, fmt.Errorf("reconcile loop busy: %w", ctx.Err())
	}
	select {
	case d := <-ch:
		return d, nil
	case <-ctx.Done():
		return Debug{}, fmt.Errorf("reconcile loop busy: %w", ctx.Err())
	}
}

func (a *Agent) debugView() Debug {
	d := Debug{Node: a.cfg.NodeName, TableID: a.cfg.TableID, Uplink: a.uplink, Pools: a.pools,
		Desired: a.desired.routes(), Unresolved: a.desired.unresolvedList(), Missing: map[string]time.Time{}}
	if a.snap != nil {
		d.Revision = a.snap.Revision
	}
	for _, r := range a.programmed {
		d.Programmed = append(d.Programmed, ProgrammedRoute{Prefix: r.Prefix, NextHop: r.NextHop})
	}
	slices.SortFunc(d.Programmed, func(x, y ProgrammedRoute) int { return comparePrefix(x.Prefix, y.Prefix) })
	for p := range a.foreign {
		d.Foreign = append(d.Foreign, p)
	}
	slices.SortFunc(d.Foreign, comparePrefix)
	for pf, t := range a.missingSince {
		d.Missing[pf.String()] = t
	}
	if d.Desired == nil {
		d.Desired = []DesiredRoute{}
	}
	if d.Programmed == nil {
		d.Programmed = []ProgrammedRoute{}
	}
	if d.Unresolved == nil {
		d.Unresolved = []Unresolved{}
	}
	return d
}

// publish updates the readiness view and the gauges after each turn of the loop.
func (a *Agent) publish() {
	a.heartbeat.Store(time.Now().UnixNano())
	synced := a.src.Status().Synced
	a.setView(func(v *readiness) {
		v.snapshotApplied = a.snap != nil
		v.vppConnected = a.vppUp
		v.uplinkReady = a.uplinkReady
		v.waitingUplink = a.waitingUplink
		v.etcdSynced = synced
	})
	a.m.desired.Set(float64(a.desired.resolvedCount()))
	a.m.programmed.Set(float64(len(a.programmed)))
	a.m.unresolved.Set(float64(a.desired.unresolvedCount))
	if a.snap != nil {
		a.m.peers.Set(float64(len(a.snap.Peers)))
	}
	a.m.setBlocks(a.desired.blocks)
}

func (a *Agent) setView(f func(v *readiness)) {
	a.mu.Lock()
	defer a.mu.Unlock()
	f(&a.view)
}

// Ready reports whether the node is fully serving: the first snapshot is applied, VPP is connected and
// the uplink set up, the first full resync is done, the etcd watch is in sync and the registration is
// present. When it is not, missing lists what is lacking.
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
	// The connection is read live: the loop's own view lags while it works on a long resync.
	switch st := a.dp.Status(); {
	case !st.Connected && st.LastError != "":
		missing = append(missing, "VPP not connected: "+st.LastError)
	case !st.Connected:
		missing = append(missing, "VPP not connected")
	case v.waitingUplink:
		missing = append(missing, "waiting for "+a.cfg.Uplink.String())
	case !v.vppConnected || !v.uplinkReady:
		missing = append(missing, "uplink not set up yet")
	}
	if !v.resynced {
		missing = append(missing, "first full resync not done")
	}
	if a.reg != nil && !a.reg.Up() {
		missing = append(missing, "peer IP registration not present")
	}
	return len(missing) == 0, missing
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
	now := time.Now()
	if now.Sub(time.Unix(0, a.heartbeat.Load())) < d {
		return true
	}
	until := a.busyUntil.Load()
	return until != 0 && now.UnixNano() < until+int64(d)
}
