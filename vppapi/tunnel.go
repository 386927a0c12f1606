package vppapi

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strconv"

	"go.fd.io/govpp/api"
	interfaces "go.fd.io/govpp/binapi/interface"
	"go.fd.io/govpp/binapi/interface_types"
	"go.fd.io/govpp/binapi/ipip"
	"go.fd.io/govpp/binapi/tunnel_types"

	"github.com/vpp-route-agent/vpp-route-agent/internal/netaddr"
)

// TunnelMode is an IPIP tunnel's mode, as VPP numbers it (tunnel_types.api).
type TunnelMode uint8

// Tunnel modes.
const (
	// TunnelP2P is a point-to-point tunnel to one destination: routes through it need no next hop.
	TunnelP2P TunnelMode = 0
	// TunnelMP is a point-to-multipoint tunnel (destination 0.0.0.0): routes through it name a TEIB
	// peer as their next hop, and each peer needs a TEIB entry.
	TunnelMP TunnelMode = 1
)

// String returns "p2p", "p2mp" or the number.
func (m TunnelMode) String() string {
	switch m {
	case TunnelP2P:
		return "p2p"
	case TunnelMP:
		return "p2mp"
	}
	return "TunnelMode(" + strconv.Itoa(int(m)) + ")"
}

// IPIPTunnel is an IPIP tunnel as VPP has it (ipip_tunnel_dump).
type IPIPTunnel struct {
	// SwIfIndex is the tunnel interface's index.
	SwIfIndex uint32
	// Instance is the N of its name, ipip<N>.
	Instance uint32
	// Src and Dst are the outer (underlay) addresses; Dst is 0.0.0.0 for TunnelMP.
	Src, Dst netip.Addr
	// TableID is the outer (underlay) table.
	TableID uint32
	Mode    TunnelMode
	// Tag is the interface's tag (sw_interface_details.tag; "" when none): who made the tunnel, for
	// those that mark theirs (IPIPSpec.Tag).
	Tag string
	// MTU is the interface's L3 MTU (sw_interface_details.mtu[0]; VPP's default for a tunnel is 9000).
	MTU uint32
}

// Name is VPP's name of the tunnel's interface, ipip<Instance>.
func (t IPIPTunnel) Name() string { return "ipip" + strconv.FormatUint(uint64(t.Instance), 10) }

// String names the tunnel for errors and logs: "ipip0 (sw_if_index 2) 192.0.2.1 -> 192.0.2.2".
func (t IPIPTunnel) String() string {
	s := "ipip" + strconv.FormatUint(uint64(t.Instance), 10) + " (sw_if_index " +
		strconv.FormatUint(uint64(t.SwIfIndex), 10) + ") " + t.Src.String() + " -> " + t.Dst.String()
	if t.Mode != TunnelP2P {
		s += " " + t.Mode.String()
	}
	if t.TableID != 0 {
		s += " table " + strconv.FormatUint(uint64(t.TableID), 10)
	}
	return s
}

// IPIPSpec is the IPIP tunnel EnsureIPIPTunnel makes and configures.
type IPIPSpec struct {
	// Src is this node's underlay address (an address of Unnumbered); Dst the peer's. VPP accepts only
	// packets whose outer source is Dst and outer destination Src.
	Src, Dst netip.Addr
	// TableID is the outer (underlay) table, which must exist.
	TableID uint32
	// Unnumbered is the interface whose addresses the tunnel borrows (the uplink). Without it VPP
	// decapsulates the peer's packets and drops them at ip4-not-enabled.
	Unnumbered uint32
	// MTU, when not 0, is set as the tunnel's L3 and IPv4 MTU; 0 keeps VPP's (9000).
	MTU uint32
	// Tag, when not "", is set as the interface's tag (sw_interface_tag_add_del, at most 63 bytes): VPP
	// keeps it until the interface is deleted and shows it in sw_interface_dump, so that whoever made the
	// tunnel can tell it from another's after a restart (IPIPTunnel.Tag).
	Tag string
}

// String names the spec for errors: "IPIP tunnel 192.0.2.1 -> 192.0.2.2".
func (s IPIPSpec) String() string {
	out := "IPIP tunnel " + s.Src.String() + " -> " + s.Dst.String()
	if s.TableID != 0 {
		out += " table " + strconv.FormatUint(uint64(s.TableID), 10)
	}
	return out
}

