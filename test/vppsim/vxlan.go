package vppsim

import (
	"crypto/rand"
	"fmt"
	"maps"
	"net/netip"
	"slices"

	"go.fd.io/govpp/api"
	"go.fd.io/govpp/binapi/ethernet_types"
	"go.fd.io/govpp/binapi/fib_types"
	interfaces "go.fd.io/govpp/binapi/interface"
	"go.fd.io/govpp/binapi/interface_types"
	"go.fd.io/govpp/binapi/ip_neighbor"
	"go.fd.io/govpp/binapi/ip_types"
	"go.fd.io/govpp/binapi/vlib"
	"go.fd.io/govpp/binapi/vxlan"
)

// This file simulates VPP 26.06's vxlan plugin, the decap arcs of add_node_next, interface MACs and
// static IP neighbours, as measured through GoVPP on a real 26.06 lab build (vppapi's TestVXLAN* run the
// same assertions on both):
//
//   - Without the plugin (Config.NoVXLAN, VPP's minimal build) the vxlan messages are not in the message
//     table, and add_node_next knows no vxlan4-input or vxlan6-input (-63).
//   - add_node_next: an unknown node -63, an unknown next -64; vxlan4-input and vxlan6-input start with
//     the nexts error-drop (0) and l2-input (1); a new next takes the next index (ethernet-input: 2), and
//     adding it again returns the same index.
//   - vxlan_add_del_tunnel_v3 add: src and dst of different families -7, src = dst -82, an unknown
//     encap_vrf_id -3, decap_next_index not a next of vxlan4(6)-input -76, an instance in use -147, a
//     multicast dst without a valid mcast_sw_if_index -2, the same (src, dst, src_port, encap_vrf_id,
//     vni) again -75 with sw_if_index ~0 (decap_next_index is not part of the key). Ports 0 are 4789. A
//     VNI over 24 bits and dst 0.0.0.0 are accepted. The tunnel is "vxlan_tunnel<N>" (N the lowest free
//     instance unless given), on a freed index if any, admin and link up, with a random MAC 02:fe:..,
//     MTU 9000/0/0/0, link MTU 9000, dev type "VXLAN". VPP resolves dst in the encap table at once: a
//     recursive-resolution /32 (/128) until the tunnel is deleted.
//   - vxlan_add_del_tunnel_v3 delete (by the same key): -6 with sw_if_index ~0 when there is no such
//     tunnel, else the deleted tunnel's index. The tunnel's neighbours go with it; API routes through it
//     stay, dead, as for any deleted interface.
//   - vxlan_tunnel_v2_dump lists the tunnels (sw_if_index ~0: all) with ports, vni, encap_vrf_id and
//     decap_next_index; is_l3 is not dumped.
//   - sw_interface_set_mac_address: an unknown index -2; local0 and IPIP tunnels -9; otherwise the MAC is
//     set, any value (zero, multicast) accepted, and dumped in sw_interface_details.l2_address.
//   - ip_neighbor_add_del: an unknown interface -2. Adding an entry that exists replaces its MAC (0),
//     except that a dynamic add over a static entry is -2 (0, changing nothing, with the same MAC); the family need not match the interface's
//     addresses; a zero MAC is accepted. Deleting an unknown entry -6. An entry adds its /32 (/128) via
//     itself on its interface to table 0 (the adjacency source); deleting it removes that.
//   - ip_neighbor_dump lists the entries of one interface (~0: all) of one family, with the STATIC flag.
//
// Not modelled: a route via a VXLAN tunnel without a next hop is accepted (as VPP does) but VPP 26.06
// crashes forwarding through it; vppapi refuses to send one.

// Return values of the vxlan and neighbour messages (VPP's vnet/api_errno.h).
const (
	rvUnimplemented    int32 = -9
	rvNoSuchNode       int32 = -63
	rvNoSuchNode2      int32 = -64
	rvTunnelExist      int32 = -75
	rvInvalidDecapNext int32 = -76
)

// vxlanLinkMTU is the link MTU VPP reports for a VXLAN tunnel (measured).
const vxlanLinkMTU = 9000

// vxlanPort is what VPP stores for a port given as 0.
const vxlanPort = 4789

// vxlanInputNexts are the nexts vxlan4-input and vxlan6-input start with (vxlan.h
// foreach_vxlan_input_next).
var vxlanInputNexts = []string{"error-drop", "l2-input"}

