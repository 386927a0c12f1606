package e2e

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/internal/calicotest"
	"github.com/vpp-route-agent/vpp-route-agent/internal/vpptest"
)

// strictCluster writes what Calico writes with strict affinity on: the IPAM config, the pool, the
// peers, blocks owned round-robin by the remote nodes with their confirmed affinities, a claim in
// progress (a pending affinity, no block yet) and an empty block without affinity.
func strictCluster(c *cluster, nodes, blocks int) []netip.Prefix {
	c.t.Helper()
	c.putIPAMConfig(true)
	cidrs := remoteCluster(c, nodes, blocks)
	for i, cidr := range cidrs {
		c.putAffinity(remoteNode(i%nodes), cidr, calico.AffinityConfirmed)
	}
	c.putAffinity(remoteNode(0), calicotest.BlockCIDR(blocks), calico.AffinityPending)
	if err := calicotest.PutBlock(c.ctx(), c.cli, calico.NewBlock(calicotest.BlockCIDR(blocks+1), "", 1)); err != nil {
		c.t.Fatal(err)
	}
	return cidrs
}

func (c *cluster) putIPAMConfig(strict bool) {
	c.t.Helper()
	v, err := calico.EncodeIPAMConfig(calico.IPAMConfig{StrictAffinity: strict, AutoAllocateBlocks: true})
	if err != nil {
		c.t.Fatal(err)
	}
	c.put(calico.IPAMConfigKey, string(v))
}

func (c *cluster) putAffinity(node string, cidr netip.Prefix, state string) {
	c.t.Helper()
	v, err := calico.EncodeAffinity(calico.AffinityValue{State: state})
	if err != nil {
		c.t.Fatal(err)
	}
	c.put(calico.HostAffinityKey(node, cidr), string(v))
}

// routesJSON runs `vpp-route-agent routes --output json` for node-self with the given ownership and
// returns its resolved routes (prefix -> next hop), its whole output and its stderr.
func routesJSON(t *testing.T, c *cluster, ownership string) (map[netip.Prefix]netip.Addr, string, string) {
	t.Helper()
	stdout, stderr, code, _ := run(t, nil, "routes", "--etcd-endpoints", c.etcd.Endpoint(), "--nodename", "node-self",
		"--ownership", ownership, "--output", "json")
	var got []struct {
		Prefix  netip.Prefix `json:"prefix"`
		NextHop *netip.Addr  `json:"next_hop"`
	}
	if err := json.Unmarshal([]byte(stdout), &got); code != 0 || err != nil {
		t.Fatalf("routes --ownership %s: exit %d, %v\n%s\nstderr: %s", ownership, code, err, stdout, stderr)
	}
	out := map[netip.Prefix]netip.Addr{}
	for _, r := range got {
		if r.NextHop != nil {
			out[r.Prefix] = *r.NextHop
		}
	}
	return out, stdout, stderr
}

