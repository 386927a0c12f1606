package vppapi

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"

	"go.fd.io/govpp/api"
	"go.fd.io/govpp/binapi/ethernet_types"
	interfaces "go.fd.io/govpp/binapi/interface"
	"go.fd.io/govpp/binapi/interface_types"
	"go.fd.io/govpp/binapi/ip_neighbor"
	"go.fd.io/govpp/binapi/ip_types"
	"go.fd.io/govpp/binapi/vlib"
	"go.fd.io/govpp/binapi/vxlan"

	"github.com/vpp-route-agent/vpp-route-agent/internal/netaddr"
)

// VXLAN in the form that talks to a Linux node whose felix made vxlan.calico (measured on VPP 26.06 with
// the vxlan plugin, and against a kernel VXLAN device configured as felix configures it): an L2 tunnel
// (inner Ethernet, RFC 7348) per remote node, decapsulating to ethernet-input, with our VTEP MAC as its
// interface MAC, a static neighbour remote VTEP IP -> remote VTEP MAC on it, and routes via the remote
// VTEP IP on it. VPP's L3 form (is_l3, what calico-vpp uses) carries no inner Ethernet header, and a
// Linux vxlan.calico drops its packets.

// Calico's VXLAN defaults (FelixConfiguration vxlanPort, vxlanVNI).
const (
	DefaultVXLANPort = 4789
	DefaultVXLANVNI  = 4096
)

// maxVNI is the largest VNI: 24 bits. VPP 26.06 accepts and dumps a larger one (measured: 1<<24), which
// no peer can match on the wire.
const maxVNI = 1<<24 - 1

var (
	// ErrNoVXLANPlugin is wrapped by the errors of the VXLAN tunnel operations when the connected VPP has
	// no (compatible) vxlan plugin: VPP's minimal build has none. The connection itself is fine.
	ErrNoVXLANPlugin = errors.New("VPP has no vxlan plugin")

	// ErrNoNextHop fails, before it is sent, a route added through a VXLAN tunnel without a next hop: VPP
	// 26.06 accepts it (a glean path on the tunnel) and crashes, SIGSEGV in ip4_glean_node_fn, at the
	// first packet it forwards (measured). A route through a VXLAN tunnel names the remote VTEP IP. Apply
	// checks against the VXLAN tunnels the current connection made (EnsureVXLANTunnel) or dumped
	// (DumpVXLANTunnels), less those deleted since (DeleteVXLANTunnel, VPP's interface events): a tunnel
	// another client made meanwhile is not known until the next dump.
	ErrNoNextHop = errors.New("a route through a VXLAN tunnel needs a next hop (the remote VTEP IP)")
)

// vxlanMessages are the vxlan plugin's messages the VXLAN operations use. They are optional: a VPP
// without them is compatible, and Status.VXLAN says whether it has them.
func vxlanMessages() []api.Message {
	return []api.Message{
		(*vxlan.VxlanAddDelTunnelV3)(nil), (*vxlan.VxlanAddDelTunnelV3Reply)(nil),
		(*vxlan.VxlanTunnelV2Dump)(nil), (*vxlan.VxlanTunnelV2Details)(nil),
	}
}

// neighborMessages are the core messages the VXLAN form needs besides the plugin's (the decap arc, the
// tunnel's MAC, static neighbours), all in VPP's core; they are checked on connect with usedMessages.
func neighborMessages() []api.Message {
	return []api.Message{
		(*vlib.AddNodeNext)(nil), (*vlib.AddNodeNextReply)(nil),
		(*interfaces.SwInterfaceSetMacAddress)(nil), (*interfaces.SwInterfaceSetMacAddressReply)(nil),
		(*ip_neighbor.IPNeighborAddDel)(nil), (*ip_neighbor.IPNeighborAddDelReply)(nil),
		(*ip_neighbor.IPNeighborDump)(nil), (*ip_neighbor.IPNeighborDetails)(nil),
	}
}

// AllInterfaces names every interface in DumpNeighbors (VPP's ~0).
const AllInterfaces = noInterface

// MAC is an Ethernet address (calico.MAC converts to it).
type MAC [6]byte