// graphNodes are the nodes add_node_next may name as a next: those a decap arc leads to.
var graphNodes = []string{"error-drop", "l2-input", "ethernet-input", "ip4-input", "ip6-input", "ip4-lookup", "ip6-lookup"}

func init() {
	// Registered here, not in handlers.go's table, so that the vxlan model stays in this file.
	maps.Copy(handlers, map[string]handlerFunc{
		"vxlan_add_del_tunnel_v3":      handleVXLANAddDelTunnelV3,
		"vxlan_tunnel_v2_dump":         handleVXLANTunnelV2Dump,
		"add_node_next":                handleAddNodeNext,
		"sw_interface_set_mac_address": handleSwInterfaceSetMacAddress,
		"ip_neighbor_add_del":          handleIPNeighborAddDel,
		"ip_neighbor_dump":             handleIPNeighborDump,
	})
}

// vxlanTunnel is one simulated VXLAN tunnel; its interface is ifaces[swIfIndex].
type vxlanTunnel struct {
	instance         uint32
	src, dst         netip.Addr
	srcPort, dstPort uint16
	vrf, vni         uint32
	decapNext        uint32
}

// neighbor is one IP neighbour added over the API.
type neighbor struct {
	swIfIndex uint32
	ip        netip.Addr
	mac       [6]byte
	static    bool
}

// VXLANTunnel is a snapshot of one simulated VXLAN tunnel.
type VXLANTunnel struct {
	SwIfIndex uint32     `json:"sw_if_index"`
	Name      string     `json:"name"`
	Src       netip.Addr `json:"src"`
	Dst       netip.Addr `json:"dst"`
	SrcPort   uint16     `json:"src_port"`
	DstPort   uint16     `json:"dst_port"`
	VNI       uint32     `json:"vni"`
	VrfID     uint32     `json:"encap_vrf_id"`
	DecapNext uint32     `json:"decap_next_index"`
	MAC       [6]byte    `json:"mac"`
	// Unnumbered is the sw_if_index whose addresses the tunnel borrows, ^uint32(0) if none.
	Unnumbered uint32 `json:"unnumbered"`
	// MTU is L3, IPv4, IPv6, MPLS as set (VPP's default 9000/0/0/0).
	MTU     [4]uint32 `json:"mtu"`
	AdminUp bool      `json:"admin_up"`
	Tag     string    `json:"tag,omitempty"`
}

// VXLANTunnels returns a snapshot of the VXLAN tunnels, by sw_if_index.
func (s *Sim) VXLANTunnels() []VXLANTunnel {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []VXLANTunnel
	for _, ifc := range s.ifaces {
		t := ifc.vxlan
		if t == nil || ifc.deleted {
			continue
		}
		out = append(out, VXLANTunnel{SwIfIndex: ifc.index, Name: ifc.name, Src: t.src, Dst: t.dst, SrcPort: t.srcPort,
			DstPort: t.dstPort, VNI: t.vni, VrfID: t.vrf, DecapNext: t.decapNext, MAC: ifc.mac,
			Unnumbered: ifc.unnumberedOf(), MTU: ifc.mtus(), AdminUp: ifc.adminUp, Tag: ifc.tag})
	}
	return out
}

// Neighbor is a snapshot of one IP neighbour added over the API.
type Neighbor struct {
	SwIfIndex uint32     `json:"sw_if_index"`
	IP        netip.Addr `json:"ip"`
	MAC       [6]byte    `json:"mac"`
	Static    bool       `json:"static"`
}

// Neighbors returns a snapshot of the IP neighbours added over the API, in the order added.
func (s *Sim) Neighbors() []Neighbor {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Neighbor, len(s.neighbors))
	for i, n := range s.neighbors {
		out[i] = Neighbor{SwIfIndex: n.swIfIndex, IP: n.ip, MAC: n.mac, Static: n.static}
	}
	return out
}

// vxlanDetails fills in what sw_interface_details says of a VXLAN tunnel (measured).
func vxlanDetails(d *interfaces.SwInterfaceDetails) {
	d.InterfaceDevType = "VXLAN"
	d.LinkDuplex = interface_types.LINK_DUPLEX_API_UNKNOWN
	d.LinkSpeed = 0
	d.LinkMtu = vxlanLinkMTU
}

