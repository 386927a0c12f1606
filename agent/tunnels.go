package agent

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strconv"

	"github.com/vpp-route-agent/vpp-route-agent/blockwatch"
	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/vppapi"
)

// TunnelTag is the VPP interface tag the agent puts on the tunnels it creates: what tells them apart from
// an operator's after a restart of the agent (VPP keeps a tag until the interface is deleted, measured
// on 26.06). A tunnel without it is never adopted, reused or deleted.
const TunnelTag = "vpp-route-agent"

// tunnelKey names one tunnel of the agent: its encapsulation and the peer (next hop) it leads to. VXLAN
// tunnels will be keyed the same way.
type tunnelKey struct {
	encap calico.Encap
	peer  netip.Addr
}

// ownTunnel is a tunnel the agent created (or adopted by its tag).
type ownTunnel struct {
	key       tunnelKey
	swIfIndex uint32
	instance  uint32
	src       netip.Addr
}

// name is VPP's interface name of the tunnel.
func (t *ownTunnel) name() string { return vppapi.IPIPTunnel{Instance: t.instance}.Name() }

// tunnelState is the agent's table of tunnels, owned by Run.
type tunnelState struct {
	// byKey are the agent's usable tunnels: source this node's current tunnel source, table the agent's.
	byKey map[tunnelKey]*ownTunnel
	// byIndex are all the agent's tunnels, those with a stale source too (deleted once no route uses them).
	byIndex map[uint32]*ownTunnel
	// foreign are the tunnels with this node's source that are not the agent's: it neither uses nor
	// creates one to the same peer (VPP would hand it the existing one).
	foreign map[tunnelKey]uint32
	// unusedMaybe are the agent's tunnels that may carry no route any more: deleted by gcTunnels
	// once no programmed route goes through them.
	unusedMaybe map[uint32]struct{}
	// refused are the peers already logged as unreachable by tunnel (a foreign tunnel, no source).
	refused map[tunnelKey]string
}

func newTunnelState() tunnelState {
	return tunnelState{byKey: map[tunnelKey]*ownTunnel{}, byIndex: map[uint32]*ownTunnel{},
		foreign: map[tunnelKey]uint32{}, unusedMaybe: map[uint32]struct{}{}, refused: map[tunnelKey]string{}}
}

// isTunnel reports whether idx is one of the agent's tunnels.
func (a *Agent) isTunnel(idx uint32) bool {
	_, ok := a.tun.byIndex[idx]
	return ok
}

// tunnelSource is the outer source of this node's IPIP tunnels: its first IPv4 uplink address, else its
// first IPv4 peer IP (what it registers, and what the peers' tunnels expect as their destination).
func (a *Agent) tunnelSource() netip.Addr {
	for _, p := range a.cfg.Uplink.Addresses {
		if p.Addr().Is4() {
			return p.Addr()
		}
	}
	for _, ip := range a.cfg.PeerIPs {
		if ip.Is4() {
			return ip
		}
	}
	return netip.Addr{}
}

// refreshTunnels reads VPP's IPIP tunnels: those tagged TunnelTag are the agent's (adopted as they are,
// nothing re-sent: an agent restart changes nothing in VPP), those of this node's source without the tag
// another's. Every tunnel of the agent becomes a candidate for deletion, kept while a route uses it.
func (a *Agent) refreshTunnels(ctx context.Context) error {
	tunnels, err := a.dp.DumpIPIPTunnels(ctx)
	if err != nil {
		return err
	}
	src := a.tunnelSource()
	old := a.tun.refused
	a.tun = newTunnelState()
	a.tun.refused = old
	for _, t := range tunnels {
		key := tunnelKey{encap: calico.EncapIPIP, peer: t.Dst}
		usable := t.Src == src && t.TableID == a.cfg.TableID && t.Mode == vppapi.TunnelP2P
		switch {
		case t.Tag == TunnelTag:
			own := &ownTunnel{key: key, swIfIndex: t.SwIfIndex, instance: t.Instance, src: t.Src}
			a.tun.byIndex[t.SwIfIndex] = own
			a.tun.unusedMaybe[t.SwIfIndex] = struct{}{}
			if usable {
				a.tun.byKey[key] = own
				a.fixTunnelMTU(ctx, own, t.MTU)
			}
		case usable:
			a.tun.foreign[key] = t.SwIfIndex
		}
	}
	a.m.tunnels.WithLabelValues(calico.EncapIPIP.String()).Set(float64(len(a.tun.byIndex)))
	if !a.tunnelsRead && len(a.tun.byIndex) > 0 {
		a.log.Info("adopted the agent's tunnels VPP has", "tunnels", len(a.tun.byIndex), "usable", len(a.tun.byKey))
	}
	a.tunnelsRead = true
	return nil
}