// String formats m as 66:aa:bb:cc:dd:ee.
func (m MAC) String() string { return ethernet_types.MacAddress(m).String() }

// usable reports whether m can be an interface's or a neighbour's address: not zero, not multicast.
func (m MAC) usable() bool { return m != MAC{} && m[0]&1 == 0 }

// VXLANSpec is the VXLAN tunnel EnsureVXLANTunnel makes and configures. VPP keys a tunnel by (Src, Dst,
// Port, TableID, VNI): DeleteVXLANTunnel takes the same.
type VXLANSpec struct {
	// Src is this node's underlay address (an address of Unnumbered), Dst the remote node's: VPP
	// decapsulates only packets from Dst to Src.
	Src, Dst netip.Addr
	// VNI is the VXLAN network identifier, 24 bits (Calico's vxlanVNI, default DefaultVXLANVNI).
	VNI uint32
	// Port is the UDP port, both the one VPP listens on and the remote one (Calico's vxlanPort, the same
	// on every node); 0 means DefaultVXLANPort, as VPP takes 0.
	Port uint16
	// TableID is the outer (underlay) table, which must exist.
	TableID uint32
	// MAC is our VTEP MAC, set as the tunnel interface's: the inner destination MAC a Linux peer sends to.
	MAC MAC
	// Unnumbered is the interface whose addresses the tunnel borrows (the uplink); without an IPv4 (IPv6)
	// address the tunnel drops what it decapsulates.
	Unnumbered uint32
	// MTU, when not 0, is set as the tunnel's L3 and IPv4 MTU; 0 keeps VPP's (9000).
	MTU uint32
	// Tag, when not "", is set as the interface's tag (sw_interface_tag_add_del, at most 63 bytes), read
	// back by DumpVXLANTunnels, so that whoever made the tunnel can tell it from another's.
	Tag string
}

// port returns the UDP port VPP stores for s.Port.
func (s VXLANSpec) port() uint16 {
	if s.Port == 0 {
		return DefaultVXLANPort
	}
	return s.Port
}

// String names the spec for errors: "VXLAN tunnel 192.0.2.1 -> 192.0.2.2 vni 4096 port 4789".
func (s VXLANSpec) String() string {
	out := "VXLAN tunnel " + s.Src.String() + " -> " + s.Dst.String() + " vni " + strconv.FormatUint(uint64(s.VNI), 10) +
		" port " + strconv.FormatUint(uint64(s.port()), 10)
	if s.TableID != 0 {
		out += " table " + strconv.FormatUint(uint64(s.TableID), 10)
	}
	return out
}

// key checks the fields of the tunnel's key and returns its addresses canonical.
func (s VXLANSpec) key() (src, dst netip.Addr, err error) {
	if !s.Src.IsValid() || !s.Dst.IsValid() {
		return src, dst, errors.New("source and destination needed")
	}
	src, dst = netaddr.CanonicalAddr(s.Src), netaddr.CanonicalAddr(s.Dst)
	switch {
	case src.Is4() != dst.Is4():
		return src, dst, errors.New("source and destination of different families")
	case src == dst || dst.IsUnspecified() || dst.IsMulticast():
		return src, dst, errors.New("destination must be another node's unicast address")
	case s.VNI > maxVNI:
		return src, dst, fmt.Errorf("VNI %d does not fit in 24 bits", s.VNI)
	}
	return src, dst, nil
}

// VXLANTunnel is a VXLAN tunnel as VPP has it (vxlan_tunnel_v2_dump, and its interface's MAC and tag).
type VXLANTunnel struct {
	SwIfIndex uint32
	// Instance is the N of its name, vxlan_tunnel<N>.
	Instance uint32
	// Src and Dst are the outer (underlay) addresses.
	Src, Dst netip.Addr
	// SrcPort is the UDP port VPP listens on, DstPort the remote one (4789 when made with 0).
	SrcPort, DstPort uint16
	VNI              uint32
	// TableID is the outer (underlay) table (encap_vrf_id).
	TableID uint32
	// DecapNext is the index of the node VPP hands decapsulated packets to, as a next of vxlan4-input
	// (vxlan6-input): 1 is l2-input (VPP's default), ethernet-input's is what add_node_next returned
	// (2 on a fresh 26.06). The dump does not say whether the tunnel is L3.
	DecapNext uint32
	// MAC is the interface's MAC; Tag its tag ("" when none).
	MAC MAC
	Tag string
	// MTU is the interface's L3 MTU (sw_interface_details.mtu[0]; VPP's default for a tunnel is 9000).
	MTU uint32
}

