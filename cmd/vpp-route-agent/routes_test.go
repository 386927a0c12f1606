package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/internal/calicotest"
	"github.com/vpp-route-agent/vpp-route-agent/internal/etcdtest"
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
