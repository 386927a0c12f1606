package vppsim

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"go.fd.io/govpp/api"
	"go.fd.io/govpp/binapi/bfd"
	"go.fd.io/govpp/binapi/ethernet_types"
	"go.fd.io/govpp/binapi/fib_types"
	interfaces "go.fd.io/govpp/binapi/interface"
	"go.fd.io/govpp/binapi/interface_types"
	"go.fd.io/govpp/binapi/ip"
	"go.fd.io/govpp/binapi/ip_types"
	"go.fd.io/govpp/binapi/memclnt"
	"go.fd.io/govpp/binapi/vpe"
)

// handlers maps message names to their handler. Every other message of the
// table gets no reply, as in a VPP without a handler for it.
var handlers = map[string]handlerFunc{
	"sockclnt_create":              handleSockclntCreate,
	"sockclnt_delete":              handleSockclntDelete,
	"control_ping":                 handleControlPing,
	"show_version":                 handleShowVersion,
	"sw_interface_dump":            handleSwInterfaceDump,
	"sw_interface_set_flags":       handleSwInterfaceSetFlags,
	"sw_interface_add_del_address": handleSwInterfaceAddDelAddress,
	"want_interface_events":        handleWantInterfaceEvents,
	"ip_address_dump":              handleIPAddressDump,
	"ip_table_add_del":             handleIPTableAddDel,
	"ip_table_dump":                handleIPTableDump,
	"ip_route_add_del":             handleIPRouteAddDel,
	"ip_route_dump":                handleIPRouteDump,
	"ip_route_v2_dump":             handleIPRouteV2Dump,
	"ip_route_lookup":              handleIPRouteLookup, // lookup.go
	// tunnel.go
	"ipip_add_tunnel":             handleIPIPAddTunnel,
	"ipip_del_tunnel":             handleIPIPDelTunnel,
	"ipip_tunnel_dump":            handleIPIPTunnelDump,
	"sw_interface_set_unnumbered": handleSwInterfaceSetUnnumbered,
	"ip_unnumbered_dump":          handleIPUnnumberedDump,
	"sw_interface_set_mtu":        handleSwInterfaceSetMtu,
	"sw_interface_tag_add_del":    handleSwInterfaceTagAddDel,
	"teib_entry_add_del":          handleTEIBEntryAddDel,
	"teib_dump":                   handleTEIBDump,
	// bfd.go
	"bfd_udp_add":               handleBFDUDPAdd,
	"bfd_udp_mod":               handleBFDUDPMod,
	"bfd_udp_del":               handleBFDUDPDel,
	"bfd_udp_session_set_flags": handleBFDUDPSessionSetFlags,
	"bfd_udp_session_dump":      handleBFDUDPSessionDump,
	"want_bfd_events":           handleWantBFDEvents,
}

// handleSockclntCreate registers the connection as a client and answers with
// the message table. sockclnt_create is reply-shaped and its reply
// request-shaped: the context sits at different offsets. The handshake is
// answered even under Faults.NoReply.
func handleSockclntCreate(s *Sim, c *conn, ctx uint32, _ api.Message) {
	s.mu.Lock()
	if c.index == 0 {
		s.nextClient++
		c.index = s.nextClient
		s.clients[c.index] = c
	}
	s.mu.Unlock()
	c.send(&memclnt.SockclntCreateReply{
		Response:     0,
		Index:        c.index,
		Count:        uint16(len(s.table.listing)),
		MessageTable: s.table.listing,
	}, ctx)
}

// handleSockclntDelete answers response 1 (as VPP does) and drops the
// registration named by Index, closing its connection; -1 for an unknown one.
func handleSockclntDelete(s *Sim, c *conn, ctx uint32, msg api.Message) {
	m := msg.(*memclnt.SockclntDelete)
	s.mu.Lock()
	target := s.clients[m.Index]
	s.mu.Unlock()
	if target == nil {
		c.send(&memclnt.SockclntDeleteReply{Response: -1}, ctx)
		return
	}
	c.send(&memclnt.SockclntDeleteReply{Response: sockclntDeleteResponse}, ctx)
	if target == c {
		c.closing = true
		return
	}
	target.kill()
}

func handleControlPing(s *Sim, c *conn, ctx uint32, _ api.Message) {
	if s.faults.Load().NoPingReply {
		return
	}
	c.send(&memclnt.ControlPingReply{Retval: 0, ClientIndex: c.index, VpePID: s.PID()}, ctx)
}

func handleShowVersion(s *Sim, c *conn, ctx uint32, _ api.Message) {
	c.reply(ctx, &vpe.ShowVersionReply{
		Program:        "vpe",
		Version:        s.cfg.Version,
		BuildDate:      "vppsim",
		BuildDirectory: "/vppsim",
	})
}