// waitFIB waits until VPP's API routes in the pool are want.
func waitFIB(t *testing.T, v *vpptest.VPP, want map[netip.Prefix]netip.Addr, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for vppFIB(v, want) != "" {
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %s", within, vppFIB(v, want))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestOwnershipModesAgree: on the same data (strict affinity on, nothing borrowed) the agent's FIB
// and `vpp-route-agent routes` agree, and are the same, whether ownership is read from the blocks,
// the affinities or auto. Then strict affinity goes off and a block lends an address to another
// node: the auto agent relists from the blocks and routes the borrowed address, as `routes
// --ownership auto` does; the affinities agent keeps its routes and reports not ready, saying why;
// the blocks agent had the borrowed route all along.
func TestOwnershipModesAgree(t *testing.T) {
	c := newCluster(t)
	const nodes = 3
	blocks := strictCluster(c, nodes, 8)
	want := wantRoutes(blocks, nodes)

	modes := []string{"blocks", "affinities", "auto"}
	vpps := map[string]*vpptest.VPP{}
	agents := map[string]*agent{}
	var firstJSON string
	for i, mode := range modes {
		v := vpptest.New(t, vpptest.Options{})
		self := netip.PrefixFrom(netip.AddrFrom4([4]byte{192, 168, 100, byte(1 + i)}), 16)
		a := startAgent(t, agentConfig{node: fmt.Sprintf("node-self-%s", mode), etcd: c.etcd.Endpoint(), socket: v.Socket(),
			uplink: self, uplinkIf: v.Uplink(), extra: []string{"--ownership", mode}})
		a.waitReady(20 * time.Second)
		waitFIB(t, v, want, 10*time.Second)
		routes, out, stderr := routesJSON(t, c, mode)
		if fib := v.APIRoutes(pool); !maps.Equal(routes, fib) {
			t.Errorf("--ownership %s: routes says %v, the agent's FIB holds %v", mode, routes, fib)
		}
		if stderr != "" {
			t.Errorf("--ownership %s: routes wrote to stderr: %s", mode, stderr)
		}
		if firstJSON == "" {
			firstJSON = out
		} else if out != firstJSON {
			t.Errorf("routes --ownership %s differs from --ownership %s:\n%s\n%s", mode, modes[0], out, firstJSON)
		}
		vpps[mode], agents[mode] = v, a
	}
	if v := agents["auto"].metrics().value(t, "vpp_route_agent_ownership_source", "source", "affinities"); v != 1 {
		t.Errorf("auto agent with strict affinity on: ownership_source{source=affinities} %v", v)
	}

	// Strict affinity off, and node-001 borrows an address of node-000's first block.
	c.putIPAMConfig(false)
	b := calicotest.Block(blocks[0], remoteNode(0), 0)
	ord := calicotest.Allocate(b, "k8s-pod-network.borrowed", calicotest.PodAttrs(remoteNode(1), "default", "borrowed", time.Now()))
	if err := calicotest.PutBlock(c.ctx(), c.cli, b); err != nil {
		t.Fatal(err)
	}
	addr, err := calico.OrdinalAddr(blocks[0], ord)
	if err != nil {
		t.Fatal(err)
	}
	borrowed := calico.HostPrefix(addr)
	withBorrowed := maps.Clone(want)
	withBorrowed[borrowed] = remotePeer(1)

	waitFIB(t, vpps["blocks"], withBorrowed, 10*time.Second)
	// The auto agent relists from the blocks within its relist spread (5 s for a few nodes).
	waitFIB(t, vpps["auto"], withBorrowed, 20*time.Second)
	if routes, _, _ := routesJSON(t, c, "auto"); !maps.Equal(routes, withBorrowed) {
		t.Errorf("routes --ownership auto with strict affinity off: %v, want %v", routes, withBorrowed)
	}
	if v := agents["auto"].metrics().value(t, "vpp_route_agent_etcd_relists_total", "reason", "ownership-changed"); v != 1 {
		t.Errorf("auto agent: %v ownership relists, want 1", v)
	}
	agents["auto"].waitReady(10 * time.Second)

	// The affinities agent keeps the block routes, says why it is not ready; routes warns likewise.
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, body := agents["affinities"].get("/readyz")
		if code != 200 && strings.Contains(body, "strict affinity is off") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("affinities agent with strict affinity off: /readyz %d %s", code, body)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if msg := vppFIB(vpps["affinities"], want); msg != "" {
		t.Errorf("affinities agent with strict affinity off: %s", msg)
	}
	routes, _, stderr := routesJSON(t, c, "affinities")
	if !maps.Equal(routes, want) || !strings.Contains(stderr, "strict affinity is off") {
		t.Errorf("routes --ownership affinities with strict affinity off: %v, stderr %q", routes, stderr)
	}

	// Strict affinity on again (the borrowed address released first, as strict affinity requires):
	// every agent agrees again, the affinities agent is ready.
	c.putIPAMConfig(true)
	if err := calicotest.PutBlock(c.ctx(), c.cli, calicotest.Block(blocks[0], remoteNode(0), 0)); err != nil {
		t.Fatal(err)
	}
	agents["affinities"].waitReady(10 * time.Second)
	for _, mode := range modes {
		waitFIB(t, vpps[mode], want, 20*time.Second)
	}
}
