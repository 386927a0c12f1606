package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/cni"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// scenario plays the lab's steps and returns the number that failed. Every step ends with a check of
// every node's FIB against the desired state computed from etcd.
func (l *lab) scenario(ctx context.Context) int {
	first, last := l.nodes[0], l.nodes[len(l.nodes)-1]
	// The node whose agent is stopped must still own blocks: not the one whose blocks are released.
	second := l.nodes[1]
	if second == last {
		second = first
	}
	// Enough pods to overflow the lab's /28 IPv4 blocks whatever --pods is.
	scaleUp := max(3*l.o.pods, 1<<(32-l.poolV4.BlockSize))

	l.step(ctx, fmt.Sprintf("start %d agents and wait for /readyz", len(l.nodes)), func() (string, error) {
		for _, n := range l.nodes {
			if err := l.startAgent(n); err != nil {
				return "", err
			}
		}
		return "", l.waitReady(ctx, l.nodes...)
	})

	l.step(ctx, fmt.Sprintf("place %d pods on every node with block-ipam", l.o.pods), func() (string, error) {
		for _, n := range l.nodes {
			if err := l.addPods(ctx, n, l.o.pods); err != nil {
				return "", err
			}
			if l.topo != nil {
				if err := l.placePod(ctx, n); err != nil {
					return "", err
				}
			}
		}
		return l.blockCounts(ctx)
	})

	l.step(ctx, fmt.Sprintf("scale up: %d more pods on %s (new blocks)", scaleUp, first.name), func() (string, error) {
		before, err := l.ownedBlocks(ctx, first)
		if err != nil {
			return "", err
		}
		if err := l.addPods(ctx, first, scaleUp); err != nil {
			return "", err
		}
		after, err := l.ownedBlocks(ctx, first)
		if err != nil {
			return "", err
		}
		if after <= before {
			return "", fmt.Errorf("%s claimed no new block (%d before, %d after)", first.name, before, after)
		}
		return fmt.Sprintf("%s blocks %d -> %d", first.name, before, after), nil
	})

	l.step(ctx, fmt.Sprintf("delete %s's pods and release its blocks (routes withdrawn)", last.name), func() (string, error) {
		if err := l.delPods(ctx, last); err != nil {
			return "", err
		}
		n, err := l.releaseBlocks(ctx, last)
		if err != nil {
			return "", err
		}
		// The pod's addresses stay on last's loopback (wired lab): only the withdrawn routes stop its pings.
		last.released = true
		return fmt.Sprintf("%d blocks released", n), nil
	})

	l.step(ctx, fmt.Sprintf("restart %s's VPP (routes restored)", first.name), func() (string, error) {
		oldPID := first.vpp.pid()
		if err := first.vpp.restart(ctx); err != nil {
			return "", err
		}
		if l.topo != nil { // a restarted VPP lost the pod's addresses, as it would its pods' interfaces
			if err := l.placePod(ctx, first); err != nil {
				return "", err
			}
		}
		return fmt.Sprintf("vpe pid %d -> %d", oldPID, first.vpp.pid()), nil
	})

	l.step(ctx, fmt.Sprintf("stop %s's agent (no withdrawal elsewhere)", second.name), func() (string, error) {
		before := l.routesTo(second)
		l.stopAgent(second)
		time.Sleep(2 * time.Second) // time for any wrong withdrawal to show
		if after := l.routesTo(second); after != before || before == 0 {
			return "", fmt.Errorf("routes to %s on the other nodes: %d before the stop, %d after", second.name, before, after)
		}
		return fmt.Sprintf("%d routes to %s kept on the other nodes", before, second.name), nil
	})

	l.step(ctx, fmt.Sprintf("restart %s's agent", second.name), func() (string, error) {
		if err := l.startAgent(second); err != nil {
			return "", err
		}
		return "", l.waitReady(ctx, second)
	})

	if l.o.exhaustPool {
		l.exhaustPool(ctx, first)
	}

	failed := 0
	for _, s := range l.steps {
		if !s.pass {
			failed++
		}
	}
	return failed
}

