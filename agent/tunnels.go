package agent

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/vpp-route-agent/vpp-route-agent/blockwatch"
	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/vppapi"
)

// TunnelTag is the VPP interface tag the agent puts on the tunnels it creates: what tells them apart from
// an operator's after a restart of the agent (VPP keeps a tag until the interface is deleted, measured
// on 26.06). A tunnel without it is never adopted, reused or deleted.
const TunnelTag = "vpp-route-agent"

// tunnelKey names one tunnel of the agent: its encapsulation and the node it leads to (IPIP: the peer
// IP, the route's next hop; VXLAN: the node IP of the owner's Calico Node, the underlay destination).
// A VXLAN tunnel's VNI and port are part of VPP's key too: a FelixConfiguration change makes new
// tunnels, the routes move to them (replaced in place), and the old ones are deleted.
type tunnelKey struct {
	encap calico.Encap
	peer  netip.Addr
	vni   uint32
	port  uint16
}

// ownTunnel is a tunnel the agent created (or adopted by its tag).
type ownTunnel struct {
	key       tunnelKey
	swIfIndex uint32
	instance  uint32
	src       netip.Addr
	// VXLAN only: the tunnel's MAC (this node's VTEP MAC) and the static neighbours the agent added on it
	// (remote VTEP IP -> MAC), the only neighbours it ever deletes.
	mac       vppapi.MAC
	neighbors map[netip.Addr]vppapi.MAC
}

// name is VPP's interface name of the tunnel.
func (t *ownTunnel) name() string {
	if t.key.encap == calico.EncapVXLAN {
		return vppapi.VXLANTunnel{Instance: t.instance}.Name()
	}
	return vppapi.IPIPTunnel{Instance: t.instance}.Name()
}

// vxlanSpec is the VPP spec of VXLAN tunnel t: its key, with the settings the agent gives its tunnels.
func (a *Agent) vxlanSpec(t *ownTunnel) vppapi.VXLANSpec {
	return vppapi.VXLANSpec{Src: t.src, Dst: t.key.peer, VNI: t.key.vni, Port: t.key.port, TableID: a.cfg.TableID,
		MAC: a.ownVTEPMAC(t.key.peer.Is6()), Unnumbered: a.uplinks[0].index, MTU: a.vxlanMTU(t.key.peer.Is6()), Tag: TunnelTag}
}

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

// isVXLAN reports whether idx is one of the agent's VXLAN tunnels (routes through it have a next hop).
func (a *Agent) isVXLAN(idx uint32) bool {
	t, ok := a.tun.byIndex[idx]
	return ok && t.key.encap == calico.EncapVXLAN
}

// tunnelSource is the outer source of this node's IPIP tunnels: its first IPv4 uplink address, else its
// first IPv4 peer IP (what it registers, and what the peers' tunnels expect as their destination).
func (a *Agent) tunnelSource() netip.Addr { return a.tunnelSourceFor(false) }

// tunnelSourceFor is tunnelSource in a family (a VXLAN tunnel's underlay is IPv6 for an IPv6 pool, as
// felix's vxlan-v6.calico).
func (a *Agent) tunnelSourceFor(v6 bool) netip.Addr {
	for _, p := range a.cfg.Uplink.Addresses { // the first uplink's: the tunnels are unnumbered to it
		if p.Addr().Is6() == v6 {
			return p.Addr()
		}
	}
	for _, ip := range a.cfg.PeerIPs {
		if ip.Is6() == v6 {
			return ip
		}
	}
	return netip.Addr{}
}

// ownVTEPMAC is this node's VTEP MAC in a family, the MAC of its VXLAN tunnels: its Calico Node's
// vxlanTunnelMACAddr(V6) if set, else the one felix generates from the node name (what a Linux peer's
// felix puts in its neighbour entry for this node).
func (a *Agent) ownVTEPMAC(v6 bool) vppapi.MAC {
	if mac := a.ownNode.Family(v6).VXLANTunnelMAC; mac != (calico.MAC{}) {
		return vppapi.MAC(mac)
	}
	return vppapi.MAC(calico.GeneratedVTEPMAC(a.cfg.NodeName, v6))
}

