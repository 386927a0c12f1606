package vppapi

// Point-to-multipoint IPIP with TEIB entries, kept for BenchmarkIPIPPeers and TestIPIPMultipoint only:
// measured against one p2p tunnel per peer, it did not earn its place in the package (README,
// Performance). These are methods of Client in a _test.go file so that the benchmark compares both
// designs through the same request machinery.

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"go.fd.io/govpp/api"
	"go.fd.io/govpp/binapi/interface_types"
	"go.fd.io/govpp/binapi/teib"

	"github.com/vpp-route-agent/vpp-route-agent/internal/netaddr"
)

// EnsureIPIPMultipoint makes sure VPP has the point-to-multipoint IPIP tunnel from src in table (mode MP,
// destination 0.0.0.0), unnumbered to unnumbered, with mtu if not 0, and admin up; it returns its index.
// Each peer then needs a TEIB entry (AddTEIBEntry), and routes through it name the peer as next hop.
func (c *Client) EnsureIPIPMultipoint(ctx context.Context, src netip.Addr, table, unnumbered, mtu uint32) (uint32, error) {
	what := fmt.Sprintf("ensure p2mp IPIP tunnel from %v", src)
	if !src.IsValid() {
		return 0, fmt.Errorf("%s: source needed", what)
	}
	src = netaddr.CanonicalAddr(src)
	sess, err := c.current()
	if err != nil {
		return 0, fmt.Errorf("%s: %w", what, err)
	}
	dst := netip.IPv4Unspecified()
	if src.Is6() {
		dst = netip.IPv6Unspecified()
	}
	idx, err := c.addIPIP(ctx, sess, src, dst, table, TunnelMP)
	if err == nil {
		err = c.configureTunnel(ctx, sess, idx, unnumbered, mtu)
	}
	if err != nil {
		return 0, fmt.Errorf("%s: %w", what, err)
	}
	return idx, nil
}

// TEIBEntry maps an overlay peer address, reached through a p2mp tunnel, to its underlay next hop.
type TEIBEntry struct {
	// SwIfIndex is the p2mp tunnel.
	SwIfIndex uint32
	// Peer is the overlay address routes name as next hop. It must not be an underlay address in the
	// tunnel's table: VPP installs Peer/32 via the tunnel, which would capture the tunnel's own traffic.
	Peer netip.Addr
	// NextHop is the peer node's underlay address, looked up in NextHopTable.
	NextHop      netip.Addr
	NextHopTable uint32
}

// String names the entry for errors: "TEIB sw_if_index 2 peer 10.255.0.2 nh 192.0.2.2".
func (e TEIBEntry) String() string {
	return fmt.Sprintf("TEIB sw_if_index %d peer %v nh %v", e.SwIfIndex, e.Peer, e.NextHop)
}

// AddTEIBEntry adds e; an entry VPP has already for that peer (-116) counts as added.
func (c *Client) AddTEIBEntry(ctx context.Context, e TEIBEntry) error {
	err := c.teibAddDel(ctx, e, true)
	if err != nil && !errors.Is(err, api.ENTRY_ALREADY_EXISTS) {
		return fmt.Errorf("add %v: %w", e, err)
	}
	return nil
}

// DeleteTEIBEntry deletes e (by tunnel and peer); an unknown one (-6) counts as deleted. Delete a p2mp
// tunnel's entries before the tunnel: VPP keeps those left, undeletable, and gives them to the next
// tunnel that reuses the index.
func (c *Client) DeleteTEIBEntry(ctx context.Context, e TEIBEntry) error {
	err := c.teibAddDel(ctx, e, false)
	if err != nil && !errors.Is(err, api.NO_SUCH_ENTRY) {
		return fmt.Errorf("delete %v: %w", e, err)
	}
	return nil
}

func (c *Client) teibAddDel(ctx context.Context, e TEIBEntry, add bool) error {
	if !e.Peer.IsValid() || (add && !e.NextHop.IsValid()) {
		return errors.New("peer and next hop needed")
	}
	sess, err := c.current()
	if err != nil {
		return err
	}
	req := &teib.TeibEntryAddDel{IsAdd: boolU8(add), Entry: teib.TeibEntry{
		SwIfIndex: interface_types.InterfaceIndex(e.SwIfIndex), NhTableID: e.NextHopTable}}
	req.Entry.Peer.Af = putAPIAddress(&req.Entry.Peer.Un, netaddr.CanonicalAddr(e.Peer))
	if e.NextHop.IsValid() {
		req.Entry.Nh.Af = putAPIAddress(&req.Entry.Nh.Un, netaddr.CanonicalAddr(e.NextHop))
	}
	reply, err := c.call(ctx, sess, req)
	if err != nil {
		return err
	}
	// replyError does not know teib's reply: the production code sends none.
	if r, ok := reply.(*teib.TeibEntryAddDelReply); ok && r.Retval != 0 {
		return api.VPPApiError(r.Retval)
	}
	return nil
}

// DumpTEIB returns every TEIB entry of VPP.
func (c *Client) DumpTEIB(ctx context.Context) ([]TEIBEntry, error) {
	sess, err := c.current()
	if err != nil {
		return nil, fmt.Errorf("dump TEIB: %w", err)
	}
	var out []TEIBEntry
	err = c.dump(ctx, sess, &teib.TeibDump{}, func(m api.Message) error {
		d, ok := m.(*teib.TeibDetails)
		if !ok {
			return fmt.Errorf("unexpected %s in the dump", m.GetMessageName())
		}
		peer, err := fromAPIAddress(d.Entry.Peer)
		if err != nil {
			return err
		}
		nh, err := fromAPIAddress(d.Entry.Nh)
		if err != nil {
			return err
		}
		out = append(out, TEIBEntry{SwIfIndex: uint32(d.Entry.SwIfIndex), Peer: peer, NextHop: nh, NextHopTable: d.Entry.NhTableID})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("dump TEIB: %w", err)
	}
	return out, nil
}

func boolU8(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}