// fixTunnelMTU sets the MTU of tunnel t, whose MTU is now have, when it is not the one a new tunnel gets
// (the uplink's MTU or FelixConfiguration's ipipMTU changed since it was made).
func (a *Agent) fixTunnelMTU(ctx context.Context, t *ownTunnel, have uint32) {
	want := a.tunnelMTU()
	if want == 0 || want == have || a.cfg.DryRun {
		return
	}
	if err := a.dp.SetTunnelMTU(ctx, t.swIfIndex, want); err != nil {
		a.log.Warn("cannot set a tunnel's MTU; will retry", "tunnel", t.name(), "mtu", want, "err", err)
		a.scheduleRetry()
		return
	}
	a.log.Info("set a tunnel's MTU", "tunnel", t.name(), "sw_if_index", t.swIfIndex, "mtu", want, "was", have)
}

// tunnelFor returns the agent's tunnel of encapsulation e to peer, creating it (tagged, unnumbered to
// the uplink, with the tunnel MTU, admin up) if there is none: before the first route through it. It
// reports false when there is none to use: another's tunnel to that peer, no tunnel source, a dry run
// or a failure (logged; a retry is scheduled).
func (a *Agent) tunnelFor(ctx context.Context, e calico.Encap, peer netip.Addr) (uint32, bool) {
	key := tunnelKey{encap: e, peer: peer}
	if t, ok := a.tun.byKey[key]; ok {
		return t.swIfIndex, true
	}
	if idx, ok := a.tun.foreign[key]; ok {
		a.refuseTunnel(key, "a tunnel to the peer that is not the agent's exists (sw_if_index "+
			strconv.FormatUint(uint64(idx), 10)+"): leaving the route as it is")
		return 0, false
	}
	src := a.tunnelSource()
	if !src.IsValid() {
		a.refuseTunnel(key, "this node has no IPv4 uplink address or peer IP to be the tunnel's source: leaving the route as it is")
		return 0, false
	}
	if a.cfg.DryRun {
		if a.tun.refused[key] != "dry run" { // once per peer, not at every resync
			a.tun.refused[key] = "dry run"
			a.log.Info("dry run: would create a tunnel (its routes are not shown as added)", "encap", e.String(), "src", src, "dst", peer)
		}
		return 0, false
	}
	spec := vppapi.IPIPSpec{Src: src, Dst: peer, TableID: a.cfg.TableID, Unnumbered: a.uplink, MTU: a.tunnelMTU(), Tag: TunnelTag}
	idx, err := a.dp.EnsureIPIPTunnel(ctx, spec)
	if err != nil {
		a.m.tunnelOps.WithLabelValues("create", "error").Inc()
		a.log.Warn("cannot create a tunnel; its routes stay as they are, will retry", "encap", e.String(), "dst", peer, "err", err)
		if idx != 0 {
			// Half set up (tagged first, so it is the agent's): deleted unless a retry finishes it.
			a.tun.byIndex[idx] = &ownTunnel{key: key, swIfIndex: idx, src: src}
			a.tun.unusedMaybe[idx] = struct{}{}
		}
		a.scheduleRetry()
		return 0, false
	}
	a.m.tunnelOps.WithLabelValues("create", "ok").Inc()
	t := &ownTunnel{key: key, swIfIndex: idx, src: src, instance: a.instanceOf(ctx, idx)}
	a.tun.byKey[key], a.tun.byIndex[idx] = t, t
	delete(a.tun.refused, key)
	a.m.tunnels.WithLabelValues(e.String()).Set(float64(len(a.tun.byIndex)))
	a.log.Info("created a tunnel", "encap", e.String(), "tunnel", t.name(), "sw_if_index", idx, "src", src, "dst", peer, "mtu", spec.MTU)
	return idx, true
}

