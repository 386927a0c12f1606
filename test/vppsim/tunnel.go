package vppsim

import (
	"fmt"
	"net/netip"
	"slices"

	"go.fd.io/govpp/api"
	"go.fd.io/govpp/binapi/fib_types"
	interfaces "go.fd.io/govpp/binapi/interface"
	"go.fd.io/govpp/binapi/interface_types"
	"go.fd.io/govpp/binapi/ip"
	"go.fd.io/govpp/binapi/ip_types"
	"go.fd.io/govpp/binapi/ipip"
	"go.fd.io/govpp/binapi/teib"
	"go.fd.io/govpp/binapi/tunnel_types"
)

// This file simulates VPP 26.06's IPIP tunnels, TEIB entries, unnumbered interfaces and interface MTUs,
// as measured through GoVPP on a real 26.06 (vppapi's TestIPIP* run the same assertions on both):
//
//   - ipip_add_tunnel creates an interface "ipip<N>" (N the lowest free instance unless one is given:
//     -147 if taken), admin down, MTU 9000/0/0/0, link MTU 65516, dev type "IPIP tunnel device". Checks:
//     src and dst of different families -153; src = dst -82; an unknown outer table -3; mode MP with a
//     dst other than 0.0.0.0 -58; the same (src, dst, table, mode) again -79 with the existing tunnel's
//     sw_if_index in the reply. A P2P tunnel to 0.0.0.0 and a src that is no address of VPP are accepted.
//   - ipip_del_tunnel of an index that is no tunnel (or a deleted one) is -6. Deleting a tunnel frees its
//     index for the next interface; API routes through it stay, dumped as before, but drop (dead), even
//     once a new tunnel takes the index, until deleted and added again. A delete carrying a path via the
//     deleted index is -54, as is an add.
//   - A route through an admin-up p2p tunnel makes VPP resolve the tunnel's dst in its outer table: a
//     recursive-resolution /32 (/128) via dst on the uplink (under a connected cover), dumped by
//     ip_route_dump, until the tunnel is deleted; not when the tunnel was down as its route came. Not
//     modelled: routes through a tunnel whose dst is unreachable drop (no API shows it).
//   - sw_interface_set_unnumbered: an unknown sw_if_index (the one with the address) is -10, an unknown
//     unnumbered_sw_if_index -2; setting it again, or removing it when not set, is 0.
//   - sw_interface_tag_add_del sets (is_add) or clears an interface's tag, shown in
//     sw_interface_details.tag; an empty tag to add is -7, an unknown index -2. Deleting the interface
//     clears its tag: the next interface that takes the index has none.
//   - sw_interface_set_mtu stores the four values as given (dumped in sw_interface_details.mtu); an
//     unknown index is -2.
//   - teib_entry_add_del: an unknown (or deleted) sw_if_index -2, an existing (sw_if_index, peer) -116,
//     deleting an unknown one -6. An entry adds peer/32 via the tunnel to table 0 (VPP's adjacency
//     source). Entries of a deleted tunnel stay (and cannot be deleted: -2) and belong to the next
//     interface that takes its index.

// Return values of the tunnel messages (VPP's vnet/api_errno.h).
const (
	rvInvalidValue       int32 = -7
	rvNoSuchEntry        int32 = -6
	rvInvalidSwIfIndex2  int32 = -10
	rvInvalidDstAddress  int32 = -58
	rvIfAlreadyExists    int32 = -79
	rvSameSrcDst         int32 = -82
	rvEntryAlreadyExists int32 = -116
	rvInstanceInUse      int32 = -147
	rvInvalidProtocol    int32 = -153
)

// tunnelLinkMTU is the link MTU VPP reports for an IPIP tunnel (measured).
const tunnelLinkMTU = 65516

// ipipTunnel is one simulated IPIP tunnel; its interface is ifaces[swIfIndex].
type ipipTunnel struct {
	swIfIndex uint32
	instance  uint32
	src, dst  netip.Addr
	tableID   uint32
	mode      tunnel_types.TunnelMode
	// tracked: VPP resolves dst in the outer table, with a recursive-resolution /32 (/128), since a route
	// first went through the tunnel while it was admin up (measured), until the tunnel is deleted.
	tracked bool
}

// teibEntry is one TEIB entry.
type teibEntry struct {
	swIfIndex uint32
	peer, nh  netip.Addr
	nhTable   uint32
}

