package vppapi

import (
	"context"
	"fmt"
	"net/netip"
	"strconv"

	"go.fd.io/govpp/api"
	interfaces "go.fd.io/govpp/binapi/interface"
	"go.fd.io/govpp/binapi/interface_types"
	"go.fd.io/govpp/binapi/ip"

	"github.com/vpp-route-agent/vpp-route-agent/internal/netaddr"
)

// Uplink is the interface the node's routes leave by, and the addresses it must have.
type Uplink struct {
	// Name is VPP's interface name, like "GigabitEthernet0/8/0". Used unless HasIndex is set; if both
	// are set the interface at SwIfIndex must have this name.
	Name string
	// SwIfIndex is the interface's index, used when HasIndex is set.
	SwIfIndex uint32
	// HasIndex says SwIfIndex is set (0 is local0, a valid index).
	HasIndex bool
	// Addresses are the interface addresses, host bits included, like 192.0.2.7/24.
	Addresses []netip.Prefix
}

// String names the uplink for errors.
func (u Uplink) String() string {
	switch {
	case u.HasIndex && u.Name != "":
		return "uplink " + u.Name + " (sw_if_index " + strconv.FormatUint(uint64(u.SwIfIndex), 10) + ")"
	case u.HasIndex:
		return "uplink sw_if_index " + strconv.FormatUint(uint64(u.SwIfIndex), 10)
	default:
		return "uplink " + u.Name
	}
}

// SetupUplink finds the interface (by name with sw_interface_dump's name filter, or by index), sets it
// admin-up unless it already is, and adds each address it lacks (ip_address_dump first). It is idempotent:
// against an already configured VPP it sends no write at all. It returns the interface's sw_if_index.
//
// An unknown interface is an error wrapping ErrNoInterface; for an index also api.INVALID_SW_IF_INDEX.
func (c *Client) SetupUplink(ctx context.Context, u Uplink) (uint32, error) {
	idx, err := c.setupUplink(ctx, u)
	if err != nil {
		return 0, fmt.Errorf("set up %v: %w", u, err)
	}
	return idx, nil
}

// LookupUplink finds the interface like SetupUplink but changes nothing (for dry runs): it returns the
// sw_if_index whatever the interface's state and addresses.
func (c *Client) LookupUplink(ctx context.Context, u Uplink) (uint32, error) {
	if !u.HasIndex && u.Name == "" {
		return 0, fmt.Errorf("look up uplink: neither a name nor an index given")
	}
	sess, err := c.current()
	if err != nil {
		return 0, fmt.Errorf("look up %v: %w", u, err)
	}
	ifc, err := c.findInterface(ctx, sess, u)
	if err != nil {
		return 0, fmt.Errorf("look up %v: %w", u, err)
	}
	return uint32(ifc.SwIfIndex), nil
}

func (c *Client) setupUplink(ctx context.Context, u Uplink) (uint32, error) {
	if !u.HasIndex && u.Name == "" {
		return 0, fmt.Errorf("neither a name nor an index given")
	}
	want := make([]netip.Prefix, 0, len(u.Addresses))
	var want4, want6 bool
	for _, a := range u.Addresses {
		if err := checkPrefix(a); err != nil {
			return 0, fmt.Errorf("address: %w", err)
		}
		p := netaddr.Unmap(a)
		want = append(want, p)
		want4 = want4 || p.Addr().Is4()
		want6 = want6 || p.Addr().Is6()
	}
	sess, err := c.current()
	if err != nil {
		return 0, err
	}

	ifc, err := c.findInterface(ctx, sess, u)
	if err != nil {
		return 0, err
	}
	idx := uint32(ifc.SwIfIndex)
	if ifc.Flags&interface_types.IF_STATUS_API_FLAG_ADMIN_UP == 0 {
		req := &interfaces.SwInterfaceSetFlags{SwIfIndex: ifc.SwIfIndex, Flags: interface_types.IF_STATUS_API_FLAG_ADMIN_UP}
		if _, err := c.call(ctx, sess, req); err != nil {
			return 0, fmt.Errorf("set %s (sw_if_index %d) admin up: %w", ifc.InterfaceName, idx, err)
		}
	}

	have := make(map[netip.Prefix]bool)
	for _, ip6 := range []bool{false, true} {
		if (!ip6 && !want4) || (ip6 && !want6) {
			continue
		}
		req := &ip.IPAddressDump{SwIfIndex: ifc.SwIfIndex, IsIPv6: ip6}
		err := c.dump(ctx, sess, req, func(m api.Message) error {
			d, ok := m.(*ip.IPAddressDetails)
			if !ok {
				return fmt.Errorf("unexpected %s in the dump", m.GetMessageName())
			}
			if d.SwIfIndex != ifc.SwIfIndex {
				return nil
			}
			p, err := fromAPIAddressWithPrefix(d.Prefix)
			if err != nil {
				return err
			}
			have[p] = true
			return nil
		})
		if err != nil {
			return 0, fmt.Errorf("dump %s addresses of %s (sw_if_index %d): %w", family(ip6), ifc.InterfaceName, idx, err)
		}
	}
	for _, p := range want {
		if have[p] {
			continue
		}
		apiPrefix, err := toAPIAddressWithPrefix(p)
		if err != nil {
			return 0, fmt.Errorf("address %v: %w", p, err)
		}
		req := &interfaces.SwInterfaceAddDelAddress{SwIfIndex: ifc.SwIfIndex, IsAdd: true, Prefix: apiPrefix}
		if _, err := c.call(ctx, sess, req); err != nil {
			return 0, fmt.Errorf("add address %v to %s (sw_if_index %d): %w", p, ifc.InterfaceName, idx, err)
		}
		have[p] = true
	}
	return idx, nil
}

// findInterface returns the details of the uplink's interface. VPP's name filter matches substrings
// (case-insensitively) and index 0 dumps every interface, so only an exact match counts.
func (c *Client) findInterface(ctx context.Context, sess *session, u Uplink) (*interfaces.SwInterfaceDetails, error) {
	req := &interfaces.SwInterfaceDump{SwIfIndex: interface_types.InterfaceIndex(noInterface)}
	if u.HasIndex {
		req.SwIfIndex = interface_types.InterfaceIndex(u.SwIfIndex)
	} else {
		req.NameFilterValid = true
		req.NameFilter = u.Name
	}
	var found *interfaces.SwInterfaceDetails
	err := c.dump(ctx, sess, req, func(m api.Message) error {
		d, ok := m.(*interfaces.SwInterfaceDetails)
		if !ok {
			return fmt.Errorf("unexpected %s in the dump", m.GetMessageName())
		}
		if found == nil && ((u.HasIndex && uint32(d.SwIfIndex) == u.SwIfIndex) || (!u.HasIndex && d.InterfaceName == u.Name)) {
			found = d
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("dump interfaces: %w", err)
	}
	switch {
	case found == nil && u.HasIndex:
		return nil, fmt.Errorf("%w: %w", ErrNoInterface, api.INVALID_SW_IF_INDEX)
	case found == nil:
		return nil, ErrNoInterface
	case u.HasIndex && u.Name != "" && found.InterfaceName != u.Name:
		return nil, fmt.Errorf("sw_if_index %d is %s, not %s", u.SwIfIndex, found.InterfaceName, u.Name)
	}
	return found, nil
}