// vxlanMTU is the MTU of a new VXLAN tunnel: FelixConfiguration's vxlanMTU(V6), else the uplink's less
// 50 (IPv4) or 70 (IPv6); 0 (VPP's default) while the uplink's MTU is unknown.
func (a *Agent) vxlanMTU(v6 bool) uint32 {
	if a.uplinks[0].mtu == 0 {
		return 0
	}
	return uint32(max(a.tunnelCfg.MTU(calico.EncapVXLAN, v6, int(a.uplinks[0].mtu)), 0))
}

// refreshVXLAN reads VPP's VXLAN tunnels (when it has the plugin) as refreshTunnels reads the IPIP ones,
// and the static neighbours on the agent's: adopted as they are. A usable tunnel of the agent whose MAC
// is not this node's VTEP MAC (the Node's vxlanTunnelMACAddr changed) is set again.
func (a *Agent) refreshVXLAN(ctx context.Context) error {
	if !a.dp.Status().VXLAN {
		return nil
	}
	tunnels, err := a.dp.DumpVXLANTunnels(ctx)
	if err != nil {
		return err
	}
	for _, t := range tunnels {
		key := tunnelKey{encap: calico.EncapVXLAN, peer: t.Dst, vni: t.VNI, port: t.SrcPort}
		usable := t.Src == a.tunnelSourceFor(t.Dst.Is6()) && t.TableID == a.cfg.TableID
		switch {
		case t.Tag == TunnelTag:
			own := &ownTunnel{key: key, swIfIndex: t.SwIfIndex, instance: t.Instance, src: t.Src, mac: t.MAC,
				neighbors: map[netip.Addr]vppapi.MAC{}}
			nbrs, err := a.dp.DumpNeighbors(ctx, t.SwIfIndex)
			if err != nil {
				return err
			}
			for _, n := range nbrs {
				if n.Static {
					own.neighbors[n.IP] = n.MAC
				}
			}
			a.tun.byIndex[t.SwIfIndex] = own
			a.tun.unusedMaybe[t.SwIfIndex] = struct{}{}
			if usable {
				a.tun.byKey[key] = own
				a.fixTunnelMTU(ctx, own, t.MTU)
				if want := a.ownVTEPMAC(t.Dst.Is6()); t.MAC != want && !a.cfg.DryRun {
					if _, err := a.dp.EnsureVXLANTunnel(ctx, a.vxlanSpec(own)); err != nil {
						a.log.Warn("cannot set a tunnel's MAC to this node's VTEP MAC; will retry", "tunnel", own.name(), "mac", want, "err", err)
						a.scheduleRetry()
					} else {
						own.mac = want
					}
				}
			}
		case usable && a.halfMade(key):
			a.adoptHalfMade(key, t.SwIfIndex, t.Src)
		case usable:
			a.tun.foreign[key] = t.SwIfIndex
		}
	}
	return nil
}

// halfMade reports whether this process asked VPP for the tunnel of key without finishing its set-up.
func (a *Agent) halfMade(key tunnelKey) bool {
	_, ok := a.tunPending[key]
	return ok
}

// adoptHalfMade takes the untagged tunnel idx of key, which this process asked VPP for, as the agent's:
// not usable until the next creation finishes it (tag, unnumbered, MTU, up), deleted if no route wants it.
func (a *Agent) adoptHalfMade(key tunnelKey, idx uint32, src netip.Addr) {
	a.tun.byIndex[idx] = &ownTunnel{key: key, swIfIndex: idx, src: src, neighbors: map[netip.Addr]vppapi.MAC{}}
	a.tun.unusedMaybe[idx] = struct{}{}
	a.log.Info("found a tunnel whose set-up was cut short; finishing it", "encap", key.encap.String(), "dst", key.peer, "sw_if_index", idx)
}

