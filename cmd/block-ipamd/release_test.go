package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/cni/ipamd"
	"github.com/vpp-route-agent/vpp-route-agent/cni/release"
	"github.com/vpp-route-agent/vpp-route-agent/internal/calicotest"
	"github.com/vpp-route-agent/vpp-route-agent/internal/etcdtest"
)

// putNodeBlocks writes blocks first..first+n-1 of node (calicotest.Block: a tunnel address and two
// pods each), with the node's affinity keys and the allocations' handles.
func putNodeBlocks(t *testing.T, cli *clientv3.Client, node string, first, n int) {
	t.Helper()
	ctx := context.Background()
	for i := first; i < first+n; i++ {
		b := calicotest.Block(calicotest.BlockCIDR(i), node, i)
		if err := calicotest.PutBlock(ctx, cli, b); err != nil {
			t.Fatal(err)
		}
		a, _ := calico.EncodeAffinity(calico.AffinityValue{State: calico.AffinityConfirmed})
		if _, err := cli.Put(ctx, calico.HostAffinityKey(node, b.CIDR), string(a)); err != nil {
			t.Fatal(err)
		}
		for ord := range b.Allocations {
			if at := b.AttributeOf(ord); at != nil {
				h := calico.NewHandle()
				h.Add(b.CIDR, 1)
				v, _ := calico.EncodeHandle(h)
				if _, err := cli.Put(ctx, calico.HandleKey(at.Handle()), string(v)); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
}

func runRelease(t *testing.T, ep string, env map[string]string, args ...string) (string, string, error) {
	t.Helper()
	var out, errb bytes.Buffer
	if env == nil {
		env = map[string]string{}
	}
	env["ETCD_ENDPOINTS"] = ep
	err := releaseNodeCmd(t.Context(), args, &out, &errb, func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	return out.String(), errb.String(), err
}

// TestReleaseNodeCommand: the dry run lists the node's blocks, allocations, affinities and handles
// and writes nothing; an exported BLOCK_IPAM_FORCE does not force; --yes on a live node is refused
// naming the key; once dead, --yes releases, JSON names what, and a rerun finds nothing to release;
// an unknown node is a clear error and a bad one a usage error.
func TestReleaseNodeCommand(t *testing.T) {
	srv, cli := etcdtest.Start(t)
	putNodeBlocks(t, cli, "dead", 0, 2)
	putNodeBlocks(t, cli, "other", 2, 1)
	ep := srv.Endpoint()

	out, _, err := runRelease(t, ep, nil, "dead")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"dry run", "block 10.0.0.0/26 (host:dead): release 3, delete the block",
		"affinity /calico/ipam/v2/host/dead/ipv4/block/10.0.0.64-26 deleted", "release 10.0.0.1 default/web-0-0 node dead handle k8s-pod-network.",
		"handle vxlan-tunnel-addr-dead: deleted (2 addresses)", "summary: 6 addresses, 2 blocks"} {
		if !strings.Contains(out, want) {
			t.Errorf("dry run does not say %q:\n%s", want, out)
		}
	}
	if n := count(t, cli, calico.HostAffinityNodePrefix("dead")); n != 2 {
		t.Fatalf("the dry run wrote: %d affinities left", n)
	}

	if _, err := cli.Put(t.Context(), ipamd.AliveKey("dead"), "x"); err != nil {
		t.Fatal(err)
	}
	_, _, err = runRelease(t, ep, map[string]string{"BLOCK_IPAM_FORCE": "true"}, "--yes", "dead")
	if err == nil || !strings.Contains(err.Error(), ipamd.AliveKey("dead")+" (no lease)") || !strings.Contains(err.Error(), "--force") {
		t.Fatalf("live node: %v", err)
	}
	cli.Delete(t.Context(), ipamd.AliveKey("dead"))

	out, _, err = runRelease(t, ep, nil, "--yes", "--output", "json", "dead")
	if err != nil {
		t.Fatal(err)
	}
	var res release.Result
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	if len(res.Released) != 6 || len(res.BlocksDeleted) != 2 || len(res.AffinitiesDeleted) != 2 || len(res.HandlesDeleted) != 5 {
		t.Fatalf("result %+v", res)
	}
	if count(t, cli, calico.BlockPrefix) != 1 || count(t, cli, calico.HandlePrefix) != 3 || count(t, cli, release.RecordPrefix+"dead/") != 1 {
		t.Fatal("not released as reported, or other's touched, or no record")
	}
	out, _, err = runRelease(t, ep, nil, "--yes", "dead")
	if err != nil || !strings.Contains(out, "nothing to release (last release recorded at "+release.RecordPrefix+"dead/") {
		t.Fatalf("rerun: %v\n%s", err, out)
	}

	_, _, err = runRelease(t, ep, nil, "nobody")
	if err == nil || !strings.Contains(err.Error(), `node "nobody": unknown node`) {
		t.Fatalf("unknown node: %v", err)
	}
	_, _, err = runRelease(t, ep, nil, "a/b")
	if _, ok := err.(usageError); !ok {
		t.Fatalf("bad name: %v", err)
	}
	_, _, err = runRelease(t, ep, nil)
	if _, ok := err.(usageError); !ok {
		t.Fatalf("no name: %v", err)
	}
}

func count(t *testing.T, cli *clientv3.Client, prefix string) int64 {
	t.Helper()
	resp, err := cli.Get(t.Context(), prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return resp.Count
}