// EnsureIPIPTunnel makes sure VPP has the point-to-point IPIP tunnel of spec, unnumbered to
// spec.Unnumbered, with spec.MTU if set, and admin up, and returns its sw_if_index. It is idempotent: VPP
// answers a second ipip_add_tunnel of the same (src, dst, table) with -79 and the existing tunnel's
// index, which counts as success, and the other settings are absolute. Routes through the tunnel need
// no next hop: Route{Prefix, SwIfIndex: tunnel}.
//
// A spec that cannot make a tunnel (an address missing, src = dst, mixed families, dst 0.0.0.0) fails
// before anything is sent. When a setting fails after the tunnel exists, the error comes with the
// tunnel's index, so that the caller can delete it or ensure it again.
func (c *Client) EnsureIPIPTunnel(ctx context.Context, spec IPIPSpec) (uint32, error) {
	idx, err := c.ensureIPIP(ctx, spec)
	if err != nil {
		return idx, fmt.Errorf("ensure %v: %w", spec, err)
	}
	return idx, nil
}

func (c *Client) ensureIPIP(ctx context.Context, spec IPIPSpec) (uint32, error) {
	if !spec.Src.IsValid() || !spec.Dst.IsValid() {
		return 0, errors.New("source and destination needed")
	}
	src, dst := netaddr.CanonicalAddr(spec.Src), netaddr.CanonicalAddr(spec.Dst)
	if src.Is4() != dst.Is4() {
		return 0, errors.New("source and destination of different families")
	}
	if src == dst || dst.IsUnspecified() {
		return 0, errors.New("destination must be another node's address")
	}
	sess, err := c.current()
	if err != nil {
		return 0, err
	}
	if len(spec.Tag) > maxTag {
		return 0, fmt.Errorf("tag %q longer than %d bytes", spec.Tag, maxTag)
	}
	idx, err := c.addIPIP(ctx, sess, src, dst, spec.TableID, TunnelP2P)
	if err != nil {
		return 0, err
	}
	if spec.Tag != "" {
		req := &interfaces.SwInterfaceTagAddDel{IsAdd: true, SwIfIndex: interface_types.InterfaceIndex(idx), Tag: spec.Tag}
		if _, err := c.call(ctx, sess, req); err != nil {
			return idx, fmt.Errorf("tag sw_if_index %d %q: %w", idx, spec.Tag, err)
		}
	}
	return idx, c.configureTunnel(ctx, sess, idx, spec.Unnumbered, spec.MTU)
}

// maxTag is the longest interface tag VPP keeps: the API field is a string[64], NUL included.
const maxTag = 63

// addIPIP sends ipip_add_tunnel and returns the tunnel's index, the existing one's if VPP has it.
func (c *Client) addIPIP(ctx context.Context, sess *session, src, dst netip.Addr, table uint32, mode TunnelMode) (uint32, error) {
	req := &ipip.IpipAddTunnel{Tunnel: ipip.IpipTunnel{
		Instance: noInterface, // VPP picks the name: ipip<N>
		TableID:  table,
		Mode:     tunnel_types.TunnelMode(mode),
	}}
	req.Tunnel.Src.Af = putAPIAddress(&req.Tunnel.Src.Un, src)
	req.Tunnel.Dst.Af = putAPIAddress(&req.Tunnel.Dst.Un, dst)
	reply, err := c.callExpecting(ctx, sess, req, api.IF_ALREADY_EXISTS)
	r, _ := reply.(*ipip.IpipAddTunnelReply)
	switch {
	case err == nil && r != nil:
		return uint32(r.SwIfIndex), nil
	case errors.Is(err, api.IF_ALREADY_EXISTS) && r != nil && uint32(r.SwIfIndex) != noInterface:
		// VPP fills in the existing tunnel's index before it returns -79 (measured on 26.06).
		return uint32(r.SwIfIndex), nil
	case err == nil:
		return 0, fmt.Errorf("ipip_add_tunnel: unexpected reply %s", reply.GetMessageName())
	}
	return 0, fmt.Errorf("ipip_add_tunnel: %w", err)
}