// nodeNexts returns the nexts of graph node name, nil if VPP has no such node (vxlan4-input and
// vxlan6-input exist only with the plugin). Call with s.mu held.
func (s *Sim) nodeNexts(name string) []string {
	if n, ok := s.nexts[name]; ok {
		return n
	}
	switch {
	case (name == "vxlan4-input" || name == "vxlan6-input") && !s.cfg.NoVXLAN:
		return vxlanInputNexts
	case slices.Contains(graphNodes, name):
		return []string{"error-drop"}
	}
	return nil
}

func handleAddNodeNext(s *Sim, c *conn, ctx uint32, msg api.Message) {
	m := msg.(*vlib.AddNodeNext)
	s.mu.Lock()
	reply := &vlib.AddNodeNextReply{NextIndex: ^uint32(0)}
	nexts := s.nodeNexts(m.NodeName)
	switch i := slices.Index(nexts, m.NextName); {
	case nexts == nil:
		reply.Retval = rvNoSuchNode
	case !slices.Contains(graphNodes, m.NextName):
		reply.Retval = rvNoSuchNode2
	case i >= 0:
		reply.NextIndex = uint32(i)
	default:
		if s.nexts == nil {
			s.nexts = map[string][]string{}
		}
		s.nexts[m.NodeName] = append(slices.Clone(nexts), m.NextName)
		reply.NextIndex = uint32(len(nexts))
	}
	s.mu.Unlock()
	c.reply(ctx, reply)
}

func handleVXLANAddDelTunnelV3(s *Sim, c *conn, ctx uint32, msg api.Message) {
	m := msg.(*vxlan.VxlanAddDelTunnelV3)
	s.mu.Lock()
	var idx uint32
	var rv int32
	var ev interfaces.SwInterfaceEvent
	if m.IsAdd {
		idx, rv = s.addVXLAN(m)
		if rv == rvOK {
			ev = ifaceEvent(s.ifaces[idx])
		}
	} else {
		idx, rv = s.delVXLAN(m)
		ev = interfaces.SwInterfaceEvent{SwIfIndex: interface_types.InterfaceIndex(idx), Deleted: true}
	}
	var targets []eventTarget
	if rv == rvOK {
		targets = s.eventTargets()
	}
	s.mu.Unlock()
	c.reply(ctx, &vxlan.VxlanAddDelTunnelV3Reply{Retval: rv, SwIfIndex: interface_types.InterfaceIndex(idx)})
	s.sendEvents(targets, ev)
}

// vxlanKey returns the key VPP looks a tunnel up by, from a request.
func vxlanKey(m *vxlan.VxlanAddDelTunnelV3) vxlanTunnel {
	t := vxlanTunnel{
		src:     addrFromUnion(m.SrcAddress.Un, m.SrcAddress.Af == ip_types.ADDRESS_IP6),
		dst:     addrFromUnion(m.DstAddress.Un, m.DstAddress.Af == ip_types.ADDRESS_IP6),
		srcPort: m.SrcPort, dstPort: m.DstPort, vrf: m.EncapVrfID, vni: m.Vni, decapNext: m.DecapNextIndex,
	}
	if t.srcPort == 0 {
		t.srcPort = vxlanPort
	}
	if t.dstPort == 0 {
		t.dstPort = vxlanPort
	}
	return t
}

// findVXLAN returns the interface of the tunnel with k's key, nil if none. Call with s.mu held.
func (s *Sim) findVXLAN(k vxlanTunnel) *iface {
	for _, ifc := range s.ifaces {
		if t := ifc.vxlan; t != nil && !ifc.deleted && t.src == k.src && t.dst == k.dst && t.srcPort == k.srcPort &&
			t.vrf == k.vrf && t.vni == k.vni {
			return ifc
		}
	}
	return nil
}