// Name is VPP's name of the tunnel's interface, vxlan_tunnel<Instance>.
func (t VXLANTunnel) Name() string {
	return "vxlan_tunnel" + strconv.FormatUint(uint64(t.Instance), 10)
}

// String names the tunnel for errors and logs: "vxlan_tunnel0 (sw_if_index 2) 192.0.2.1 -> 192.0.2.2
// vni 4096 port 4789".
func (t VXLANTunnel) String() string {
	s := t.Name() + " (sw_if_index " + strconv.FormatUint(uint64(t.SwIfIndex), 10) + ") " + t.Src.String() + " -> " +
		t.Dst.String() + " vni " + strconv.FormatUint(uint64(t.VNI), 10) + " port " + strconv.FormatUint(uint64(t.SrcPort), 10)
	if t.DstPort != t.SrcPort {
		s += "/" + strconv.FormatUint(uint64(t.DstPort), 10)
	}
	if t.TableID != 0 {
		s += " table " + strconv.FormatUint(uint64(t.TableID), 10)
	}
	return s
}

// Spec returns the spec of the tunnel's key, its MAC and its tag, for DeleteVXLANTunnel or
// EnsureVXLANTunnel of a dumped tunnel (Unnumbered and MTU are the caller's).
func (t VXLANTunnel) Spec() VXLANSpec {
	return VXLANSpec{Src: t.Src, Dst: t.Dst, VNI: t.VNI, Port: t.SrcPort, TableID: t.TableID, MAC: t.MAC, Tag: t.Tag}
}

// matches reports whether t has the key of spec (whose addresses are canonical).
func (t VXLANTunnel) matches(src, dst netip.Addr, spec VXLANSpec) bool {
	return t.Src == src && t.Dst == dst && t.SrcPort == spec.port() && t.TableID == spec.TableID && t.VNI == spec.VNI
}

// HasVXLAN reports whether the connected VPP has the vxlan plugin (Status.VXLAN); false when disconnected.
func (c *Client) HasVXLAN() bool {
	sess, err := c.current()
	return err == nil && sess.vxlan
}

// vxlanSession returns the current session if its VPP has the vxlan plugin.
func (c *Client) vxlanSession() (*session, error) {
	sess, err := c.current()
	if err != nil {
		return nil, err
	}
	if !sess.vxlan {
		return nil, ErrNoVXLANPlugin
	}
	return sess, nil
}

// EnsureVXLANTunnel makes sure VPP has the L2 VXLAN tunnel of spec, decapsulating to ethernet-input, with
// spec.MAC as its MAC, unnumbered to spec.Unnumbered, with spec.MTU if set, tagged spec.Tag if set, and
// admin up, and returns its sw_if_index. It is idempotent: VPP answers a second add of the same key with
// -75 and no index (measured on 26.06), and the tunnel is then found in the dump; the other settings are
// absolute. A tunnel of that key that decapsulates elsewhere (an L3 one, or VPP's default l2-input,
// which drops outside a bridge domain) is not changed: the error names it and comes with its index, for
// the caller to delete and make again.
//
// Routes through the tunnel need a next hop, the remote VTEP IP, with a static neighbour for it
// (EnsureNeighbor): Apply refuses one without (ErrNoNextHop). Without the vxlan plugin it fails with
// ErrNoVXLANPlugin; a spec that cannot make a tunnel fails before anything is sent. When a setting fails
// after the tunnel exists, the error comes with the tunnel's index.
func (c *Client) EnsureVXLANTunnel(ctx context.Context, spec VXLANSpec) (uint32, error) {
	idx, err := c.ensureVXLAN(ctx, spec)
	if err != nil {
		return idx, fmt.Errorf("ensure %v: %w", spec, err)
	}
	return idx, nil
}