// configureTunnel borrows unnumbered's addresses, sets the MTU if mtu is not 0, and sets the tunnel
// admin up.
func (c *Client) configureTunnel(ctx context.Context, sess *session, idx, unnumbered, mtu uint32) error {
	un := &interfaces.SwInterfaceSetUnnumbered{
		// VPP's names are backwards: sw_if_index has the address, unnumbered_sw_if_index borrows it.
		SwIfIndex:           interface_types.InterfaceIndex(unnumbered),
		UnnumberedSwIfIndex: interface_types.InterfaceIndex(idx),
		IsAdd:               true,
	}
	if _, err := c.call(ctx, sess, un); err != nil {
		return fmt.Errorf("set sw_if_index %d unnumbered to sw_if_index %d: %w", idx, unnumbered, err)
	}
	if mtu != 0 {
		// L3, IPv4, IPv6, MPLS; VPP stores each as given, and 0 (IPv6, MPLS) falls back to L3.
		req := &interfaces.SwInterfaceSetMtu{SwIfIndex: interface_types.InterfaceIndex(idx), Mtu: []uint32{mtu, mtu, 0, 0}}
		if _, err := c.call(ctx, sess, req); err != nil {
			return fmt.Errorf("set sw_if_index %d MTU %d: %w", idx, mtu, err)
		}
	}
	up := &interfaces.SwInterfaceSetFlags{SwIfIndex: interface_types.InterfaceIndex(idx), Flags: interface_types.IF_STATUS_API_FLAG_ADMIN_UP}
	if _, err := c.call(ctx, sess, up); err != nil {
		return fmt.Errorf("set sw_if_index %d admin up: %w", idx, err)
	}
	return nil
}

// DumpIPIPTunnels returns every IPIP tunnel of VPP (ipip_tunnel_dump of ~0), ours and others': the
// caller adopts those whose source is its node address.
func (c *Client) DumpIPIPTunnels(ctx context.Context) ([]IPIPTunnel, error) {
	sess, err := c.current()
	if err != nil {
		return nil, fmt.Errorf("dump IPIP tunnels: %w", err)
	}
	return c.dumpIPIP(ctx, sess, noInterface)
}

// IPIPTunnelAt returns the IPIP tunnel of index swIfIndex (one ipip_tunnel_dump and one
// sw_interface_dump of that index); false when VPP has no tunnel there.
func (c *Client) IPIPTunnelAt(ctx context.Context, swIfIndex uint32) (IPIPTunnel, bool, error) {
	sess, err := c.current()
	if err != nil {
		return IPIPTunnel{}, false, fmt.Errorf("dump IPIP tunnel sw_if_index %d: %w", swIfIndex, err)
	}
	if swIfIndex == 0 || swIfIndex == noInterface {
		return IPIPTunnel{}, false, nil // local0 is no tunnel, and 0 or ~0 would dump every one
	}
	out, err := c.dumpIPIP(ctx, sess, swIfIndex)
	if err != nil || len(out) == 0 {
		return IPIPTunnel{}, false, err
	}
	return out[0], true, nil
}

