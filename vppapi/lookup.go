package vppapi

import (
	"context"
	"fmt"
	"net/netip"

	"go.fd.io/govpp/api"
	"go.fd.io/govpp/binapi/ip"
)

// lookupMessages are the messages of LookupRoute, in VPP's core (ip.api, unchanged since 21.06). They
// are checked on connect with usedMessages.
func lookupMessages() []api.Message {
	return []api.Message{(*ip.IPRouteLookup)(nil), (*ip.IPRouteLookupReply)(nil)}
}

// LookupRoute asks VPP which FIB entry of table forwards q: ip_route_lookup with exact=0, VPP's own
// longest-prefix match (fib_table_lookup: the longest entry no longer than q that contains it, the
// default route when nothing else does). A missing table fails with api.NO_SUCH_FIB.
func (c *Client) LookupRoute(ctx context.Context, tableID uint32, q netip.Prefix) (FIBEntry, error) {
	sess, err := c.current()
	if err != nil {
		return FIBEntry{}, fmt.Errorf("ip_route_lookup %s in table %d: %w", q, tableID, err)
	}
	prefix, err := toAPIPrefix(q)
	if err != nil {
		return FIBEntry{}, fmt.Errorf("ip_route_lookup %s in table %d: %w", q, tableID, err)
	}
	reply, err := c.call(ctx, sess, &ip.IPRouteLookup{TableID: tableID, Prefix: prefix})
	if err != nil {
		return FIBEntry{}, fmt.Errorf("ip_route_lookup %s in table %d: %w", q, tableID, err)
	}
	r, ok := reply.(*ip.IPRouteLookupReply)
	if !ok {
		return FIBEntry{}, fmt.Errorf("ip_route_lookup %s in table %d: unexpected %s", q, tableID, reply.GetMessageName())
	}
	e, err := entryFromAPI(r.Route.TableID, r.Route.Prefix, r.Route.Paths)
	if err != nil {
		return FIBEntry{}, fmt.Errorf("ip_route_lookup %s in table %d: %w", q, tableID, err)
	}
	return e, nil
}
