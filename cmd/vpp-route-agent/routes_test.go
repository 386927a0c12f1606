package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/blockwatch"
	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/internal/calicotest"
	"github.com/vpp-route-agent/vpp-route-agent/internal/etcdtest"
	"github.com/vpp-route-agent/vpp-route-agent/internal/netaddr"
)

// TestRoutesListsHeldBlocksAndRefusedPeers: the routes subcommand names a block whose value cannot be
// read (held, with the reason) and a peer IP that cannot be a next hop (with the node), in both
// output formats.
func TestRoutesListsHeldBlocksAndRefusedPeers(t *testing.T) {
	srv, cli := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := calicotest.PutPool(ctx, cli, calico.IPPool{Name: "p", CIDR: netip.MustParsePrefix("10.244.0.0/16"), BlockSize: 26}); err != nil {
		t.Fatal(err)
	}
	if err := calicotest.PutPeer(ctx, cli, "/vpp-calico/hosts/", "node-b", netip.MustParseAddr("127.0.0.1")); err != nil {
		t.Fatal(err)
	}
	v, _ := calico.EncodeBlock(calicotest.Block(netip.MustParsePrefix("10.244.1.0/26"), "node-b", 1))
	if _, err := cli.Put(ctx, calico.BlockKey(netip.MustParsePrefix("10.244.1.0/26")), string(v)); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, calico.BlockKey(netip.MustParsePrefix("10.244.2.0/26")), `{"cidr":"10.244.2.0/26",`); err != nil {
		t.Fatal(err)
	}
	args := []string{"routes", "--etcd-endpoints", srv.Endpoint(), "--nodename", "node-a"}
	var out bytes.Buffer
	if err := run(ctx, args, &out, &bytes.Buffer{}, env(nil)); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"held 10.244.2.0/26: value unreadable (decode block",
		`invalid peer IP 127.0.0.1 of node node-b: a loopback address`,
		`unresolved 10.244.1.0/26 owner node-b: node "node-b" registered 127.0.0.1 as its IPv4 peer IP, which is refused`,
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("routes output lacks %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	if err := run(ctx, append(args, "--output", "json"), &out, &bytes.Buffer{}, env(nil)); err != nil {
		t.Fatal(err)
	}
	var rows []map[string]any
	if err := json.Unmarshal(out.Bytes(), &rows); err != nil {
		t.Fatal(err)
	}
	held := false
	for _, r := range rows {
		if r["kind"] == "held" && r["prefix"] == "10.244.2.0/26" && strings.Contains(r["held"].(string), "decode block") {
			held = true
		}
	}
	if !held {
		t.Errorf("json output has no held row:\n%s", out.String())
	}
}