// handleSwInterfaceDump dumps every interface for sw_if_index 0 or ~0, else
// the one interface (none if invalid); the name filter is a case-insensitive
// substring match.
func handleSwInterfaceDump(s *Sim, c *conn, ctx uint32, msg api.Message) {
	m := msg.(*interfaces.SwInterfaceDump)
	filter := strings.ToLower(m.NameFilter)
	s.mu.Lock()
	var out []*interfaces.SwInterfaceDetails
	for _, ifc := range s.ifaces {
		if ifc.deleted {
			continue
		}
		if idx := uint32(m.SwIfIndex); idx != 0 && idx != ^uint32(0) && idx != ifc.index {
			continue
		}
		if m.NameFilterValid && !strings.Contains(strings.ToLower(ifc.name), filter) {
			continue
		}
		out = append(out, ifaceDetails(ifc))
	}
	s.mu.Unlock()
	for _, d := range out {
		c.reply(ctx, d)
	}
}

func ifaceDetails(ifc *iface) *interfaces.SwInterfaceDetails {
	d := &interfaces.SwInterfaceDetails{
		SwIfIndex:     interface_types.InterfaceIndex(ifc.index),
		SupSwIfIndex:  ifc.index,
		L2Address:     ethernet_types.MacAddress(ifc.mac),
		Flags:         ifaceFlags(ifc),
		Type:          interface_types.IF_API_TYPE_HARDWARE,
		InterfaceName: ifc.name,
		Tag:           ifc.tag,
	}
	if ifc.index == 0 {
		d.InterfaceDevType = "local"
		d.Mtu = []uint32{0, 0, 0, 0}
	} else {
		d.InterfaceDevType = "dpdk"
		d.LinkDuplex = interface_types.LINK_DUPLEX_API_FULL
		d.LinkSpeed = 10_000_000 // kbit/s
		d.LinkMtu = 9000
		d.Mtu = []uint32{9000, 0, 0, 0}
	}
	if ifc.mtu != nil {
		d.Mtu = ifc.mtu[:]
	}
	if ifc.tunnel != nil {
		tunnelDetails(d)
	}
	if ifc.vxlan != nil {
		vxlanDetails(d)
	}
	return d
}

func handleSwInterfaceSetFlags(s *Sim, c *conn, ctx uint32, msg api.Message) {
	m := msg.(*interfaces.SwInterfaceSetFlags)
	s.mu.Lock()
	ifc := s.ifaceAt(uint32(m.SwIfIndex))
	if ifc == nil {
		s.mu.Unlock()
		c.reply(ctx, &interfaces.SwInterfaceSetFlagsReply{Retval: rvInvalidSwIfIndex})
		return
	}
	up := m.Flags&interface_types.IF_STATUS_API_FLAG_ADMIN_UP != 0
	var targets []eventTarget
	var ev interfaces.SwInterfaceEvent
	var bfdEvs []bfd.BfdUDPSessionEvent
	if up != ifc.adminUp {
		wasUp := ifc.linkUp()
		ifc.adminUp = up
		if len(ifc.addrs) > 0 {
			s.syncInterfaceRoutes()
		}
		targets, ev = s.eventTargets(), ifaceEvent(ifc)
		bfdEvs = s.bfdLinkChanged(ifc.index, wasUp)
	}
	s.mu.Unlock()
	c.reply(ctx, &interfaces.SwInterfaceSetFlagsReply{})
	s.sendEvents(targets, ev) // after the triggering reply
	s.sendBFDEvents(bfdEvs)
}

func handleSwInterfaceAddDelAddress(s *Sim, c *conn, ctx uint32, msg api.Message) {
	m := msg.(*interfaces.SwInterfaceAddDelAddress)
	s.mu.Lock()
	rv := s.addDelAddress(m)
	s.mu.Unlock()
	c.reply(ctx, &interfaces.SwInterfaceAddDelAddressReply{Retval: rv})
}

// addDelAddress applies sw_interface_add_del_address. Call with s.mu held.
func (s *Sim) addDelAddress(m *interfaces.SwInterfaceAddDelAddress) int32 {
	ifc := s.ifaceAt(uint32(m.SwIfIndex))
	if ifc == nil {
		return rvInvalidSwIfIndex
	}
	if m.DelAll {
		if len(ifc.addrs) > 0 {
			ifc.addrs = nil
			s.syncInterfaceRoutes()
		}
		return rvOK
	}
	if ifc.index == 0 {
		return rvUnsupported // local0 does not support IP addressing
	}
	a, ip6, ok := prefixFromAPI(ip_types.Prefix(m.Prefix))
	if !ok {
		return rvAddressLengthMismatch
	}
	if !m.IsAdd {
		i := slices.Index(ifc.addrs, a)
		if i < 0 {
			return rvAddressNotFound
		}
		ifc.addrs = slices.Delete(ifc.addrs, i, i+1)
		s.syncInterfaceRoutes()
		return rvOK
	}
	// Measured on 26.06: an IPv4 address already on the interface is -105
	// (the overlap check runs first), an IPv6 one -127; an overlap with
	// another interface of the VRF is -105 for IPv4 and -127 for IPv6.
	// Several addresses of one prefix (same length) on one interface are
	// accepted.
	inUse := rvAddressInUse
	if ip6 {
		inUse = rvDuplicateIfAddress
	}
	if slices.Contains(ifc.addrs, a) {
		return inUse
	}
	for _, other := range s.ifaces {
		for _, x := range other.addrs {
			if !overlaps(a, x) {
				continue
			}
			if other == ifc && x.Bits() == a.Bits() {
				continue
			}
			return inUse
		}
	}
	ifc.addrs = append(ifc.addrs, a)
	s.syncInterfaceRoutes()
	return rvOK
}