// dumpIPIP dumps the IPIP tunnels, all of them for noInterface, with their interfaces' tags.
func (c *Client) dumpIPIP(ctx context.Context, sess *session, idx uint32) ([]IPIPTunnel, error) {
	var out []IPIPTunnel
	req := &ipip.IpipTunnelDump{SwIfIndex: interface_types.InterfaceIndex(idx)}
	err := c.dump(ctx, sess, req, func(m api.Message) error {
		d, ok := m.(*ipip.IpipTunnelDetails)
		if !ok {
			return fmt.Errorf("unexpected %s in the dump", m.GetMessageName())
		}
		src, err := fromAPIAddress(d.Tunnel.Src)
		if err != nil {
			return fmt.Errorf("tunnel sw_if_index %d: source: %w", d.Tunnel.SwIfIndex, err)
		}
		dst, err := fromAPIAddress(d.Tunnel.Dst)
		if err != nil {
			return fmt.Errorf("tunnel sw_if_index %d: destination: %w", d.Tunnel.SwIfIndex, err)
		}
		if idx == noInterface || uint32(d.Tunnel.SwIfIndex) == idx {
			out = append(out, IPIPTunnel{SwIfIndex: uint32(d.Tunnel.SwIfIndex), Instance: d.Tunnel.Instance,
				Src: src, Dst: dst, TableID: d.Tunnel.TableID, Mode: TunnelMode(d.Tunnel.Mode)})
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("dump IPIP tunnels: %w", err)
	}
	if len(out) == 0 {
		return out, nil
	}
	// ipip_tunnel_details has no tag or MTU: sw_interface_details has.
	tags := map[uint32]string{}
	mtus := map[uint32]uint32{}
	ifreq := &interfaces.SwInterfaceDump{SwIfIndex: interface_types.InterfaceIndex(idx)}
	err = c.dump(ctx, sess, ifreq, func(m api.Message) error {
		d, ok := m.(*interfaces.SwInterfaceDetails)
		if !ok {
			return fmt.Errorf("unexpected %s in the dump", m.GetMessageName())
		}
		if d.Tag != "" {
			tags[uint32(d.SwIfIndex)] = d.Tag
		}
		if len(d.Mtu) > 0 {
			mtus[uint32(d.SwIfIndex)] = d.Mtu[0]
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("dump IPIP tunnels: interface tags: %w", err)
	}
	for i := range out {
		out[i].Tag, out[i].MTU = tags[out[i].SwIfIndex], mtus[out[i].SwIfIndex]
	}
	return out, nil
}

// SetTunnelMTU sets the L3 and IPv4 MTU of tunnel swIfIndex (as IPIPSpec.MTU does at creation).
func (c *Client) SetTunnelMTU(ctx context.Context, swIfIndex, mtu uint32) error {
	sess, err := c.current()
	if err == nil {
		req := &interfaces.SwInterfaceSetMtu{SwIfIndex: interface_types.InterfaceIndex(swIfIndex), Mtu: []uint32{mtu, mtu, 0, 0}}
		_, err = c.call(ctx, sess, req)
	}
	if err != nil {
		return fmt.Errorf("set sw_if_index %d MTU %d: %w", swIfIndex, mtu, err)
	}
	return nil
}

// InterfaceMTU returns the L3 MTU of interface swIfIndex (sw_interface_details.mtu[0], or its link MTU
// when that is 0): the MTU of the packets it sends, which tunnels over it must leave room in.
func (c *Client) InterfaceMTU(ctx context.Context, swIfIndex uint32) (uint32, error) {
	sess, err := c.current()
	if err != nil {
		return 0, fmt.Errorf("MTU of sw_if_index %d: %w", swIfIndex, err)
	}
	var mtu uint32
	found := false
	req := &interfaces.SwInterfaceDump{SwIfIndex: interface_types.InterfaceIndex(swIfIndex)}
	err = c.dump(ctx, sess, req, func(m api.Message) error {
		d, ok := m.(*interfaces.SwInterfaceDetails)
		if !ok {
			return fmt.Errorf("unexpected %s in the dump", m.GetMessageName())
		}
		if uint32(d.SwIfIndex) == swIfIndex && !found {
			found = true
			mtu = uint32(d.LinkMtu)
			if len(d.Mtu) > 0 && d.Mtu[0] != 0 {
				mtu = d.Mtu[0]
			}
		}
		return nil
	})
	if err == nil && !found {
		err = ErrNoInterface
	}
	if err != nil {
		return 0, fmt.Errorf("MTU of sw_if_index %d: %w", swIfIndex, err)
	}
	return mtu, nil
}

// DeleteIPIPTunnel deletes the IPIP tunnel of index swIfIndex. A tunnel VPP does not have (-6) counts as
// deleted. Routes through it are the caller's to delete first: VPP keeps them (see the package tests).
func (c *Client) DeleteIPIPTunnel(ctx context.Context, swIfIndex uint32) error {
	sess, err := c.current()
	if err != nil {
		return fmt.Errorf("delete IPIP tunnel sw_if_index %d: %w", swIfIndex, err)
	}
	_, err = c.callExpecting(ctx, sess, &ipip.IpipDelTunnel{SwIfIndex: interface_types.InterfaceIndex(swIfIndex)}, api.NO_SUCH_ENTRY)
	if err != nil && !errors.Is(err, api.NO_SUCH_ENTRY) {
		return fmt.Errorf("delete IPIP tunnel sw_if_index %d: %w", swIfIndex, err)
	}
	return nil
}