// addVXLAN applies vxlan_add_del_tunnel_v3's add; it returns the new tunnel's index, else ^uint32(0).
// Call with s.mu held.
func (s *Sim) addVXLAN(m *vxlan.VxlanAddDelTunnelV3) (uint32, int32) {
	const none = ^uint32(0)
	k := vxlanKey(m)
	node := "vxlan4-input"
	if k.src.Is6() {
		node = "vxlan6-input"
	}
	switch {
	case k.src.Is4() != k.dst.Is4():
		return none, rvInvalidValue
	case k.src == k.dst:
		return none, rvSameSrcDst
	case s.tables[tableKey{k.vrf, k.src.Is6()}] == nil:
		return none, rvNoSuchFIB
	case int64(k.decapNext) >= int64(len(s.nodeNexts(node))):
		return none, rvInvalidDecapNext
	case k.dst.IsMulticast() && s.ifaceAt(uint32(m.McastSwIfIndex)) == nil:
		return none, rvInvalidSwIfIndex
	case s.findVXLAN(k) != nil:
		return none, rvTunnelExist
	}
	used := map[uint32]bool{}
	for _, ifc := range s.ifaces {
		if ifc.vxlan != nil && !ifc.deleted {
			used[ifc.vxlan.instance] = true
		}
	}
	var ok bool
	if k.instance, ok = pickInstance(m.Instance, used); !ok {
		return none, rvInstanceInUse
	}
	ifc := s.newIfaceSlot("")
	var mac [6]byte
	_, _ = rand.Read(mac[2:])
	mac[0], mac[1] = 0x02, 0xfe
	tun := k
	*ifc = iface{index: ifc.index, name: fmt.Sprintf("vxlan_tunnel%d", k.instance), carrier: true, adminUp: true, mac: mac, vxlan: &tun}
	// VPP tracks the destination in the encap table from the start (measured).
	if t := s.tables[tableKey{k.vrf, k.dst.Is6()}]; t != nil && !k.dst.IsMulticast() {
		t.rrRefs[k.dst]++
		s.syncRRAfter(t, netip.Prefix{})
	}
	return ifc.index, rvOK
}

// delVXLAN applies vxlan_add_del_tunnel_v3's delete; it returns the deleted tunnel's index, else
// ^uint32(0) with -6. Call with s.mu held.
func (s *Sim) delVXLAN(m *vxlan.VxlanAddDelTunnelV3) (uint32, int32) {
	ifc := s.findVXLAN(vxlanKey(m))
	if ifc == nil {
		return ^uint32(0), rvNoSuchEntry
	}
	s.dropNeighbors(ifc.index)
	tun := ifc.vxlan
	if t := s.tables[tableKey{tun.vrf, tun.dst.Is6()}]; t != nil && !tun.dst.IsMulticast() {
		if t.rrRefs[tun.dst]--; t.rrRefs[tun.dst] <= 0 {
			delete(t.rrRefs, tun.dst)
		}
	}
	s.removeInterface(ifc)
	ifc.vxlan = nil
	return ifc.index, rvOK
}

func handleVXLANTunnelV2Dump(s *Sim, c *conn, ctx uint32, msg api.Message) {
	m := msg.(*vxlan.VxlanTunnelV2Dump)
	s.mu.Lock()
	var out []*vxlan.VxlanTunnelV2Details
	for _, ifc := range s.ifaces {
		t := ifc.vxlan
		if t == nil || ifc.deleted || (uint32(m.SwIfIndex) != ^uint32(0) && uint32(m.SwIfIndex) != ifc.index) {
			continue
		}
		out = append(out, &vxlan.VxlanTunnelV2Details{
			SwIfIndex:      interface_types.InterfaceIndex(ifc.index),
			Instance:       t.instance,
			SrcAddress:     addressToAPI(t.src),
			DstAddress:     addressToAPI(t.dst),
			SrcPort:        t.srcPort,
			DstPort:        t.dstPort,
			McastSwIfIndex: ^interface_types.InterfaceIndex(0),
			EncapVrfID:     t.vrf,
			DecapNextIndex: t.decapNext,
			Vni:            t.vni,
		})
	}
	s.mu.Unlock()
	for _, d := range out {
		c.reply(ctx, d)
	}
}

func handleSwInterfaceSetMacAddress(s *Sim, c *conn, ctx uint32, msg api.Message) {
	m := msg.(*interfaces.SwInterfaceSetMacAddress)
	s.mu.Lock()
	rv := rvOK
	switch ifc := s.ifaceAt(uint32(m.SwIfIndex)); {
	case ifc == nil:
		rv = rvInvalidSwIfIndex
	case ifc.index == 0 || ifc.tunnel != nil:
		rv = rvUnimplemented // no Ethernet address to set
	default:
		ifc.mac = m.MacAddress
	}
	s.mu.Unlock()
	c.reply(ctx, &interfaces.SwInterfaceSetMacAddressReply{Retval: rv})
}

