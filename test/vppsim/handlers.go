package vppsim

import (
	"fmt"
	"slices"
	"strings"

	"go.fd.io/govpp/api"
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
	return d
}

func handleSwInterfaceSetFlags(s *Sim, c *conn, ctx uint32, msg api.Message) {
	m := msg.(*interfaces.SwInterfaceSetFlags)
	s.mu.Lock()
	if int(m.SwIfIndex) >= len(s.ifaces) {
		s.mu.Unlock()
		c.reply(ctx, &interfaces.SwInterfaceSetFlagsReply{Retval: rvInvalidSwIfIndex})
		return
	}
	ifc := s.ifaces[m.SwIfIndex]
	up := m.Flags&interface_types.IF_STATUS_API_FLAG_ADMIN_UP != 0
	var targets []eventTarget
	var ev interfaces.SwInterfaceEvent
	if up != ifc.adminUp {
		ifc.adminUp = up
		if len(ifc.addrs) > 0 {
			s.syncInterfaceRoutes()
		}
		targets, ev = s.eventTargets(), ifaceEvent(ifc)
	}
	s.mu.Unlock()
	c.reply(ctx, &interfaces.SwInterfaceSetFlagsReply{})
	s.sendEvents(targets, ev) // after the triggering reply
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
	if int(m.SwIfIndex) >= len(s.ifaces) {
		return rvInvalidSwIfIndex
	}
	ifc := s.ifaces[m.SwIfIndex]
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
	a, _, ok := prefixFromAPI(ip_types.Prefix(m.Prefix))
	if !ok {
		return rvInvalidPrefixLength
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
	if slices.Contains(ifc.addrs, a) {
		return rvDuplicateIfAddress
	}
	// VPP refuses overlapping subnets in a VRF, except several addresses of
	// one prefix (same length) on the same interface.
	for _, other := range s.ifaces {
		for _, x := range other.addrs {
			if !overlaps(a, x) {
				continue
			}
			if other == ifc && x.Bits() == a.Bits() {
				continue
			}
			return rvAddressInUse
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
	if int(m.SwIfIndex) < len(s.ifaces) {
		for _, a := range s.ifaces[m.SwIfIndex].addrs {
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
	pfx, _, ok := prefixFromAPI(m.Route.Prefix)
	if !ok {
		return rvInvalidPrefixLength, 0
	}
	pfx = pfx.Masked()
	switch {
	case m.IsMultipath && len(paths) == 0, !m.IsMultipath && m.IsAdd && len(paths) == 0:
		return rvNoPathsInRoute, 0
	case m.IsAdd && m.IsMultipath:
		return rvOK, s.apiAddPaths(t, pfx, paths).stats
	case m.IsAdd:
		return rvOK, s.apiReplace(t, pfx, paths).stats
	case m.IsMultipath:
		t.apiRemovePaths(pfx, paths)
	default:
		t.apiDelete(pfx)
	}
	return rvOK, 0
}

// handleIPRouteDump sends one ip_route_details per entry of the table, special
// routes first, each with its best source's paths (normalised: sorted, weight
// at least 1). An unknown table yields no details.
func handleIPRouteDump(s *Sim, c *conn, ctx uint32, msg api.Message) {
	m := msg.(*ip.IPRouteDump)
	s.mu.Lock()
	t := s.tables[tableKey{m.Table.TableID, m.Table.IsIP6}]
	var out []*ip.IPRouteDetails
	if t != nil {
		es := t.sortedEntries()
		out = make([]*ip.IPRouteDetails, len(es))
		for i, e := range es {
			_, paths := e.best()
			if len(paths) > 255 {
				paths = paths[:255] // n_paths is a u8
			}
			d := &ip.IPRouteDetails{Route: ip.IPRoute{
				TableID:    t.key.id,
				StatsIndex: e.stats,
				Prefix:     prefixToAPI(e.prefix),
				NPaths:     uint8(len(paths)),
				Paths:      make([]fib_types.FibPath, len(paths)),
			}}
			for j, p := range paths {
				d.Route.Paths[j] = pathToAPI(p)
			}
			out[i] = d
		}
	}
	s.mu.Unlock()
	for _, d := range out {
		c.reply(ctx, d)
	}
}

// String describes the simulator for logs.
func (s *Sim) String() string {
	return fmt.Sprintf("vppsim(socket=%s pid=%d)", s.SocketPath(), s.PID())
}