func (c *Client) ensureVXLAN(ctx context.Context, spec VXLANSpec) (uint32, error) {
	src, dst, err := spec.key()
	switch {
	case err != nil:
		return 0, err
	case !spec.MAC.usable():
		return 0, fmt.Errorf("VTEP MAC %v is not a unicast address", spec.MAC)
	case len(spec.Tag) > maxTag:
		return 0, fmt.Errorf("tag %q longer than %d bytes", spec.Tag, maxTag)
	}
	sess, err := c.vxlanSession()
	if err != nil {
		return 0, err
	}
	decap, err := c.decapNext(ctx, sess, src.Is6())
	if err != nil {
		return 0, err
	}
	req := &vxlan.VxlanAddDelTunnelV3{
		IsAdd:          true,
		Instance:       noInterface, // VPP picks the name: vxlan_tunnel<N>
		SrcPort:        spec.port(),
		DstPort:        spec.port(),
		McastSwIfIndex: interface_types.InterfaceIndex(noInterface),
		EncapVrfID:     spec.TableID,
		DecapNextIndex: decap,
		Vni:            spec.VNI,
	}
	req.SrcAddress.Af = putAPIAddress(&req.SrcAddress.Un, src)
	req.DstAddress.Af = putAPIAddress(&req.DstAddress.Un, dst)
	reply, err := c.callExpecting(ctx, sess, req, api.TUNNEL_EXIST)
	var idx uint32
	switch r, _ := reply.(*vxlan.VxlanAddDelTunnelV3Reply); {
	case err == nil && r != nil:
		idx = uint32(r.SwIfIndex)
	case errors.Is(err, api.TUNNEL_EXIST):
		// Unlike ipip_add_tunnel's -79, VPP's -75 carries no index (~0): the dump has it.
		t, found, err := c.findVXLAN(ctx, sess, src, dst, spec)
		switch {
		case err != nil:
			return 0, err
		case !found:
			return 0, fmt.Errorf("vxlan_add_del_tunnel_v3: %w, but the dump has no such tunnel", api.TUNNEL_EXIST)
		case t.DecapNext != decap:
			return t.SwIfIndex, fmt.Errorf("%v exists with decap_next %d, not ethernet-input (%d)", t, t.DecapNext, decap)
		}
		idx = t.SwIfIndex
	case err == nil:
		return 0, fmt.Errorf("vxlan_add_del_tunnel_v3: unexpected reply %s", reply.GetMessageName())
	default:
		return 0, fmt.Errorf("vxlan_add_del_tunnel_v3: %w", err)
	}
	sess.noteVXLAN(idx, true)
	if spec.Tag != "" {
		req := &interfaces.SwInterfaceTagAddDel{IsAdd: true, SwIfIndex: interface_types.InterfaceIndex(idx), Tag: spec.Tag}
		if _, err := c.call(ctx, sess, req); err != nil {
			return idx, fmt.Errorf("tag sw_if_index %d %q: %w", idx, spec.Tag, err)
		}
	}
	mac := &interfaces.SwInterfaceSetMacAddress{SwIfIndex: interface_types.InterfaceIndex(idx), MacAddress: ethernet_types.MacAddress(spec.MAC)}
	if _, err := c.call(ctx, sess, mac); err != nil {
		return idx, fmt.Errorf("set sw_if_index %d MAC %v: %w", idx, spec.MAC, err)
	}
	return idx, c.configureTunnel(ctx, sess, idx, spec.Unnumbered, spec.MTU)
}

// decapNext returns the index of ethernet-input as a next of vxlan4-input (vxlan6-input for ipv6),
// adding the arc the first time on a connection (add_node_next is idempotent: measured, the same index
// each time; 2 on a fresh 26.06).
func (c *Client) decapNext(ctx context.Context, sess *session, ipv6 bool) (uint32, error) {
	fam := 0
	node := "vxlan4-input"
	if ipv6 {
		fam, node = 1, "vxlan6-input"
	}
	sess.vxlanMu.Lock()
	next, ok := sess.decap[fam], sess.decapKnown[fam]
	sess.vxlanMu.Unlock()
	if ok {
		return next, nil
	}
	reply, err := c.call(ctx, sess, &vlib.AddNodeNext{NodeName: node, NextName: "ethernet-input"})
	if err != nil {
		return 0, fmt.Errorf("add_node_next %s -> ethernet-input: %w", node, err)
	}
	r, ok := reply.(*vlib.AddNodeNextReply)
	if !ok {
		return 0, fmt.Errorf("add_node_next: unexpected reply %s", reply.GetMessageName())
	}
	sess.vxlanMu.Lock()
	sess.decap[fam], sess.decapKnown[fam] = r.NextIndex, true
	sess.vxlanMu.Unlock()
	return r.NextIndex, nil
}