// exhaustPool places pods on n until block-ipam refuses one because the IPv4 pool is full (borrowing
// from other nodes' blocks at the end); then, with Prometheus, waits for the pool's critical alert.
func (l *lab) exhaustPool(ctx context.Context, n *labNode) {
	pool := l.poolV4
	l.step(ctx, fmt.Sprintf("exhaust %s (%s): pods on %s until refused", pool.Name, pool.CIDR, n.name), func() (string, error) {
		free, err := l.poolFree(ctx, pool.CIDR)
		if err != nil {
			return "", err
		}
		// As many pods as the pool has free addresses must be placed (borrowing from other nodes' blocks
		// at the end), the next refused.
		if free > 0 {
			if err := l.addPods(ctx, n, free); err != nil {
				return "", fmt.Errorf("%d pods for the pool's %d free addresses: %w", free, free, err)
			}
		}
		err = l.addPods(ctx, n, 1)
		var cniErr *types.Error
		if err == nil || !errors.As(err, &cniErr) || cniErr.Code != cni.ErrPoolExhausted {
			return "", fmt.Errorf("%d more pods fill the pool; one more: %v, want a pool-exhausted error (CNI code %d)", free, err, cni.ErrPoolExhausted)
		}
		return fmt.Sprintf("%d more pods, one more refused: %s", free, cniErr.Msg), nil
	})
	if l.prom == nil {
		return
	}
	// Each gauge is read every promInterval, scraped and evaluated as often: seconds, not settle's.
	l.step(ctx, fmt.Sprintf("Prometheus: BlockIPAMPoolUsageCritical active for %s", pool.Name), func() (string, error) {
		wait := max(l.o.settle, 30*time.Second)
		deadline := time.Now().Add(wait)
		for {
			alerts, err := l.prom.alerts(ctx)
			if err == nil {
				for _, a := range alerts {
					if a.Labels["alertname"] == "BlockIPAMPoolUsageCritical" && a.Labels["pool"] == pool.Name {
						return fmt.Sprintf("%s: %s", a.State, a.Annotations["summary"]), nil
					}
				}
			}
			if ctx.Err() != nil {
				return "", ctx.Err()
			}
			if time.Now().After(deadline) {
				return "", fmt.Errorf("not active within %s (last read: error %v, alerts %v)", wait, err, alerts)
			}
			time.Sleep(250 * time.Millisecond)
		}
	})
}

// poolFree counts the addresses of the pool at cidr that no allocation holds, from etcd: the pool's size
// less what its blocks hold (the lab reserves none).
func (l *lab) poolFree(ctx context.Context, cidr netip.Prefix) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := l.cli.Get(ctx, calico.BlockPrefix, clientv3.WithPrefix())
	if err != nil {
		return 0, fmt.Errorf("list blocks: %w", err)
	}
	free := calico.Size(cidr)
	for _, kv := range resp.Kvs {
		b, err := calico.DecodeBlock(kv.Value)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", kv.Key, err)
		}
		if cidr.Overlaps(b.CIDR) {
			free -= b.Allocated()
		}
	}
	return free, nil
}

// step runs action, then waits for convergence, and records PASS or FAIL with the convergence time. On
// the wired lab, once every node has its ping pod, it then pings pod to pod (checkPings): a ping that
// does not behave fails the step.
func (l *lab) step(ctx context.Context, name string, action func() (string, error)) {
	if ctx.Err() != nil {
		l.steps = append(l.steps, stepResult{name: name, detail: "interrupted"})
		return
	}
	l.logf("STEP %s", name)
	detail, err := action()
	done := time.Now()
	res := stepResult{name: name, detail: detail}
	if err == nil {
		res.took, err = l.converge(ctx, done)
	}
	if err == nil && l.podsPlaced() {
		var pings string
		pings, err = l.checkPings(ctx)
		res.detail = strings.TrimSpace(res.detail + " " + pings)
	}
	if err != nil {
		res.detail = strings.TrimSpace(res.detail + " " + err.Error())
		l.logf("FAIL %s: %s", name, res.detail)
	} else {
		res.pass = true
		l.logf("PASS %s: FIBs converged %s after the step%s", name, res.took.Round(time.Millisecond), suffix(detail))
	}
	l.steps = append(l.steps, res)
}

// podsPlaced says whether the lab is wired and every node has its ping pod.
func (l *lab) podsPlaced() bool {
	if l.topo == nil {
		return false
	}
	for _, n := range l.nodes {
		if !n.pod.v4.IsValid() {
			return false
		}
	}
	return true
}

func suffix(s string) string {
	if s == "" {
		return ""
	}
	return " (" + s + ")"
}

func (l *lab) ownedBlocks(ctx context.Context, n *labNode) (int, error) {
	snap, err := l.snapshot(ctx)
	if err != nil {
		return 0, err
	}
	c := 0
	for _, b := range snap.Blocks.All() {
		if b.Owner.Node == n.name {
			c++
		}
	}
	return c, nil
}

func (l *lab) blockCounts(ctx context.Context) (string, error) {
	var parts []string
	for _, n := range l.nodes {
		c, err := l.ownedBlocks(ctx, n)
		if err != nil {
			return "", err
		}
		parts = append(parts, fmt.Sprintf("%s: %d blocks", n.name, c))
	}
	return strings.Join(parts, ", "), nil
}

// routesTo counts the routes on other nodes towards one of n's peer IPs, flat or through an IPIP tunnel.
func (l *lab) routesTo(n *labNode) int {
	c := 0
	for _, o := range l.nodes {
		if o == n {
			continue
		}
		for _, r := range l.fib(o) {
			if strings.HasSuffix(r, " "+n.addr4.Addr().String()) || strings.HasSuffix(r, " "+n.addr6.Addr().String()) {
				c++
			}
		}
	}
	return c
}