// countTunnels sets the tunnels gauge of each encapsulation.
func (a *Agent) countTunnels() {
	n := map[calico.Encap]int{}
	for _, t := range a.tun.byIndex {
		n[t.key.encap]++
	}
	for _, e := range []calico.Encap{calico.EncapIPIP, calico.EncapVXLAN} {
		a.m.tunnels.WithLabelValues(e.String()).Set(float64(n[e]))
	}
}

// putTunnel records t as the agent's tunnel idx and moves the tunnels gauge by one: a recount at every
// creation (countTunnels) made a cold start towards n peers O(n²).
func (a *Agent) putTunnel(idx uint32, t *ownTunnel) {
	if old := a.tun.byIndex[idx]; old != nil {
		a.m.tunnels.WithLabelValues(old.key.encap.String()).Dec()
	}
	a.tun.byIndex[idx] = t
	a.m.tunnels.WithLabelValues(t.key.encap.String()).Inc()
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
		case usable && a.halfMade(key):
			a.adoptHalfMade(key, t.SwIfIndex, t.Src)
		case usable:
			a.tun.foreign[key] = t.SwIfIndex
		}
	}
	if err := a.refreshVXLAN(ctx); err != nil {
		return err
	}
	a.countTunnels()
	if !a.tunnelsRead && len(a.tun.byIndex) > 0 {
		a.log.Info("adopted the agent's tunnels VPP has", "tunnels", len(a.tun.byIndex), "usable", len(a.tun.byKey))
	}
	a.tunnelsRead = true
	return nil
}