func handleIPNeighborAddDel(s *Sim, c *conn, ctx uint32, msg api.Message) {
	m := msg.(*ip_neighbor.IPNeighborAddDel)
	s.mu.Lock()
	rv := s.neighborAddDel(m)
	s.mu.Unlock()
	c.reply(ctx, &ip_neighbor.IPNeighborAddDelReply{Retval: rv, StatsIndex: ^uint32(0)})
}

// neighborAddDel applies ip_neighbor_add_del. Call with s.mu held.
func (s *Sim) neighborAddDel(m *ip_neighbor.IPNeighborAddDel) int32 {
	idx := uint32(m.Neighbor.SwIfIndex)
	if s.ifaceAt(idx) == nil {
		return rvInvalidSwIfIndex
	}
	ip := addrFromUnion(m.Neighbor.IPAddress.Un, m.Neighbor.IPAddress.Af == ip_types.ADDRESS_IP6)
	static := m.Neighbor.Flags&ip_neighbor.IP_API_NEIGHBOR_FLAG_STATIC != 0
	i := slices.IndexFunc(s.neighbors, func(n neighbor) bool { return n.swIfIndex == idx && n.ip == ip })
	t := s.tables[tableKey{0, ip.Is6()}]
	host := netip.PrefixFrom(ip, ip.BitLen())
	if !m.IsAdd {
		if i < 0 {
			return rvNoSuchEntry
		}
		s.neighbors = slices.Delete(s.neighbors, i, i+1)
		if e := t.entries[host]; e != nil {
			e.adj = nil
			t.gc(e)
		}
		return rvOK
	}
	n := neighbor{swIfIndex: idx, ip: ip, mac: m.Neighbor.MacAddress, static: static}
	switch {
	case i < 0:
		s.neighbors = append(s.neighbors, n)
	case s.neighbors[i].static && !static && s.neighbors[i].mac == n.mac:
		return rvOK // VPP leaves the static entry as it is
	case s.neighbors[i].static && !static:
		return rvInvalidSwIfIndex // a dynamic entry cannot replace a static one (measured: -2)
	default:
		s.neighbors[i] = n
	}
	s.getEntry(t, host).adj = []fibPath{{typ: fib_types.FIB_API_PATH_TYPE_NORMAL, proto: protoOf(ip.Is6()), swIfIndex: idx, nh: ip, weight: 1}}
	return rvOK
}

// dropNeighbors removes the neighbours of interface idx and their /32s. Call with s.mu held.
func (s *Sim) dropNeighbors(idx uint32) {
	s.neighbors = slices.DeleteFunc(s.neighbors, func(n neighbor) bool {
		if n.swIfIndex != idx {
			return false
		}
		t := s.tables[tableKey{0, n.ip.Is6()}]
		if e := t.entries[netip.PrefixFrom(n.ip, n.ip.BitLen())]; e != nil {
			e.adj = nil
			t.gc(e)
		}
		return true
	})
}

func handleIPNeighborDump(s *Sim, c *conn, ctx uint32, msg api.Message) {
	m := msg.(*ip_neighbor.IPNeighborDump)
	s.mu.Lock()
	var out []*ip_neighbor.IPNeighborDetails
	for _, n := range s.neighbors {
		if (uint32(m.SwIfIndex) != ^uint32(0) && uint32(m.SwIfIndex) != n.swIfIndex) || n.ip.Is6() != (m.Af == ip_types.ADDRESS_IP6) {
			continue
		}
		d := &ip_neighbor.IPNeighborDetails{Neighbor: ip_neighbor.IPNeighbor{SwIfIndex: interface_types.InterfaceIndex(n.swIfIndex),
			MacAddress: ethernet_types.MacAddress(n.mac), IPAddress: addressToAPI(n.ip)}}
		if n.static {
			d.Neighbor.Flags = ip_neighbor.IP_API_NEIGHBOR_FLAG_STATIC
		}
		out = append(out, d)
	}
	s.mu.Unlock()
	for _, d := range out {
		c.reply(ctx, d)
	}
}

// dropVXLAN removes every VXLAN tunnel, neighbour and added decap arc, as a VPP restart does (see
// dropTunnels, which frees the indexes). Call with s.mu held, after reset.
func (s *Sim) dropVXLAN() {
	for _, ifc := range s.ifaces {
		if ifc.vxlan != nil {
			*ifc = iface{index: ifc.index, name: ifc.name, deleted: true}
		}
	}
	s.neighbors, s.nexts = nil, nil
}