// summary prints per node its blocks, peer IPs and FIB, then the steps.
func (l *lab) summary() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	fmt.Fprintln(l.out, "\n== Nodes")
	snap, err := l.snapshot(ctx)
	if err != nil {
		fmt.Fprintf(l.out, "cannot list etcd: %v\n", err)
		return
	}
	for _, n := range l.nodes {
		var blocks []netip.Prefix
		for cidr, b := range snap.Blocks.All() {
			if b.Owner.Node == n.name {
				blocks = append(blocks, cidr)
			}
		}
		slices.SortFunc(blocks, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
		fmt.Fprintf(l.out, "%s  peer %s, %s  metrics http://%s/metrics (agent) http://%s/metrics (block-ipamd)  log %s\n",
			n.name, n.addr4, n.addr6, n.metrics, n.ipamMetrics, n.logPath)
		fmt.Fprintf(l.out, "  blocks (%d): %s\n", len(blocks), joinPrefixes(blocks))
		routes := l.fib(n)
		fmt.Fprintf(l.out, "  FIB table 0, routes to other nodes' blocks (%d):\n", len(routes))
		for _, r := range routes {
			fmt.Fprintf(l.out, "    %s\n", r)
		}
	}
	fmt.Fprintln(l.out, "\n== Steps")
	passed := 0
	for _, s := range l.steps {
		status := "FAIL"
		if s.pass {
			status = "PASS"
			passed++
		}
		took := "-"
		if s.pass {
			took = s.took.Round(time.Millisecond).String()
		}
		fmt.Fprintf(l.out, "%s  %-62s converged in %-8s %s\n", status, s.name, took, s.detail)
	}
	l.printAlerts(ctx)
	fmt.Fprintf(l.out, "\n%d passed, %d failed\n", passed, len(l.steps)-passed)
	if l.topo == nil {
		fmt.Fprintln(l.out, "FIBs only: pod-to-pod pings need the lab build (memif and ping plugins): make lab LAB_ARGS=--vpp=/opt/vpp-v26.06-lab")
	}
}

// printAlerts lists the alerts active in the lab's Prometheus, if it runs one.
func (l *lab) printAlerts(ctx context.Context) {
	if l.prom == nil {
		return
	}
	fmt.Fprintf(l.out, "\n== Prometheus alerts (%s/alerts)\n", l.prom.ui)
	alerts, err := l.prom.alerts(ctx)
	if err != nil {
		fmt.Fprintf(l.out, "cannot read them: %v\n", err)
		return
	}
	if len(alerts) == 0 {
		fmt.Fprintln(l.out, "none pending or firing")
	}
	for _, a := range alerts {
		fmt.Fprintf(l.out, "%-8s %s  %s\n", a.State, a.name(), a.Annotations["summary"])
	}
}

func joinPrefixes(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, " ")
}

// printHowTo tells how to look at the running lab.
func (l *lab) printHowTo() {
	ep := l.etcd.Endpoint()
	fmt.Fprintf(l.out, "\n== The lab keeps running (Ctrl-C stops it)\n")
	fmt.Fprintf(l.out, "etcd:     ETCDCTL_API=3 etcdctl --endpoints=%s get --prefix /calico/ipam/v2/ --keys-only\n", ep)
	fmt.Fprintf(l.out, "          ETCDCTL_API=3 etcdctl --endpoints=%s get --prefix /vpp-calico/hosts/\n", ep)
	fmt.Fprintf(l.out, "routes:   %s/vpp-route-agent routes --etcd-endpoints %s --nodename %s\n", l.o.binDir, ep, l.nodes[0].name)
	if l.topo != nil {
		fmt.Fprintf(l.out, "router:   %s show ip fib\n", l.topo.Switch.CtlCommand())
		fmt.Fprintf(l.out, "ping:     %s ping %s source %s\n", l.nodes[0].vpp.ctl(), l.nodes[1].pod.v4, "loop1")
	}
	if l.prom != nil {
		fmt.Fprintf(l.out, "prometheus: %s/alerts  %s/targets  %s/graph (data in %s)\n", l.prom.ui, l.prom.ui, l.prom.ui, l.prom.dir)
	}
	for _, n := range l.nodes {
		fmt.Fprintf(l.out, "%s:   http://%s/debug/routes  http://%s/readyz  http://%s/metrics  block-ipamd http://%s/metrics\n",
			n.name, n.metrics, n.metrics, n.metrics, n.ipamMetrics)
		if ctl := n.vpp.ctl(); ctl != "" {
			fmt.Fprintf(l.out, "%s:   %s show ip fib\n", n.name, ctl)
		}
	}
}
