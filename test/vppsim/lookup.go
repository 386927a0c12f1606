package vppsim

import (
	"net/netip"

	"go.fd.io/govpp/api"
	"go.fd.io/govpp/binapi/fib_types"
	"go.fd.io/govpp/binapi/ip"
	"go.fd.io/govpp/binapi/ip_types"
)

// handleIPRouteLookup answers ip_route_lookup as VPP's vl_api_ip_route_lookup_t_handler does: an unknown
// table is NO_SUCH_FIB; exact=0 is fib_table_lookup, the longest entry whose length is at most the
// prefix's and which contains its address (the default route 0.0.0.0/0 or ::/0 is in every table, so it
// always finds one); exact=1 is the entry of that very prefix or NO_SUCH_ENTRY. The reply carries the
// entry as ip_route_dump shows it (its prefix as first created, its best source's paths), with the
// request's table_id.
func handleIPRouteLookup(s *Sim, c *conn, ctx uint32, msg api.Message) {
	m := msg.(*ip.IPRouteLookup)
	s.mu.Lock()
	reply := s.routeLookup(m)
	s.mu.Unlock()
	c.reply(ctx, reply)
}

// routeLookup computes the reply of ip_route_lookup. Call with s.mu held.
func (s *Sim) routeLookup(m *ip.IPRouteLookup) *ip.IPRouteLookupReply {
	ip6 := m.Prefix.Address.Af == ip_types.ADDRESS_IP6
	t := s.tables[tableKey{m.TableID, ip6}]
	if t == nil {
		return &ip.IPRouteLookupReply{Retval: rvNoSuchFIB}
	}
	a := addrFromUnion(m.Prefix.Address.Un, ip6)
	bits := min(int(m.Prefix.Len), a.BitLen())
	var e *entry
	if m.Exact != 0 {
		e = t.entries[netip.PrefixFrom(a, bits).Masked()]
	} else {
		for b := bits; b >= 0 && e == nil; b-- {
			e = t.entries[netip.PrefixFrom(a, b).Masked()]
		}
	}
	if e == nil {
		return &ip.IPRouteLookupReply{Retval: rvNoSuchEntry}
	}
	_, paths := e.best()
	if len(paths) > 255 {
		paths = paths[:255] // n_paths is a u8
	}
	r := ip.IPRoute{TableID: m.TableID, StatsIndex: e.stats, Prefix: prefixToAPI(e.shown), NPaths: uint8(len(paths)),
		Paths: make([]fib_types.FibPath, len(paths))}
	for i, p := range paths {
		r.Paths[i] = pathToAPI(p)
	}
	return &ip.IPRouteLookupReply{Route: r}
}