// handleWantInterfaceEvents registers or unregisters the client for
// sw_interface_event; enabling twice or disabling when not enabled is -31.
func handleWantInterfaceEvents(s *Sim, c *conn, ctx uint32, msg api.Message) {
	m := msg.(*interfaces.WantInterfaceEvents)
	s.mu.Lock()
	_, registered := s.eventRegs[c.index]
	rv := rvOK
	switch {
	case m.EnableDisable != 0 && registered, m.EnableDisable == 0 && !registered:
		rv = rvInvalidRegistration
	case m.EnableDisable != 0:
		s.eventRegs[c.index] = m.PID
	default:
		delete(s.eventRegs, c.index)
	}
	s.mu.Unlock()
	c.reply(ctx, &interfaces.WantInterfaceEventsReply{Retval: rv})
}

func handleIPAddressDump(s *Sim, c *conn, ctx uint32, msg api.Message) {
	m := msg.(*ip.IPAddressDump)
	s.mu.Lock()
	var out []*ip.IPAddressDetails
	if ifc := s.ifaceAt(uint32(m.SwIfIndex)); ifc != nil {
		for _, a := range ifc.addrs {
			if a.Addr().Is6() != m.IsIPv6 {
				continue
			}
			out = append(out, &ip.IPAddressDetails{
				SwIfIndex: m.SwIfIndex,
				Prefix:    ip_types.AddressWithPrefix(prefixToAPI(a)),
			})
		}
	}
	s.mu.Unlock()
	for _, d := range out {
		c.reply(ctx, d)
	}
}

// handleIPTableAddDel creates (idempotently) or deletes a table. Table 0
// cannot be deleted and table id ~0 is ignored; both still answer 0.
func handleIPTableAddDel(s *Sim, c *conn, ctx uint32, msg api.Message) {
	m := msg.(*ip.IPTableAddDel)
	k := tableKey{m.Table.TableID, m.Table.IsIP6}
	s.mu.Lock()
	switch {
	case k.id == ^uint32(0):
	case m.IsAdd:
		if s.tables[k] == nil {
			name := m.Table.Name
			if name == "" {
				name = defaultTableName(k)
			}
			s.tables[k] = s.newTable(k, name)
		}
	case k.id != 0:
		delete(s.tables, k)
	}
	s.mu.Unlock()
	c.reply(ctx, &ip.IPTableAddDelReply{})
}

func handleIPTableDump(s *Sim, c *conn, ctx uint32, _ api.Message) {
	s.mu.Lock()
	keys := make([]tableKey, 0, len(s.tables))
	for k := range s.tables {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, compareTableKeys)
	out := make([]*ip.IPTableDetails, len(keys))
	for i, k := range keys {
		out[i] = &ip.IPTableDetails{Table: ip.IPTable{TableID: k.id, IsIP6: k.ip6, Name: s.tables[k].name}}
	}
	s.mu.Unlock()
	for _, d := range out {
		c.reply(ctx, d)
	}
}

func handleIPRouteAddDel(s *Sim, c *conn, ctx uint32, msg api.Message) {
	m := msg.(*ip.IPRouteAddDel)
	s.mu.Lock()
	rv, stats := s.routeAddDel(m)
	s.mu.Unlock()
	c.reply(ctx, &ip.IPRouteAddDelReply{Retval: rv, StatsIndex: stats})
}