// Tunnel is a snapshot of one simulated IPIP tunnel.
type Tunnel struct {
	SwIfIndex uint32     `json:"sw_if_index"`
	Name      string     `json:"name"`
	Src       netip.Addr `json:"src"`
	Dst       netip.Addr `json:"dst"`
	TableID   uint32     `json:"table_id"`
	// Multipoint is a p2mp (TEIB) tunnel.
	Multipoint bool `json:"multipoint,omitempty"`
	// Unnumbered is the sw_if_index whose addresses the tunnel borrows, ^uint32(0) if none.
	Unnumbered uint32 `json:"unnumbered"`
	// MTU is L3, IPv4, IPv6, MPLS as set (VPP's default 9000/0/0/0).
	MTU [4]uint32 `json:"mtu"`
	// AdminUp is the interface's admin state; Tag its tag ("" none).
	AdminUp bool   `json:"admin_up"`
	Tag     string `json:"tag,omitempty"`
}

// Tunnels returns a snapshot of the IPIP tunnels, by sw_if_index.
func (s *Sim) Tunnels() []Tunnel {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Tunnel
	for _, ifc := range s.ifaces {
		t := ifc.tunnel
		if t == nil || ifc.deleted {
			continue
		}
		out = append(out, Tunnel{SwIfIndex: ifc.index, Name: ifc.name, Src: t.src, Dst: t.dst, TableID: t.tableID,
			Multipoint: t.mode == tunnel_types.TUNNEL_API_MODE_MP, Unnumbered: ifc.unnumberedOf(), MTU: ifc.mtus(),
			AdminUp: ifc.adminUp, Tag: ifc.tag})
	}
	return out
}

// unnumberedOf returns the index whose addresses ifc borrows, ^uint32(0) if none.
func (i *iface) unnumberedOf() uint32 {
	if i.unnumbered == nil {
		return ^uint32(0)
	}
	return *i.unnumbered
}

// mtus returns the interface's L3/IPv4/IPv6/MPLS MTU as dumped.
func (i *iface) mtus() [4]uint32 {
	switch {
	case i.mtu != nil:
		return *i.mtu
	case i.index == 0:
		return [4]uint32{}
	}
	return [4]uint32{9000, 0, 0, 0}
}

// tunnelDetails fills in what sw_interface_details says of an IPIP tunnel (measured).
func tunnelDetails(d *interfaces.SwInterfaceDetails) {
	d.InterfaceDevType = "IPIP tunnel device"
	d.L2Address = [6]byte{}
	d.LinkDuplex = interface_types.LINK_DUPLEX_API_UNKNOWN
	d.LinkSpeed = 0
	d.LinkMtu = tunnelLinkMTU
}

func handleIPIPAddTunnel(s *Sim, c *conn, ctx uint32, msg api.Message) {
	m := msg.(*ipip.IpipAddTunnel)
	s.mu.Lock()
	idx, rv := s.addTunnel(m.Tunnel)
	var targets []eventTarget
	var ev interfaces.SwInterfaceEvent
	if rv == rvOK {
		targets, ev = s.eventTargets(), ifaceEvent(s.ifaces[idx])
	}
	s.mu.Unlock()
	c.reply(ctx, &ipip.IpipAddTunnelReply{Retval: rv, SwIfIndex: interface_types.InterfaceIndex(idx)})
	s.sendEvents(targets, ev)
}