// findVXLAN returns the tunnel of spec's key from the dump.
func (c *Client) findVXLAN(ctx context.Context, sess *session, src, dst netip.Addr, spec VXLANSpec) (VXLANTunnel, bool, error) {
	tunnels, err := c.dumpVXLAN(ctx, sess, false)
	if err != nil {
		return VXLANTunnel{}, false, err
	}
	i := slices.IndexFunc(tunnels, func(t VXLANTunnel) bool { return t.matches(src, dst, spec) })
	if i < 0 {
		return VXLANTunnel{}, false, nil
	}
	return tunnels[i], true, nil
}

// DumpVXLANTunnels returns every VXLAN tunnel of VPP (vxlan_tunnel_v2_dump of ~0), ours and others', with
// their interfaces' MACs and tags: the caller adopts those it tagged. Without the vxlan plugin it fails
// with ErrNoVXLANPlugin.
func (c *Client) DumpVXLANTunnels(ctx context.Context) ([]VXLANTunnel, error) {
	sess, err := c.vxlanSession()
	if err != nil {
		return nil, fmt.Errorf("dump VXLAN tunnels: %w", err)
	}
	out, err := c.dumpVXLAN(ctx, sess, true)
	if err != nil {
		return nil, fmt.Errorf("dump VXLAN tunnels: %w", err)
	}
	return out, nil
}

