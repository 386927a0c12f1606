package vpptopo

import (
	"context"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"
)

// linkWait is how long a node's uplinks get to link to their switches (after a start or restart, the
// startup-config creates them 2 s after VPP starts; a loaded 2-core box adds seconds).
const linkWait = 30 * time.Second

// SetSwitchPort takes node n's port on the switch of its uplink k (0: the first) down or up: the
// switch's memif interface is set admin down or up. While it is down the switch drops what the node
// sends on that link and sends it nothing, yet both memif ends stay connected and the node's interface
// stays up: a silent failure, like a top-of-rack switch port or cable gone bad, that only a protocol
// such as BFD notices.
func (t *Topology) SetSwitchPort(ctx context.Context, n *Node, k int, up bool) error {
	if k < 0 || k >= len(t.Switches) || k >= len(n.Uplinks) {
		return fmt.Errorf("%s has no uplink %d", n.Name, k)
	}
	cmd := fmt.Sprintf("set interface state memif%d/0 %s", n.index, state(up))
	if _, err := t.Switches[k].CLI(ctx, cmd); err != nil {
		return fmt.Errorf("%s's port on %s: %w", n.Name, switchName(t.Kind, k), err)
	}
	return nil
}

// SetUplink takes node n's uplink k down or up on the node's own VPP (admin state): the node sees its
// interface go down, and the routes through it become unresolved.
func (n *Node) SetUplink(ctx context.Context, k int, up bool) error {
	if k < 0 || k >= len(n.Uplinks) {
		return fmt.Errorf("%s has no uplink %d", n.Name, k)
	}
	if _, err := n.VPP.CLI(ctx, "set interface state "+n.Uplinks[k].Interface+" "+state(up)); err != nil {
		return fmt.Errorf("%s: %w", n.Name, err)
	}
	return nil
}

func state(up bool) string {
	if up {
		return "up"
	}
	return "down"
}

// Kill kills node n's VPP with SIGKILL, as a crash does, and waits for it to exit. Its switches see
// their memif links to it disconnect.
func (n *Node) Kill() error {
	if err := n.VPP.Signal(syscall.SIGKILL); err != nil {
		return fmt.Errorf("%s: %w", n.Name, err)
	}
	n.VPP.Stop() // reaps it (the SIGTERM Stop sends finds it gone)
	return nil
}

// Restart starts node n's VPP again (stopping it first if it runs) with its first configuration (its
// uplinks, addresses and pods; nothing a route agent added) and returns once its uplinks are linked to
// their switches again.
func (n *Node) Restart(ctx context.Context) error {
	if err := n.VPP.Restart(ctx); err != nil {
		return fmt.Errorf("restart %s's VPP: %w", n.Name, err)
	}
	return n.waitLinked(ctx)
}

// waitLinked waits until every uplink of n is linked to its switch.
func (n *Node) waitLinked(ctx context.Context) error {
	for _, u := range n.Uplinks {
		if err := waitLinkUp(ctx, n.VPP, u.Interface, linkWait); err != nil {
			return fmt.Errorf("%s: %w", n.Name, err)
		}
	}
	return nil
}

// LinkUp reports whether node n's uplink k is linked (memif connected; up as VPP reports it).
func (n *Node) LinkUp(ctx context.Context, k int) (bool, error) {
	if k < 0 || k >= len(n.Uplinks) {
		return false, fmt.Errorf("%s has no uplink %d", n.Name, k)
	}
	return linkUp(ctx, n.VPP, n.Uplinks[k].Interface)
}

// forwardingVia finds the next hops in "show ip fib"'s forwarding section ("[0] [@5]: ipv4 via
// 192.168.61.2 memif1/0: ...").
var forwardingVia = regexp.MustCompile(`via ([0-9A-Fa-f.:]+) `)

// Forwarding returns the next hops node n's VPP forwards table 0's route for prefix p by, sorted, or
// nil when it drops: what the data plane uses (paths VPP took out of forwarding, such as those through
// a BFD-down neighbour, left out), which a route dump does not show. It reads "show ip fib" or
// "show ip6 fib".
func (n *Node) Forwarding(ctx context.Context, p netip.Prefix) ([]netip.Addr, error) {
	cmd := "show ip fib "
	if p.Addr().Is6() {
		cmd = "show ip6 fib "
	}
	out, err := n.VPP.CLI(ctx, cmd+p.String())
	if err != nil {
		return nil, fmt.Errorf("%s: %w", n.Name, err)
	}
	_, fwd, ok := strings.Cut(out, "forwarding:")
	if !ok {
		return nil, fmt.Errorf("%s: %s%s: no forwarding section in %q", n.Name, cmd, p, out)
	}
	var via []netip.Addr
	for _, m := range forwardingVia.FindAllStringSubmatch(fwd, -1) {
		if a, err := netip.ParseAddr(m[1]); err == nil {
			via = append(via, a)
		}
	}
	slices.SortFunc(via, netip.Addr.Compare)
	return slices.Compact(via), nil
}