// addTunnel applies ipip_add_tunnel; it returns the new tunnel's index, or with -79 the existing one's,
// else ^uint32(0). Call with s.mu held.
func (s *Sim) addTunnel(in ipip.IpipTunnel) (uint32, int32) {
	const none = ^uint32(0)
	src := addrFromUnion(in.Src.Un, in.Src.Af == ip_types.ADDRESS_IP6)
	dst := addrFromUnion(in.Dst.Un, in.Dst.Af == ip_types.ADDRESS_IP6)
	switch {
	case src.Is4() != dst.Is4():
		return none, rvInvalidProtocol
	case src == dst:
		return none, rvSameSrcDst
	case s.tables[tableKey{in.TableID, src.Is6()}] == nil:
		return none, rvNoSuchFIB
	case in.Mode == tunnel_types.TUNNEL_API_MODE_MP && !dst.IsUnspecified():
		return none, rvInvalidDstAddress
	}
	used := map[uint32]bool{}
	for _, ifc := range s.ifaces {
		t := ifc.tunnel
		if t == nil || ifc.deleted {
			continue
		}
		if t.src == src && t.dst == dst && t.tableID == in.TableID && t.mode == in.Mode {
			return ifc.index, rvIfAlreadyExists
		}
		used[t.instance] = true
	}
	instance, ok := pickInstance(in.Instance, used)
	if !ok {
		return none, rvInstanceInUse
	}
	name := fmt.Sprintf("ipip%d", instance)
	ifc := s.newIfaceSlot(name)
	*ifc = iface{index: ifc.index, name: name, carrier: true,
		tunnel: &ipipTunnel{swIfIndex: ifc.index, instance: instance, src: src, dst: dst, tableID: in.TableID, mode: in.Mode}}
	return ifc.index, rvOK
}

func handleIPIPDelTunnel(s *Sim, c *conn, ctx uint32, msg api.Message) {
	m := msg.(*ipip.IpipDelTunnel)
	s.mu.Lock()
	ifc := s.ifaceAt(uint32(m.SwIfIndex))
	if ifc == nil || ifc.tunnel == nil {
		s.mu.Unlock()
		c.reply(ctx, &ipip.IpipDelTunnelReply{Retval: rvNoSuchEntry})
		return
	}
	s.removeInterface(ifc)
	targets := s.eventTargets()
	ev := interfaces.SwInterfaceEvent{SwIfIndex: interface_types.InterfaceIndex(ifc.index), Deleted: true}
	s.mu.Unlock()
	c.reply(ctx, &ipip.IpipDelTunnelReply{})
	s.sendEvents(targets, ev)
}

// removeInterface deletes ifc as VPP does (see DeleteInterface): API routes through it stay but are dead,
// its addresses and adjacencies go, and so does every interface's unnumbered use of it. Call with s.mu held.
func (s *Sim) removeInterface(ifc *iface) {
	if tun := ifc.tunnel; tun != nil && tun.tracked {
		if t := s.tables[tableKey{tun.tableID, tun.dst.Is6()}]; t != nil {
			if t.rrRefs[tun.dst]--; t.rrRefs[tun.dst] <= 0 {
				delete(t.rrRefs, tun.dst)
			}
		}
		tun.tracked = false
	}
	hadAddrs := len(ifc.addrs) > 0 && ifc.adminUp
	ifc.deleted, ifc.adminUp, ifc.addrs, ifc.unnumbered, ifc.mtu, ifc.tag = true, false, nil, nil, nil, ""
	for _, other := range s.ifaces {
		if other.unnumbered != nil && *other.unnumbered == ifc.index {
			other.unnumbered = nil
		}
	}
	if hadAddrs {
		s.syncInterfaceRoutes()
	}
	for _, t := range s.tables {
		for _, e := range t.entries {
			for _, p := range e.api {
				if p.swIfIndex == ifc.index {
					e.apiDead = true
					t.dead[e] = struct{}{}
				}
			}
			if len(e.adj) > 0 && e.adj[0].swIfIndex == ifc.index && !s.hasTEIB(ifc.index, e.prefix) {
				e.adj = nil
				t.gc(e)
				s.syncRRAfter(t, e.prefix)
			}
		}
		s.syncRRAfter(t, netip.Prefix{}) // the tunnel's destination, no longer resolved
	}
}

// trackTunnels starts resolving the destination of each admin-up p2p tunnel that paths go through (see
// ipipTunnel.tracked). Call with s.mu held.
func (s *Sim) trackTunnels(paths []fibPath) {
	for _, p := range paths {
		ifc := s.ifaceAt(p.swIfIndex)
		if ifc == nil || ifc.tunnel == nil || !ifc.adminUp || ifc.tunnel.tracked || ifc.tunnel.dst.IsUnspecified() {
			continue
		}
		tun := ifc.tunnel
		t := s.tables[tableKey{tun.tableID, tun.dst.Is6()}]
		if t == nil {
			continue
		}
		tun.tracked = true
		t.rrRefs[tun.dst]++
		s.syncRRAfter(t, netip.Prefix{})
	}
}