// dumpVXLAN dumps the tunnels, with their MACs and tags if withInterfaces, and records their indexes as
// VXLAN tunnels of sess (for Apply's check).
func (c *Client) dumpVXLAN(ctx context.Context, sess *session, withInterfaces bool) ([]VXLANTunnel, error) {
	var out []VXLANTunnel
	req := &vxlan.VxlanTunnelV2Dump{SwIfIndex: interface_types.InterfaceIndex(noInterface)}
	err := c.dump(ctx, sess, req, func(m api.Message) error {
		d, ok := m.(*vxlan.VxlanTunnelV2Details)
		if !ok {
			return fmt.Errorf("unexpected %s in the dump", m.GetMessageName())
		}
		src, err := fromAPIAddress(d.SrcAddress)
		if err != nil {
			return fmt.Errorf("tunnel sw_if_index %d: source: %w", d.SwIfIndex, err)
		}
		dst, err := fromAPIAddress(d.DstAddress)
		if err != nil {
			return fmt.Errorf("tunnel sw_if_index %d: destination: %w", d.SwIfIndex, err)
		}
		out = append(out, VXLANTunnel{SwIfIndex: uint32(d.SwIfIndex), Instance: d.Instance, Src: src, Dst: dst,
			SrcPort: d.SrcPort, DstPort: d.DstPort, VNI: d.Vni, TableID: d.EncapVrfID, DecapNext: d.DecapNextIndex})
		return nil
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b VXLANTunnel) int { return cmp.Compare(a.SwIfIndex, b.SwIfIndex) })
	sess.vxlanMu.Lock()
	clear(sess.vxlanIfaces)
	for _, t := range out {
		sess.vxlanIfaces[t.SwIfIndex] = struct{}{}
	}
	sess.vxlanMu.Unlock()
	if !withInterfaces || len(out) == 0 {
		return out, nil
	}
	// vxlan_tunnel_v2_details has neither MAC, tag nor MTU: sw_interface_details has.
	type ifaceInfo struct {
		mac MAC
		tag string
		mtu uint32
	}
	infos := map[uint32]ifaceInfo{}
	ifreq := &interfaces.SwInterfaceDump{SwIfIndex: interface_types.InterfaceIndex(noInterface)}
	err = c.dump(ctx, sess, ifreq, func(m api.Message) error {
		d, ok := m.(*interfaces.SwInterfaceDetails)
		if !ok {
			return fmt.Errorf("unexpected %s in the dump", m.GetMessageName())
		}
		info := ifaceInfo{mac: MAC(d.L2Address), tag: d.Tag}
		if len(d.Mtu) > 0 {
			info.mtu = d.Mtu[0]
		}
		infos[uint32(d.SwIfIndex)] = info
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("interfaces: %w", err)
	}
	for i := range out {
		info := infos[out[i].SwIfIndex]
		out[i].MAC, out[i].Tag, out[i].MTU = info.mac, info.tag, info.mtu
	}
	return out, nil
}

// DeleteVXLANTunnel deletes the VXLAN tunnel of spec's key (Src, Dst, Port, TableID, VNI; VPP deletes by
// key, not by index). A tunnel VPP does not have (-6, measured) counts as deleted. VPP deletes the
// tunnel's neighbours with it (measured); routes through it are the caller's to delete first: VPP keeps
// them, dropping. Without the vxlan plugin it fails with ErrNoVXLANPlugin.
func (c *Client) DeleteVXLANTunnel(ctx context.Context, spec VXLANSpec) error {
	if err := c.deleteVXLAN(ctx, spec); err != nil {
		return fmt.Errorf("delete %v: %w", spec, err)
	}
	return nil
}

func (c *Client) deleteVXLAN(ctx context.Context, spec VXLANSpec) error {
	src, dst, err := spec.key()
	if err != nil {
		return err
	}
	sess, err := c.vxlanSession()
	if err != nil {
		return err
	}
	req := &vxlan.VxlanAddDelTunnelV3{
		IsAdd:          false,
		Instance:       noInterface,
		SrcPort:        spec.port(),
		DstPort:        spec.port(),
		McastSwIfIndex: interface_types.InterfaceIndex(noInterface),
		EncapVrfID:     spec.TableID,
		Vni:            spec.VNI,
	}
	req.SrcAddress.Af = putAPIAddress(&req.SrcAddress.Un, src)
	req.DstAddress.Af = putAPIAddress(&req.DstAddress.Un, dst)
	reply, err := c.callExpecting(ctx, sess, req, api.NO_SUCH_ENTRY)
	if err != nil && !errors.Is(err, api.NO_SUCH_ENTRY) {
		return fmt.Errorf("vxlan_add_del_tunnel_v3: %w", err)
	}
	if r, ok := reply.(*vxlan.VxlanAddDelTunnelV3Reply); ok && err == nil {
		sess.noteVXLAN(uint32(r.SwIfIndex), false)
	}
	return nil
}

// noteVXLAN records that interface idx is (or, with add false, no longer is) a VXLAN tunnel.
func (sess *session) noteVXLAN(idx uint32, add bool) {
	sess.vxlanMu.Lock()
	defer sess.vxlanMu.Unlock()
	if add {
		sess.vxlanIfaces[idx] = struct{}{}
	} else {
		delete(sess.vxlanIfaces, idx)
	}
}

// isVXLAN reports whether interface idx is a VXLAN tunnel this connection made or dumped.
func (sess *session) isVXLAN(idx uint32) bool {
	sess.vxlanMu.Lock()
	defer sess.vxlanMu.Unlock()
	_, ok := sess.vxlanIfaces[idx]
	return ok
}

// Neighbor is an IP neighbour (ARP/ND entry) of an interface (ip_neighbor_dump).
type Neighbor struct {
	SwIfIndex uint32
	IP        netip.Addr
	MAC       MAC
	// Static is set for an entry added as static (EnsureNeighbor's), not learned.
	Static bool
}

// String formats n as "10.244.2.0 -> 66:aa:bb:cc:dd:ee sw_if_index 2 static".
func (n Neighbor) String() string {
	s := n.IP.String() + " -> " + n.MAC.String() + " sw_if_index " + strconv.FormatUint(uint64(n.SwIfIndex), 10)
	if n.Static {
		s += " static"
	}
	return s
}

// EnsureNeighbor makes ip a static neighbour with MAC mac on interface swIfIndex (ip_neighbor_add_del,
// STATIC): the remote VTEP IP -> remote VTEP MAC on a VXLAN tunnel, which VPP cannot learn there. It is
// idempotent: VPP answers 0 to adding it again and replaces the MAC of an existing entry (measured on
// 26.06). VPP adds the neighbour's /32 (/128) to the interface's table (the adjacency source).
func (c *Client) EnsureNeighbor(ctx context.Context, swIfIndex uint32, ip netip.Addr, mac MAC) error {
	if err := c.neighbor(ctx, true, swIfIndex, ip, mac); err != nil {
		return fmt.Errorf("ensure neighbour %v -> %v on sw_if_index %d: %w", ip, mac, swIfIndex, err)
	}
	return nil
}

// DeleteNeighbor deletes neighbour ip of interface swIfIndex. One VPP does not have (-6) counts as
// deleted; an unknown interface fails with -2.
func (c *Client) DeleteNeighbor(ctx context.Context, swIfIndex uint32, ip netip.Addr) error {
	if err := c.neighbor(ctx, false, swIfIndex, ip, MAC{}); err != nil {
		return fmt.Errorf("delete neighbour %v on sw_if_index %d: %w", ip, swIfIndex, err)
	}
	return nil
}

func (c *Client) neighbor(ctx context.Context, add bool, swIfIndex uint32, ip netip.Addr, mac MAC) error {
	switch {
	case !ip.IsValid():
		return errors.New("no address")
	case add && !mac.usable():
		return fmt.Errorf("MAC %v is not a unicast address", mac)
	}
	sess, err := c.current()
	if err != nil {
		return err
	}
	req := &ip_neighbor.IPNeighborAddDel{IsAdd: add, Neighbor: ip_neighbor.IPNeighbor{
		SwIfIndex:  interface_types.InterfaceIndex(swIfIndex),
		Flags:      ip_neighbor.IP_API_NEIGHBOR_FLAG_STATIC,
		MacAddress: ethernet_types.MacAddress(mac),
	}}
	req.Neighbor.IPAddress.Af = putAPIAddress(&req.Neighbor.IPAddress.Un, netaddr.CanonicalAddr(ip))
	var tolerated []api.VPPApiError
	if !add {
		tolerated = []api.VPPApiError{api.NO_SUCH_ENTRY}
	}
	_, err = c.callExpecting(ctx, sess, req, tolerated...)
	if err != nil && !(errors.Is(err, api.NO_SUCH_ENTRY) && !add) {
		return err
	}
	return nil
}

// DumpNeighbors returns the IPv4 and then the IPv6 neighbours of interface swIfIndex (^uint32(0): of
// every interface), each family sorted by interface and address (VPP lists them in hash order).
func (c *Client) DumpNeighbors(ctx context.Context, swIfIndex uint32) ([]Neighbor, error) {
	sess, err := c.current()
	if err != nil {
		return nil, fmt.Errorf("dump neighbours: %w", err)
	}
	var out []Neighbor
	for _, af := range []ip_types.AddressFamily{ip_types.ADDRESS_IP4, ip_types.ADDRESS_IP6} {
		var fam []Neighbor
		req := &ip_neighbor.IPNeighborDump{SwIfIndex: interface_types.InterfaceIndex(swIfIndex), Af: af}
		err := c.dump(ctx, sess, req, func(m api.Message) error {
			d, ok := m.(*ip_neighbor.IPNeighborDetails)
			if !ok {
				return fmt.Errorf("unexpected %s in the dump", m.GetMessageName())
			}
			ip, err := fromAPIAddress(d.Neighbor.IPAddress)
			if err != nil {
				return fmt.Errorf("neighbour on sw_if_index %d: %w", d.Neighbor.SwIfIndex, err)
			}
			fam = append(fam, Neighbor{SwIfIndex: uint32(d.Neighbor.SwIfIndex), IP: ip, MAC: MAC(d.Neighbor.MacAddress),
				Static: d.Neighbor.Flags&ip_neighbor.IP_API_NEIGHBOR_FLAG_STATIC != 0})
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("dump neighbours: %w", err)
		}
		slices.SortFunc(fam, func(a, b Neighbor) int {
			return cmp.Or(cmp.Compare(a.SwIfIndex, b.SwIfIndex), a.IP.Compare(b.IP))
		})
		out = append(out, fam...)
	}
	return out, nil
}