// instanceOf finds the instance (the N of ipip<N>) of tunnel idx, for logs and /debug/routes; 0 if the
// dump fails (the next full resync reads it).
func (a *Agent) instanceOf(ctx context.Context, idx uint32) uint32 {
	t, ok, err := a.dp.IPIPTunnelAt(ctx, idx)
	if err != nil || !ok {
		return 0
	}
	return t.Instance
}

func (a *Agent) refuseTunnel(key tunnelKey, why string) {
	if a.tun.refused[key] == why {
		return
	}
	a.tun.refused[key] = why
	a.m.conflicts.Inc()
	a.log.Warn("cannot route through a tunnel to a peer", "encap", key.encap.String(), "peer", key.peer, "why", why)
}

// tunnelMTU is the MTU of a new IPIP tunnel: FelixConfiguration's ipipMTU, else the uplink's MTU less
// the 20 bytes of IPIP (calico.TunnelConfig.MTU); 0 (VPP's default) while the uplink's MTU is unknown.
func (a *Agent) tunnelMTU() uint32 {
	if a.uplinkMTU == 0 {
		return 0
	}
	mtu := a.tunnelCfg.MTU(calico.EncapIPIP, false, int(a.uplinkMTU))
	if mtu <= 0 {
		return 0
	}
	return uint32(mtu)
}

// gcTunnels deletes the agent's tunnels that may have lost their last route (unusedMaybe) and that no
// programmed route goes through: after the routes through them are deleted or moved, in the same
// reconcile (VPP keeps a route through a deleted tunnel dead until it is deleted and added again).
func (a *Agent) gcTunnels(ctx context.Context) {
	if len(a.tun.unusedMaybe) == 0 || !a.programmedValid || a.cfg.DryRun {
		return
	}
	used := map[uint32]struct{}{}
	for _, r := range a.programmed {
		if _, maybe := a.tun.unusedMaybe[r.SwIfIndex]; maybe {
			used[r.SwIfIndex] = struct{}{}
		}
	}
	idxs := make([]uint32, 0, len(a.tun.unusedMaybe))
	for idx := range a.tun.unusedMaybe {
		idxs = append(idxs, idx)
	}
	slices.Sort(idxs)
	for _, idx := range idxs {
		if _, inUse := used[idx]; inUse {
			delete(a.tun.unusedMaybe, idx)
			continue
		}
		t := a.tun.byIndex[idx]
		if t == nil {
			delete(a.tun.unusedMaybe, idx)
			continue
		}
		if err := a.dp.DeleteIPIPTunnel(ctx, idx); err != nil {
			a.m.tunnelOps.WithLabelValues("delete", "error").Inc()
			a.log.Warn("cannot delete a tunnel no route uses; will retry", "tunnel", t.name(), "sw_if_index", idx, "err", err)
			a.scheduleRetry()
			continue
		}
		a.m.tunnelOps.WithLabelValues("delete", "ok").Inc()
		a.log.Info("deleted a tunnel no route uses", "encap", t.key.encap.String(), "tunnel", t.name(), "sw_if_index", idx, "dst", t.key.peer)
		delete(a.tun.unusedMaybe, idx)
		delete(a.tun.byIndex, idx)
		if a.tun.byKey[t.key] == t {
			delete(a.tun.byKey, t.key)
		}
	}
	a.m.tunnels.WithLabelValues(calico.EncapIPIP.String()).Set(float64(len(a.tun.byIndex)))
}

// reattachTunnels sets the agent's usable tunnels up again after the uplink came back (with a new index,
// or the same): unnumbered to the uplink as it is now, MTU, admin up. VPP drops an interface's
// unnumbered use of a deleted one.
func (a *Agent) reattachTunnels(ctx context.Context) {
	for key, t := range a.tun.byKey {
		spec := vppapi.IPIPSpec{Src: t.src, Dst: key.peer, TableID: a.cfg.TableID, Unnumbered: a.uplink, MTU: a.tunnelMTU(), Tag: TunnelTag}
		if _, err := a.dp.EnsureIPIPTunnel(ctx, spec); err != nil {
			a.log.Warn("cannot set a tunnel up again on the uplink; will retry", "tunnel", t.name(), "err", err)
			a.scheduleRetry()
		}
	}
}

