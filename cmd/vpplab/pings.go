package main

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/vpp-route-agent/vpp-route-agent/internal/vpptopo"
)

// pingPod is the pod of a node that answers pings on the wired lab: its addresses, as block-ipam gave
// them, sit on the node VPP's vpptopo.PodInterface, as the CNI on the node would leave them.
type pingPod struct {
	id     string
	v4, v6 netip.Addr
}

// podOf reads the addresses of pod id from its CNI result.
func podOf(id string, res types.Result) (pingPod, error) {
	r, err := current.NewResultFromResult(res)
	if err != nil {
		return pingPod{}, fmt.Errorf("ADD %s: result: %w", id, err)
	}
	p := pingPod{id: id}
	for _, ip := range r.IPs {
		a, ok := netip.AddrFromSlice(ip.Address.IP)
		if !ok {
			continue
		}
		if a = a.Unmap(); a.Is4() {
			p.v4 = a
		} else {
			p.v6 = a
		}
	}
	if !p.v4.IsValid() || !p.v6.IsValid() {
		return pingPod{}, fmt.Errorf("ADD %s: result %v lacks an IPv4 or an IPv6 address", id, r.IPs)
	}
	return p, nil
}

// addr returns the pod's address of the family.
func (p pingPod) addr(ipv6 bool) netip.Addr {
	if ipv6 {
		return p.v6
	}
	return p.v4
}

// placePod puts n's ping pod's addresses on its VPP's pod interface and checks that they are there. It
// retries for a while: after a VPP restart the interface comes back with the startup-config, 2 s later
// (vppctl answers a command on a missing interface with a message, not an error).
func (l *lab) placePod(ctx context.Context, n *labNode) error {
	v := n.vpp.(*topoPlane).node.VPP
	deadline := time.Now().Add(l.o.settle)
	for {
		out, err := v.CLI(ctx, "show interface addr "+vpptopo.PodInterface)
		if err == nil && strings.Contains(out, vpptopo.PodInterface+" (up)") {
			missing := false
			for _, a := range []netip.Addr{n.pod.v4, n.pod.v6} {
				p := netip.PrefixFrom(a, a.BitLen()).String()
				if !strings.Contains(out, p) {
					missing = true
					if _, err := v.CLI(ctx, "set interface ip address "+vpptopo.PodInterface+" "+p); err != nil {
						return fmt.Errorf("%s: %w", n.name, err)
					}
				}
			}
			if !missing {
				return nil
			}
			continue // check that they are there now
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%s: %s is not up with the pod's addresses: %v %s", n.name, vpptopo.PodInterface, err, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// pingCheck is one pod-to-pod ping a step expects to answer (want) or not, and why.
type pingCheck struct {
	from, to *labNode
	ipv6     bool
	want     bool
	why      string
}

// expectedPings lists, for every ordered pair of nodes and both families, whether from's pod must reach
// to's pod now. A released node keeps its pod's addresses on its loopback, so only the withdrawn routes
// (to its block, and back to it) make its pings fail. IPv6 is routed flat, so it fails across the router.
func (l *lab) expectedPings() []pingCheck {
	var out []pingCheck
	for _, from := range l.nodes {
		for _, to := range l.nodes {
			if from == to {
				continue
			}
			same := from.addr4.Contains(to.addr4.Addr())
			for _, ipv6 := range []bool{false, true} {
				c := pingCheck{from: from, to: to, ipv6: ipv6, want: true}
				switch {
				case to.released:
					c.want, c.why = false, to.name+"'s blocks released: routes to them withdrawn"
				case from.released:
					c.want, c.why = false, from.name+"'s blocks released: no route back to its pod"
				case ipv6 && !same:
					c.want, c.why = false, "flat IPv6 route across the router (the IPv6 pool has no encapsulation)"
				case ipv6 || same:
					c.why = "flat, same subnet"
				default:
					c.why = "IPIP across the router (CrossSubnet)"
				}
				out = append(out, c)
			}
		}
	}
	return out
}

// Ping judgement, as in test/dataplane: a round is 3 echoes 0.1 s apart; a ping that must pass gets up
// to 5 rounds to see 2 replies in one (the first echoes of a new path are lost while ARP or ND resolves
// each hop); one that must fail is run after the FIBs converged, and one round must see no reply.
const (
	pingCount   = 3
	pingAtLeast = 2
	pingRounds  = 5
)

// checkPings runs the expected pings, each source node's in turn on its own VPP (the nodes in parallel),
// prints one PASS or FAIL line per ping and returns a summary, or an error naming the ping(s) that did
// not behave.
func (l *lab) checkPings(ctx context.Context) (string, error) {
	checks := l.expectedPings()
	lines := make([]string, len(checks))
	ok := make([]bool, len(checks))
	var wg sync.WaitGroup
	for _, from := range l.nodes {
		wg.Go(func() {
			for i, c := range checks {
				if c.from == from {
					lines[i], ok[i] = l.ping(ctx, c)
				}
			}
		})
	}
	wg.Wait()
	var failed []string
	for i, c := range checks {
		l.logf("  %s", lines[i])
		if !ok[i] {
			failed = append(failed, fmt.Sprintf("%s->%s %s", c.from.name, c.to.name, family(c.ipv6)))
		}
	}
	if len(failed) > 0 {
		return "", fmt.Errorf("%d of %d pings wrong: %s", len(failed), len(checks), strings.Join(failed, ", "))
	}
	must := 0
	for _, c := range checks {
		if c.want {
			must++
		}
	}
	return fmt.Sprintf("pings as expected: %d answered, %d did not", must, len(checks)-must), nil
}

// ping runs one check and returns its line and whether it behaved.
func (l *lab) ping(ctx context.Context, c pingCheck) (string, bool) {
	v := c.from.vpp.(*topoPlane).node.VPP
	dst := c.to.pod.addr(c.ipv6)
	rounds, atLeast, verb := pingRounds, pingAtLeast, "must answer"
	if !c.want {
		rounds, atLeast, verb = 1, 1, "must not answer"
	}
	results, answered, err := vpptopo.PingUntil(ctx, v, vpptopo.PodInterface, dst, pingCount, atLeast, rounds)
	got := make([]string, len(results))
	for i, r := range results {
		got[i] = r.String()
	}
	pass := err == nil && answered == c.want
	status := "FAIL"
	if pass {
		status = "PASS"
	}
	line := fmt.Sprintf("%s ping %s pod %s -> %s pod %s (%s) %s, %s: %s", status, c.from.name, c.from.pod.addr(c.ipv6),
		c.to.name, dst, family(c.ipv6), verb, c.why, strings.Join(got, " "))
	if err != nil {
		line += " error: " + err.Error()
	}
	return line, pass
}

func family(ipv6 bool) string {
	if ipv6 {
		return "IPv6"
	}
	return "IPv4"
}