// routeAddDel applies ip_route_add_del, checking as VPP does: table, then
// paths, then prefix length, then the action. Call with s.mu held.
func (s *Sim) routeAddDel(m *ip.IPRouteAddDel) (int32, uint32) {
	ip6 := m.Route.Prefix.Address.Af == ip_types.ADDRESS_IP6
	t := s.tables[tableKey{m.Route.TableID, ip6}]
	if t == nil {
		return rvNoSuchFIB, 0
	}
	var paths []fibPath
	if len(m.Route.Paths) > 0 {
		paths = make([]fibPath, len(m.Route.Paths))
		for i, in := range m.Route.Paths {
			p, rv := s.pathFromAPI(in)
			if rv != rvOK {
				return rv, 0
			}
			paths[i] = p
		}
	}
	// The entry keeps the prefix as first given (host bits and all) for its
	// dumps; it is keyed, and looked up, masked.
	pfx, _, ok := prefixFromAPI(m.Route.Prefix)
	if !ok {
		return rvInvalidPrefixLength, 0
	}
	hostPathFixup(pfx, paths)
	switch {
	case m.IsMultipath && len(paths) == 0, !m.IsMultipath && m.IsAdd && len(paths) == 0:
		return rvNoPathsInRoute, 0
	case m.IsAdd && m.IsMultipath:
		return rvOK, s.apiAddPaths(t, pfx, paths).stats
	case m.IsAdd:
		return rvOK, s.apiReplace(t, pfx, paths).stats
	case m.IsMultipath:
		s.apiRemovePaths(t, pfx.Masked(), paths)
	default:
		s.apiDelete(t, pfx.Masked())
	}
	return rvOK, ^uint32(0) // a delete's stats_index is ~0 (measured)
}

// hostPathFixup does what VPP's fib_table_route_path_fixup does to the paths of a host prefix (/32, /128):
// a path out of an interface with no next hop gets the prefix's address as its next hop (an attached
// next hop), and is dumped so: "10.244.0.10/32 via ipip0" reads back as "via 10.244.0.10 ipip0"
// (observed on VPP 26.06, by the API and the CLI alike).
func hostPathFixup(pfx netip.Prefix, paths []fibPath) {
	if pfx.Bits() != pfx.Addr().BitLen() {
		return
	}
	for i, p := range paths {
		if p.typ == fib_types.FIB_API_PATH_TYPE_NORMAL && !p.nh.IsValid() && p.swIfIndex != ^uint32(0) {
			paths[i].nh = pfx.Addr()
		}
	}
}

// handleIPRouteDump sends one ip_route_details per entry of the table, in no
// particular order, each with its best source's paths (normalised: sorted,
// weight at least 1) and its prefix as first created. An unknown table
// yields no details.
func handleIPRouteDump(s *Sim, c *conn, ctx uint32, msg api.Message) {
	m := msg.(*ip.IPRouteDump)
	s.mu.Lock()
	var out []*ip.IPRouteDetails
	for _, r := range s.dumpTable(m.Table, 0) {
		out = append(out, &ip.IPRouteDetails{Route: ip.IPRoute{TableID: r.TableID, StatsIndex: r.StatsIndex,
			Prefix: r.Prefix, NPaths: r.NPaths, Paths: r.Paths}})
	}
	s.mu.Unlock()
	for _, d := range out {
		c.reply(ctx, d)
	}
}

// handleIPRouteV2Dump is ip_route_dump with sources: src 0 dumps every entry
// with its best source, any other src only the entries whose best source it
// is (measured on 26.06: src 8 returns the API routes only, and leaves out an
// API route an interface address of the same prefix shadows, whichever came
// first). Each detail carries its source.
func handleIPRouteV2Dump(s *Sim, c *conn, ctx uint32, msg api.Message) {
	m := msg.(*ip.IPRouteV2Dump)
	s.mu.Lock()
	var out []*ip.IPRouteV2Details
	for _, r := range s.dumpTable(m.Table, Source(m.Src)) {
		out = append(out, &ip.IPRouteV2Details{Route: r})
	}
	s.mu.Unlock()
	for _, d := range out {
		c.reply(ctx, d)
	}
}

// dumpTable returns the routes of a table in no particular order: those whose
// best source is src, or with src 0 every entry with its best source. Call with s.mu
// held.
func (s *Sim) dumpTable(table ip.IPTable, src Source) []ip.IPRouteV2 {
	t := s.tables[tableKey{table.TableID, table.IsIP6}]
	if t == nil {
		return nil
	}
	var out []ip.IPRouteV2
	for _, e := range t.entryList() {
		from, paths := e.best()
		if src != 0 && from != src {
			continue
		}
		if len(paths) > 255 {
			paths = paths[:255] // n_paths is a u8
		}
		r := ip.IPRouteV2{
			TableID:    t.key.id,
			StatsIndex: e.stats,
			Prefix:     prefixToAPI(e.shown),
			NPaths:     uint8(len(paths)),
			Src:        uint8(from),
			Paths:      make([]fib_types.FibPath, len(paths)),
		}
		for j, p := range paths {
			r.Paths[j] = pathToAPI(p)
		}
		out = append(out, r)
	}
	return out
}

// String describes the simulator for logs.
func (s *Sim) String() string {
	return fmt.Sprintf("vppsim(socket=%s pid=%d)", s.SocketPath(), s.PID())
}