// pickInstance returns want, or the lowest instance not used when want is ~0 (VPP's "any"); false when
// want is used.
func pickInstance(want uint32, used map[uint32]bool) (uint32, bool) {
	if want != ^uint32(0) {
		return want, !used[want]
	}
	var i uint32
	for used[i] {
		i++
	}
	return i, true
}

// newIfaceSlot returns the interface a new tunnel takes: a freed index if there is one (VPP reuses them),
// preferring one named name (IPIP, measured; "" takes the first freed: VXLAN), else
// a new index. Call with s.mu held.
func (s *Sim) newIfaceSlot(name string) *iface {
	var ifc *iface
	for _, i := range s.ifaces {
		if i.deleted && (ifc == nil || name != "" && i.name == name && ifc.name != name) {
			ifc = i
		}
	}
	if ifc == nil {
		ifc = &iface{index: uint32(len(s.ifaces))}
		s.ifaces = append(s.ifaces, ifc)
	}
	return ifc
}

// hasTEIB reports whether a TEIB entry of tunnel idx holds p (its peer/32): a stale entry keeps it.
func (s *Sim) hasTEIB(idx uint32, p netip.Prefix) bool {
	return slices.ContainsFunc(s.teib, func(e teibEntry) bool {
		return e.swIfIndex == idx && netip.PrefixFrom(e.peer, e.peer.BitLen()) == p
	})
}

func handleIPIPTunnelDump(s *Sim, c *conn, ctx uint32, msg api.Message) {
	m := msg.(*ipip.IpipTunnelDump)
	s.mu.Lock()
	var out []*ipip.IpipTunnelDetails
	for _, ifc := range s.ifaces {
		t := ifc.tunnel
		if t == nil || ifc.deleted || (uint32(m.SwIfIndex) != ^uint32(0) && uint32(m.SwIfIndex) != ifc.index) {
			continue
		}
		out = append(out, &ipip.IpipTunnelDetails{Tunnel: ipip.IpipTunnel{
			Instance:  t.instance,
			Src:       addressToAPI(t.src),
			Dst:       addressToAPI(t.dst),
			SwIfIndex: interface_types.InterfaceIndex(ifc.index),
			TableID:   t.tableID,
			Mode:      t.mode,
		}})
	}
	s.mu.Unlock()
	for _, d := range out {
		c.reply(ctx, d)
	}
}

func handleSwInterfaceSetUnnumbered(s *Sim, c *conn, ctx uint32, msg api.Message) {
	m := msg.(*interfaces.SwInterfaceSetUnnumbered)
	s.mu.Lock()
	rv := rvOK
	owner, borrower := s.ifaceAt(uint32(m.SwIfIndex)), s.ifaceAt(uint32(m.UnnumberedSwIfIndex))
	switch {
	case owner == nil:
		rv = rvInvalidSwIfIndex2
	case borrower == nil:
		rv = rvInvalidSwIfIndex
	case m.IsAdd:
		idx := owner.index
		borrower.unnumbered = &idx
	default:
		borrower.unnumbered = nil
	}
	s.mu.Unlock()
	c.reply(ctx, &interfaces.SwInterfaceSetUnnumberedReply{Retval: rv})
}

// handleIPUnnumberedDump lists the unnumbered interfaces (sw_if_index ~0: all) with the interface each
// borrows from.
func handleIPUnnumberedDump(s *Sim, c *conn, ctx uint32, msg api.Message) {
	m := msg.(*ip.IPUnnumberedDump)
	s.mu.Lock()
	var out []*ip.IPUnnumberedDetails
	for _, ifc := range s.ifaces {
		if ifc.deleted || ifc.unnumbered == nil || (uint32(m.SwIfIndex) != ^uint32(0) && uint32(m.SwIfIndex) != ifc.index) {
			continue
		}
		out = append(out, &ip.IPUnnumberedDetails{SwIfIndex: interface_types.InterfaceIndex(ifc.index),
			IPSwIfIndex: interface_types.InterfaceIndex(*ifc.unnumbered)})
	}
	s.mu.Unlock()
	for _, d := range out {
		c.reply(ctx, d)
	}
}