// fixTunnelMTU sets the MTU of tunnel t, whose MTU is now have, when it is not the one a new tunnel of
// its encapsulation gets (the uplink's MTU or FelixConfiguration's ipipMTU, vxlanMTU or vxlanMTUV6
// changed since it was made). VPP takes sw_interface_set_mtu on a VXLAN tunnel as on an IPIP one (the
// creation sets it so too), so both follow.
func (a *Agent) fixTunnelMTU(ctx context.Context, t *ownTunnel, have uint32) {
	want := a.tunnelMTU()
	if t.key.encap == calico.EncapVXLAN {
		want = a.vxlanMTU(t.key.peer.Is6())
	}
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
// reports false when there is none to use: another's tunnel to that peer, no tunnel source, no vxlan
// plugin in VPP, a dry run or a failure (logged; a retry is scheduled).
func (a *Agent) tunnelFor(ctx context.Context, e calico.Encap, peer netip.Addr) (*ownTunnel, bool) {
	key := tunnelKey{encap: e, peer: peer}
	if e == calico.EncapVXLAN {
		key.vni, key.port = uint32(a.tunnelCfg.VXLANVNI), uint16(a.tunnelCfg.VXLANPort)
	}
	if t, ok := a.tun.byKey[key]; ok {
		return t, true
	}
	if idx, ok := a.tun.foreign[key]; ok {
		a.refuseTunnel(key, "a tunnel to the peer that is not the agent's exists (sw_if_index "+
			strconv.FormatUint(uint64(idx), 10)+"): leaving the route as it is")
		return nil, false
	}
	src := a.tunnelSourceFor(peer.Is6())
	if !src.IsValid() {
		a.refuseTunnel(key, "this node has no uplink address or peer IP of the family to be the tunnel's source: leaving the route as it is")
		return nil, false
	}
	if e == calico.EncapVXLAN && !a.dp.Status().VXLAN {
		a.noVXLANPlugin()
		return nil, false
	}
	if a.cfg.DryRun {
		if a.tun.refused[key] != "dry run" { // once per peer, not at every resync
			a.tun.refused[key] = "dry run"
			a.log.Info("dry run: would create a tunnel (its routes are not shown as added)", "encap", e.String(), "src", src, "dst", peer)
		}
		return nil, false
	}
	t := &ownTunnel{key: key, src: src}
	if a.tunPending == nil {
		a.tunPending = map[tunnelKey]struct{}{}
	}
	a.tunPending[key] = struct{}{}
	var idx uint32
	var err error
	var mtu uint32
	if e == calico.EncapVXLAN {
		t.mac, t.neighbors = a.ownVTEPMAC(peer.Is6()), map[netip.Addr]vppapi.MAC{}
		spec := a.vxlanSpec(t)
		mtu = spec.MTU
		idx, err = a.dp.EnsureVXLANTunnel(ctx, spec)
	} else {
		mtu = a.tunnelMTU()
		idx, err = a.dp.EnsureIPIPTunnel(ctx, vppapi.IPIPSpec{Src: src, Dst: peer, TableID: a.cfg.TableID, Unnumbered: a.uplinks[0].index, MTU: mtu, Tag: TunnelTag})
	}
	t.swIfIndex = idx
	if err != nil {
		a.m.tunnelOps.WithLabelValues("create", "error").Inc()
		a.log.Warn("cannot create a tunnel; its routes stay as they are, will retry", "encap", e.String(), "dst", peer, "err", err)
		if idx != 0 {
			// Half set up (tagged first, so it is the agent's): deleted unless a retry finishes it.
			a.putTunnel(idx, t)
			a.tun.unusedMaybe[idx] = struct{}{}
		}
		a.scheduleRetry()
		return nil, false
	}
	a.m.tunnelOps.WithLabelValues("create", "ok").Inc()
	delete(a.tunPending, key)
	t.instance = a.instanceOf(ctx, e, idx)
	a.tun.byKey[key] = t
	a.putTunnel(idx, t)
	delete(a.tun.refused, key)
	a.log.Info("created a tunnel", "encap", e.String(), "tunnel", t.name(), "sw_if_index", idx, "src", src, "dst", peer, "mtu", mtu)
	return t, true
}

// noVXLANPlugin logs, once while VPP lacks it, that routes need VXLAN and VPP has no vxlan plugin; the
// gauge and /readyz count those routes (publish).
func (a *Agent) noVXLANPlugin() {
	if a.vxlanMissingLogged {
		return
	}
	a.vxlanMissingLogged = true
	a.log.Error("IP pools need VXLAN but VPP has no vxlan plugin (vxlan_plugin.so): their routes are not programmed "+
		"(those VPP has are kept); every other route is", "pools", a.vxlanPools())
}

// vxlanPools names the pools whose mode is VXLAN, for the log.
func (a *Agent) vxlanPools() []string {
	var out []string
	for _, p := range a.desired.enc.pools {
		if p.encap.Type == calico.EncapVXLAN {
			out = append(out, p.cidr.String())
		}
	}
	return out
}

// ensureNeighbor makes remote VTEP ip a static neighbour with mac on VXLAN tunnel t, unless the agent
// already did; false when it fails (logged, retried): a route via ip would have no MAC to send to.
func (a *Agent) ensureNeighbor(ctx context.Context, t *ownTunnel, ip netip.Addr, mac calico.MAC) bool {
	if have, ok := t.neighbors[ip]; ok && have == vppapi.MAC(mac) {
		return true
	}
	if err := a.dp.EnsureNeighbor(ctx, t.swIfIndex, ip, vppapi.MAC(mac)); err != nil {
		a.log.Warn("cannot add a remote VTEP's neighbour entry; its routes stay as they are, will retry", "tunnel", t.name(), "vtep", ip, "mac", mac.String(), "err", err)
		a.scheduleRetry()
		return false
	}
	t.neighbors[ip] = vppapi.MAC(mac)
	return true
}

// instanceOf finds the instance (the N of ipip<N>) of tunnel idx, for logs and /debug/routes; 0 if the
// dump fails (the next full resync reads it).
func (a *Agent) instanceOf(ctx context.Context, e calico.Encap, idx uint32) uint32 {
	if e == calico.EncapVXLAN {
		tunnels, err := a.dp.DumpVXLANTunnels(ctx)
		if err != nil {
			return 0
		}
		for _, t := range tunnels {
			if t.SwIfIndex == idx {
				return t.Instance
			}
		}
		return 0
	}
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
	if a.uplinks[0].mtu == 0 {
		return 0
	}
	mtu := a.tunnelCfg.MTU(calico.EncapIPIP, false, int(a.uplinks[0].mtu))
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
	used := map[uint32]map[netip.Addr]struct{}{} // tunnel -> the next hops of the routes through it
	for _, r := range a.programmed {
		if _, maybe := a.tun.unusedMaybe[r.SwIfIndex]; maybe {
			if used[r.SwIfIndex] == nil {
				used[r.SwIfIndex] = map[netip.Addr]struct{}{}
			}
			used[r.SwIfIndex][r.NextHop] = struct{}{}
		}
	}
	idxs := make([]uint32, 0, len(a.tun.unusedMaybe))
	for idx := range a.tun.unusedMaybe {
		idxs = append(idxs, idx)
	}
	slices.Sort(idxs)
	for _, idx := range idxs {
		t := a.tun.byIndex[idx]
		if nhs, inUse := used[idx]; inUse || t == nil {
			if t != nil && !a.gcNeighbors(ctx, t, nhs) {
				continue // kept in unusedMaybe: retried
			}
			delete(a.tun.unusedMaybe, idx)
			continue
		}
		var err error
		if t.key.encap == calico.EncapVXLAN {
			err = a.dp.DeleteVXLANTunnel(ctx, a.vxlanSpec(t)) // VPP deletes its neighbours with it
		} else {
			err = a.dp.DeleteIPIPTunnel(ctx, idx)
		}
		if err != nil {
			a.m.tunnelOps.WithLabelValues("delete", "error").Inc()
			a.log.Warn("cannot delete a tunnel no route uses; will retry", "tunnel", t.name(), "sw_if_index", idx, "err", err)
			a.scheduleRetry()
			continue
		}
		a.m.tunnelOps.WithLabelValues("delete", "ok").Inc()
		a.log.Info("deleted a tunnel no route uses", "encap", t.key.encap.String(), "tunnel", t.name(), "sw_if_index", idx, "dst", t.key.peer)
		delete(a.tun.unusedMaybe, idx)
		delete(a.tun.byIndex, idx)
		delete(a.tunPending, t.key)
		if a.tun.byKey[t.key] == t {
			delete(a.tun.byKey, t.key)
		}
	}
	a.countTunnels()
}

// gcNeighbors deletes the static neighbours the agent added on VXLAN tunnel t that no programmed route
// through it uses as next hop (nhs): after the routes moved (a node's VTEP address changed). False when
// a delete failed (retried).
func (a *Agent) gcNeighbors(ctx context.Context, t *ownTunnel, nhs map[netip.Addr]struct{}) bool {
	ok := true
	for ip := range t.neighbors {
		if _, used := nhs[ip]; used {
			continue
		}
		if err := a.dp.DeleteNeighbor(ctx, t.swIfIndex, ip); err != nil {
			a.log.Warn("cannot delete a neighbour no route uses; will retry", "tunnel", t.name(), "vtep", ip, "err", err)
			a.scheduleRetry()
			ok = false
			continue
		}
		delete(t.neighbors, ip)
	}
	return ok
}

// reattachTunnels sets the agent's usable tunnels up again after the uplink came back (with a new index,
// or the same): unnumbered to the uplink as it is now, MTU, admin up. VPP drops an interface's
// unnumbered use of a deleted one.
func (a *Agent) reattachTunnels(ctx context.Context) {
	for key, t := range a.tun.byKey {
		if key.encap == calico.EncapVXLAN {
			if _, err := a.dp.EnsureVXLANTunnel(ctx, a.vxlanSpec(t)); err != nil {
				a.log.Warn("cannot set a tunnel up again on the uplink; will retry", "tunnel", t.name(), "err", err)
				a.scheduleRetry()
			}
			continue
		}
		spec := vppapi.IPIPSpec{Src: t.src, Dst: key.peer, TableID: a.cfg.TableID, Unnumbered: a.uplinks[0].index, MTU: a.tunnelMTU(), Tag: TunnelTag}
		if _, err := a.dp.EnsureIPIPTunnel(ctx, spec); err != nil {
			a.log.Warn("cannot set a tunnel up again on the uplink; will retry", "tunnel", t.name(), "err", err)
			a.scheduleRetry()
		}
	}
}

// wantRoute is the route VPP must have for target tgt of prefix p, given what is programmed (have):
// via the next hop on the uplink, through the IPIP tunnel to it, or via the remote VTEP through the
// VXLAN tunnel to the owner's node IP (its static neighbour added first). A route of a pool whose modes
// are in question (EncapProblem) keeps the encapsulation it has; a held one (its VTEP unknown) stays
// as it is. It reports false when the route cannot be built now (no tunnel to use): what is programmed
// then stays.
func (a *Agent) wantRoute(ctx context.Context, p netip.Prefix, tgt target, have vppapi.Route, programmed bool) (vppapi.Route, bool) {
	e := tgt.route.Encap
	if tgt.route.Hold || tgt.route.EncapProblem && programmed && (e == calico.EncapVXLAN || a.isVXLAN(have.SwIfIndex)) {
		// Kept exactly: a VXLAN route's NextHop is a VTEP, not the peer IP another encapsulation needs.
		return have, programmed
	}
	if tgt.route.EncapProblem && programmed {
		e = calico.EncapNone
		if a.isTunnel(have.SwIfIndex) {
			e = calico.EncapIPIP
		}
	}
	switch e {
	case calico.EncapIPIP:
		t, ok := a.tunnelFor(ctx, e, tgt.route.NextHop)
		if !ok {
			return vppapi.Route{}, false
		}
		return vppapi.Route{Prefix: p, SwIfIndex: t.swIfIndex, TableID: a.cfg.TableID}, true
	case calico.EncapVXLAN:
		t, ok := a.tunnelFor(ctx, e, tgt.route.Underlay)
		if !ok || !a.ensureNeighbor(ctx, t, tgt.route.NextHop, tgt.route.VTEPMAC) {
			return vppapi.Route{}, false
		}
		return vppapi.Route{Prefix: p, NextHop: tgt.route.NextHop, SwIfIndex: t.swIfIndex, TableID: a.cfg.TableID}, true
	}
	if len(a.uplinks) == 1 && tgt.route.MoreNextHops.Len() == 0 {
		return vppapi.Route{Prefix: p, NextHop: tgt.route.NextHop, SwIfIndex: a.uplinks[0].index, TableID: a.cfg.TableID}, true
	}
	return vppapi.NewRoute(p, a.cfg.TableID, a.hopsOf(tgt.route)), true
}

// hopsOf returns the paths of route r without encapsulation: via each of the owner's peer IPs
// (NextHop, then MoreNextHops) out of every uplink with an address whose subnet holds it. Without an
// uplink address of the family (--peer-ip) there is no subnet to judge by: the owner's n-th peer IP goes
// out of the n-th uplink. A peer IP on no uplink's subnet is logged once and counted, and gets no path;
// when none has one, the route goes via the first peer IP out of the first uplink, as with one uplink.
func (a *Agent) hopsOf(r *DesiredRoute) []vppapi.Hop {
	nhs := append([]netip.Addr{r.NextHop}, r.MoreNextHops.All()...)
	v6 := r.NextHop.Is6()
	judged := false // some uplink has an address of the family
	var hops []vppapi.Hop
	for _, u := range a.uplinks {
		for _, p := range u.cfg.Addresses {
			if p.Addr().Is6() != v6 {
				continue
			}
			judged = true
			for _, nh := range nhs {
				if p.Contains(nh) && nh != p.Addr() {
					hops = append(hops, vppapi.Hop{NextHop: nh, SwIfIndex: u.index})
				}
			}
		}
	}
	if judged {
		for _, nh := range nhs {
			if !slices.ContainsFunc(hops, func(h vppapi.Hop) bool { return h.NextHop == nh }) {
				a.noteOffUplink(r.Owner, nh)
			}
		}
	} else {
		for i, nh := range nhs[:min(len(nhs), len(a.uplinks))] {
			hops = append(hops, vppapi.Hop{NextHop: nh, SwIfIndex: a.uplinks[i].index})
		}
	}
	if len(hops) == 0 {
		return []vppapi.Hop{{NextHop: r.NextHop, SwIfIndex: a.uplinks[0].index}}
	}
	return hops[:min(len(hops), vppapi.MaxPaths)]
}

// noteOffUplink logs and counts, once, that node's peer IP nh is on no uplink's subnet.
func (a *Agent) noteOffUplink(node string, nh netip.Addr) {
	if _, logged := a.offUplink[nh]; logged {
		return
	}
	a.offUplink[nh] = struct{}{}
	a.m.offUplink.Inc()
	a.log.Warn("a peer IP is on no uplink's subnet: no path goes to it", "node", node, "peer_ip", nh)
}

// noteEncap logs, once per pool and state, the pools whose encapsulation the agent does not follow as
// written: a pool whose modes Calico's validator would refuse (blockwatch logs and counts the field; its
// routes keep the encapsulation they have).
func (a *Agent) noteEncap(snap *blockwatch.Snapshot) {
	for name, p := range snap.Pools {
		msg := ""
		switch {
		case len(p.EncapProblems()) > 0:
			msg = "the pool's encapsulation modes are in question: its routes keep the encapsulation they have in VPP; new ones follow Calico's reading"
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
// the overhead of each encapsulation a managed pool uses, or the MTU FelixConfiguration gives it if
// smaller), and counts and warns (once per change) about each pool whose configured tunnel MTU
// (ipipMTU, vxlanMTU, vxlanMTUV6) does not fit in the uplink's MTU with the encapsulation's overhead.
func (a *Agent) checkMTU() {
	if a.uplinks[0].mtu == 0 {
		return
	}
	uplink := int(a.uplinks[0].mtu)
	pod := uplink
	var warns []string
	for _, p := range a.desired.enc.pools {
		e := p.encap.Type
		if e == calico.EncapNone || !inPools(a.pools, p.cidr) {
			continue
		}
		v6 := e == calico.EncapVXLAN && p.cidr.Addr().Is6() // IPIP's underlay is IPv4
		mtu := a.tunnelCfg.MTU(e, v6, uplink)
		over := e.Overhead(v6)
		pod = min(pod, mtu, uplink-over) // a configured MTU too large for the uplink does not fit either
		if mtu+over > uplink {
			field := "ipipMTU"
			if e == calico.EncapVXLAN {
				field = map[bool]string{false: "vxlanMTU", true: "vxlanMTUV6"}[v6]
			}
			warns = append(warns, fmt.Sprintf("%s MTU %d (FelixConfiguration %s) plus its %d bytes exceeds the uplink's MTU %d: "+
				"full-size packets of pool %s will be fragmented or dropped", e, mtu, field, over, uplink, p.cidr))
		}
	}
	a.m.podMTU.Set(float64(pod))
	a.m.mtuTooLarge.Set(float64(len(warns)))
	warn := strings.Join(warns, "; ")
	if warn != a.mtuWarned {
		a.mtuWarned = warn
		if warn != "" {
			a.log.Warn(warn)
		}
	}
}