// wantRoute is the route VPP must have for target tgt of prefix p, given what is programmed (have):
// via the next hop on the uplink, or through the tunnel to it. A route of a pool whose modes are in
// question (EncapProblem) keeps the encapsulation it has. It reports false when the route cannot be
// built now (no tunnel to use): what is programmed then stays.
func (a *Agent) wantRoute(ctx context.Context, p netip.Prefix, tgt target, have vppapi.Route, programmed bool) (vppapi.Route, bool) {
	e := tgt.route.Encap
	if tgt.route.EncapProblem && programmed {
		e = calico.EncapNone
		if a.isTunnel(have.SwIfIndex) {
			e = calico.EncapIPIP
		}
	}
	if e == calico.EncapIPIP {
		idx, ok := a.tunnelFor(ctx, e, tgt.route.NextHop)
		if !ok {
			return vppapi.Route{}, false
		}
		return vppapi.Route{Prefix: p, SwIfIndex: idx, TableID: a.cfg.TableID}, true
	}
	return vppapi.Route{Prefix: p, NextHop: tgt.route.NextHop, SwIfIndex: a.uplink, TableID: a.cfg.TableID}, true
}

// noteEncap logs, once per pool and state, the pools whose encapsulation the agent does not follow as
// written: a VXLAN pool (not implemented yet: its blocks keep flat routes, never withdrawn for it) and
// a pool whose modes Calico's validator would refuse (blockwatch logs and counts the field; its routes
// keep the encapsulation they have).
func (a *Agent) noteEncap(snap *blockwatch.Snapshot) {
	for name, p := range snap.Pools {
		msg := ""
		switch {
		case len(p.EncapProblems()) > 0:
			msg = "the pool's encapsulation modes are in question: its routes keep the encapsulation they have in VPP; new ones follow Calico's reading"
		case p.Encap().Type == calico.EncapVXLAN:
			msg = vxlanPending + " for the pool's blocks (kept, never withdrawn for it)"
		}
		if a.encapLogged[name] == msg {
			continue
		}
		a.encapLogged[name] = msg
		if msg != "" {
			a.log.Warn(msg, "pool", name, "cidr", p.CIDR, "ipipMode", string(p.IPIPMode), "vxlanMode", string(p.VXLANMode))
		}
	}
	for name := range a.encapLogged {
		if _, ok := snap.Pools[name]; !ok {
			delete(a.encapLogged, name)
		}
	}
}

// checkMTU exports the largest pod MTU the routes this node programs can carry (the uplink's MTU, less
// the IPIP overhead while any managed IPv4 pool encapsulates with IPIP), and warns once when the IPIP
// MTU configured in FelixConfiguration (ipipMTU) does not fit in the uplink's MTU with the 20 bytes of
// IPIP.
func (a *Agent) checkMTU() {
	if a.uplinkMTU == 0 {
		return
	}
	uplink := int(a.uplinkMTU)
	pod := uplink
	warn := ""
	for _, p := range a.desired.enc.pools {
		if p.encap.Type != calico.EncapIPIP || !inPools(a.pools, p.cidr) {
			continue
		}
		mtu := a.tunnelCfg.MTU(calico.EncapIPIP, false, uplink)
		over := calico.EncapIPIP.Overhead(false)
		pod = min(pod, mtu, uplink-over) // a configured MTU too large for the uplink does not fit either
		if mtu+over > uplink {
			warn = fmt.Sprintf("IPIP MTU %d (FelixConfiguration ipipMTU) plus its %d bytes exceeds the uplink's MTU %d: "+
				"full-size packets of pool %s will be fragmented or dropped", mtu, over, uplink, p.cidr)
		}
	}
	a.m.podMTU.Set(float64(pod))
	if warn != a.mtuWarned {
		a.mtuWarned = warn
		if warn != "" {
			a.log.Warn(warn)
		}
	}
}
