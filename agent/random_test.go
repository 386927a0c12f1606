package agent_test

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/test/vppsim"
)

// TestRandomizedConvergence plays a long random sequence of block and host puts and deletes, agent
// restarts, VPP restarts and etcd compactions against three nodes; after quiescence every node's owned
// routes must equal the desired set exactly, and the foreign routes must be untouched.
// RANDOM_SEED reproduces a run; RANDOM_STEPS lengthens it.
func TestRandomizedConvergence(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s, err := strconv.ParseUint(os.Getenv("RANDOM_SEED"), 10, 64); err == nil {
		seed = s
	}
	steps := 300
	if s, err := strconv.Atoi(os.Getenv("RANDOM_STEPS")); err == nil {
		steps = s
	}
	t.Logf("RANDOM_SEED=%d RANDOM_STEPS=%d", seed, steps)
	rng := rand.New(rand.NewPCG(seed, seed^0x5eed))

	c := newCluster(t, clusterOpts{grace: 100 * time.Millisecond}, "a", "b", "c")
	foreign := map[string]vppsim.Route{}
	for name, n := range c.nodes {
		r := vppsim.Route{Prefix: netip.MustParsePrefix("10.244.250.0/24"), Paths: []vppsim.Path{{Type: "drop"}}}
		if err := n.sim.AddRoute(r); err != nil {
			t.Fatal(err)
		}
		foreign[name] = r
	}
	nodes := []string{"a", "b", "c", "x", "y"} // x and y are nodes without agents, registered by the test
	peerOf := map[string]string{"x": "192.168.100.50", "y": "192.168.100.51"}
	var cidrs []string
	for i := 0; i < 24; i++ {
		cidrs = append(cidrs, fmt.Sprintf("10.244.%d.%d/26", i/4, (i%4)*64))
	}
	for i := 0; i < 6; i++ {
		cidrs = append(cidrs, fmt.Sprintf("fd00:10:244::%x/122", i*64))
	}
	for step := 0; step < steps; step++ {
		switch k := rng.IntN(100); {
		case k < 50:
			cidr := cidrs[rng.IntN(len(cidrs))]
			pods := map[int]string{}
			for j := rng.IntN(3); j > 0; j-- {
				pods[rng.IntN(64)] = nodes[rng.IntN(len(nodes))]
			}
			owner := nodes[rng.IntN(len(nodes))]
			if rng.IntN(10) == 0 {
				owner = "" // ownerless block: only its borrowed addresses are routed
			}
			c.putBlock(cidr, owner, pods)
		case k < 70:
			c.del(calico.BlockKey(netip.MustParsePrefix(cidrs[rng.IntN(len(cidrs))])))
		case k < 82:
			n := []string{"x", "y"}[rng.IntN(2)]
			if rng.IntN(2) == 0 {
				c.put(hosts+n+"/peerip/ipv4/1", peerOf[n])
			} else {
				c.del(hosts + n + "/peerip/ipv4/1")
			}
		case k < 88:
			n := []string{"a", "b", "c"}[rng.IntN(3)]
			c.stop(n)
			if rng.IntN(2) == 0 {
				time.Sleep(time.Duration(rng.IntN(50)) * time.Millisecond)
			}
			c.start(n)
		case k < 94:
			n := []string{"a", "b", "c"}[rng.IntN(3)]
			if err := c.nodes[n].sim.Restart(); err != nil {
				t.Fatal(err)
			}
			// Another API client puts its route back after the restart; the agent must leave it alone.
			if err := c.nodes[n].sim.AddRoute(foreign[n]); err != nil {
				t.Fatal(err)
			}
		default:
			if _, err := c.etcd.Compact(c.ctx()); err != nil {
				t.Fatal(err)
			}
		}
		if rng.IntN(8) == 0 {
			time.Sleep(time.Duration(rng.IntN(30)) * time.Millisecond)
		}
	}
	c.converged(30 * time.Second)
	for name, n := range c.nodes {
		found := false
		for _, r := range n.sim.APIRoutes(0) {
			if r.Prefix == foreign[name].Prefix && len(r.Paths) == 1 && r.Paths[0].Type == "drop" {
				found = true
			}
		}
		if !found {
			t.Errorf("node %s: the foreign route %s was touched", name, foreign[name].Prefix)
		}
	}
}