// TestRoutesShowEncap: the routes subcommand shows each route's encapsulation: with a CrossSubnet IPIP
// pool, a peer in this node's subnet (read from its Calico Node resource: the subcommand has no uplink
// address) gets a flat route, one in another subnet an IPIP route; the IPv6 pool stays flat.
func TestRoutesShowEncap(t *testing.T) {
	srv, cli := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := calicotest.PutPool(ctx, cli, calico.IPPool{Name: "p", CIDR: netip.MustParsePrefix("10.244.0.0/16"), BlockSize: 26,
		IPIPMode: calico.EncapCrossSubnet}); err != nil {
		t.Fatal(err)
	}
	node := `{"kind":"Node","apiVersion":"projectcalico.org/v3","metadata":{"name":"node-a"},"spec":{"bgp":{"ipv4Address":"192.0.2.1/24"}}}`
	if _, err := cli.Put(ctx, calico.NodeKey("node-a"), node); err != nil {
		t.Fatal(err)
	}
	for node, ip := range map[string]string{"node-b": "192.0.2.2", "node-c": "198.51.100.3"} {
		if err := calicotest.PutPeer(ctx, cli, "/vpp-calico/hosts/", node, netip.MustParseAddr(ip)); err != nil {
			t.Fatal(err)
		}
	}
	for cidr, owner := range map[string]string{"10.244.1.0/26": "node-b", "10.244.2.0/26": "node-c"} {
		v, _ := calico.EncodeBlock(calicotest.Block(netip.MustParsePrefix(cidr), owner, 1))
		if _, err := cli.Put(ctx, calico.BlockKey(netip.MustParsePrefix(cidr)), string(v)); err != nil {
			t.Fatal(err)
		}
	}
	// node-b runs --bfd: its peer IP's advertisement shows beside its route.
	if _, err := cli.Put(ctx, blockwatch.PeerBFDKeyAt("/vpp-calico/hosts/", "node-b", netaddr.V4, 1), "192.0.2.2"); err != nil {
		t.Fatal(err)
	}
	args := []string{"routes", "--etcd-endpoints", srv.Endpoint(), "--nodename", "node-a"}
	var out bytes.Buffer
	if err := run(ctx, args, &out, &bytes.Buffer{}, env(nil)); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"10.244.1.0/26 via 192.0.2.2 owner node-b encap none bfd 192.0.2.2\n",
		"10.244.2.0/26 via 198.51.100.3 owner node-c encap ipip\n",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("routes output lacks %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	if err := run(ctx, append(args, "--output", "json"), &out, &bytes.Buffer{}, env(nil)); err != nil {
		t.Fatal(err)
	}
	var rows []map[string]any
	if err := json.Unmarshal(out.Bytes(), &rows); err != nil {
		t.Fatal(err)
	}
	got := map[any]any{}
	for _, r := range rows {
		got[r["prefix"]] = r["encap"]
		if r["prefix"] == "10.244.1.0/26" && fmt.Sprint(r["bfd_peer_ips"]) != "[192.0.2.2]" {
			t.Errorf("json bfd_peer_ips of node-b's route: %v", r["bfd_peer_ips"])
		}
	}
	if got["10.244.1.0/26"] != "none" || got["10.244.2.0/26"] != "ipip" {
		t.Errorf("json encap by prefix %v, want none and ipip:\n%s", got, out.String())
	}
}

// TestRoutesShowMoreNextHops: a node registered with two peer IPs (two uplinks, /1 and /2) shows both
// in the routes subcommand's text and JSON output.
func TestRoutesShowMoreNextHops(t *testing.T) {
	srv, cli := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := calicotest.PutPool(ctx, cli, calico.IPPool{Name: "p", CIDR: netip.MustParsePrefix("10.244.0.0/16"), BlockSize: 26}); err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{"/vpp-calico/hosts/node-b/peerip/ipv4/1": "192.0.2.2", "/vpp-calico/hosts/node-b/peerip/ipv4/2": "198.51.100.2"} {
		if _, err := cli.Put(ctx, k, v); err != nil {
			t.Fatal(err)
		}
	}
	v, _ := calico.EncodeBlock(calicotest.Block(netip.MustParsePrefix("10.244.1.0/26"), "node-b", 1))
	if _, err := cli.Put(ctx, calico.BlockKey(netip.MustParsePrefix("10.244.1.0/26")), string(v)); err != nil {
		t.Fatal(err)
	}
	args := []string{"routes", "--etcd-endpoints", srv.Endpoint(), "--nodename", "node-a"}
	var out bytes.Buffer
	if err := run(ctx, args, &out, &bytes.Buffer{}, env(nil)); err != nil {
		t.Fatal(err)
	}
	if want := "10.244.1.0/26 via 192.0.2.2 also via 198.51.100.2 owner node-b"; !strings.Contains(out.String(), want) {
		t.Errorf("routes output lacks %q:\n%s", want, out.String())
	}
	out.Reset()
	if err := run(ctx, append(args, "--output", "json"), &out, &bytes.Buffer{}, env(nil)); err != nil {
		t.Fatal(err)
	}
	if want := `"more_next_hops": [`; !strings.Contains(out.String(), want) && !strings.Contains(out.String(), `"more_next_hops":[`) {
		t.Errorf("json output lacks more_next_hops:\n%s", out.String())
	}
}