func handleSwInterfaceSetMtu(s *Sim, c *conn, ctx uint32, msg api.Message) {
	m := msg.(*interfaces.SwInterfaceSetMtu)
	s.mu.Lock()
	rv := rvOK
	if ifc := s.ifaceAt(uint32(m.SwIfIndex)); ifc == nil {
		rv = rvInvalidSwIfIndex
	} else {
		var mtu [4]uint32
		copy(mtu[:], m.Mtu)
		ifc.mtu = &mtu
	}
	s.mu.Unlock()
	c.reply(ctx, &interfaces.SwInterfaceSetMtuReply{Retval: rv})
}

func handleSwInterfaceTagAddDel(s *Sim, c *conn, ctx uint32, msg api.Message) {
	m := msg.(*interfaces.SwInterfaceTagAddDel)
	s.mu.Lock()
	rv := rvOK
	switch ifc := s.ifaceAt(uint32(m.SwIfIndex)); {
	case ifc == nil:
		rv = rvInvalidSwIfIndex
	case !m.IsAdd:
		ifc.tag = ""
	case m.Tag == "":
		rv = rvInvalidValue
	default:
		ifc.tag = m.Tag
	}
	s.mu.Unlock()
	c.reply(ctx, &interfaces.SwInterfaceTagAddDelReply{Retval: rv})
}

func handleTEIBEntryAddDel(s *Sim, c *conn, ctx uint32, msg api.Message) {
	m := msg.(*teib.TeibEntryAddDel)
	s.mu.Lock()
	rv := s.teibAddDel(m)
	s.mu.Unlock()
	c.reply(ctx, &teib.TeibEntryAddDelReply{Retval: rv})
}

// teibAddDel applies teib_entry_add_del. Call with s.mu held.
func (s *Sim) teibAddDel(m *teib.TeibEntryAddDel) int32 {
	idx := uint32(m.Entry.SwIfIndex)
	if s.ifaceAt(idx) == nil {
		return rvInvalidSwIfIndex
	}
	peer := addrFromUnion(m.Entry.Peer.Un, m.Entry.Peer.Af == ip_types.ADDRESS_IP6)
	i := slices.IndexFunc(s.teib, func(e teibEntry) bool { return e.swIfIndex == idx && e.peer == peer })
	host := netip.PrefixFrom(peer, peer.BitLen())
	t := s.tables[tableKey{0, peer.Is6()}]
	if m.IsAdd == 0 {
		if i < 0 {
			return rvNoSuchEntry
		}
		s.teib = slices.Delete(s.teib, i, i+1)
		if e := t.entries[host]; e != nil {
			e.adj = nil
			t.gc(e)
		}
		return rvOK
	}
	if i >= 0 {
		return rvEntryAlreadyExists
	}
	nh := addrFromUnion(m.Entry.Nh.Un, m.Entry.Nh.Af == ip_types.ADDRESS_IP6)
	s.teib = append(s.teib, teibEntry{swIfIndex: idx, peer: peer, nh: nh, nhTable: m.Entry.NhTableID})
	// VPP adds the peer's /32 (/128), attached via the tunnel, from the adjacency source.
	s.getEntry(t, host).adj = []fibPath{{typ: fib_types.FIB_API_PATH_TYPE_NORMAL, proto: protoOf(peer.Is6()), swIfIndex: idx, nh: peer, weight: 1}}
	return rvOK
}

func handleTEIBDump(s *Sim, c *conn, ctx uint32, _ api.Message) {
	s.mu.Lock()
	out := make([]*teib.TeibDetails, len(s.teib))
	for i, e := range s.teib {
		out[i] = &teib.TeibDetails{Entry: teib.TeibEntry{SwIfIndex: interface_types.InterfaceIndex(e.swIfIndex),
			Peer: addressToAPI(e.peer), Nh: addressToAPI(e.nh), NhTableID: e.nhTable}}
	}
	s.mu.Unlock()
	for _, d := range out {
		c.reply(ctx, d)
	}
}

// dropTunnels removes every tunnel and TEIB entry, as a VPP restart does: a tunnel's index is freed
// (the slice keeps indexes dense, so only trailing ones go). Call with s.mu held.
func (s *Sim) dropTunnels() {
	for _, ifc := range s.ifaces {
		if ifc.tunnel != nil {
			*ifc = iface{index: ifc.index, name: ifc.name, deleted: true}
		}
	}
	for n := len(s.ifaces); n > 1 && s.ifaces[n-1].deleted && n > 1+len(s.cfg.Interfaces); n-- {
		s.ifaces = s.ifaces[:n-1]
	}
	s.teib = nil
}
