package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/internal/calicotest"
	"github.com/vpp-route-agent/vpp-route-agent/internal/etcdtest"
)

// TestRoutesReadsWhatBlockIPAMWrites allocates pods with the real block-ipam binaries (the plugin
// through libcni, one block-ipamd per node) on two nodes of a two-block pool, so that node-a fills its block and borrows an address from node-b's,
// then checks that `routes` for a third node routes both blocks and the borrowed /32.
func TestRoutesReadsWhatBlockIPAMWrites(t *testing.T) {
	if testing.Short() {
		t.Skip("builds block-ipam")
	}
	binDir := t.TempDir()
	if out, err := exec.Command("go", "build", "-o", binDir+"/", "../block-ipam", "../block-ipamd").CombinedOutput(); err != nil {
		t.Fatalf("build block-ipam: %v\n%s", err, out)
	}
	srv, cli := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pool := calico.IPPool{Name: "tiny", CIDR: netip.MustParsePrefix("10.244.0.0/27"), BlockSize: 28}
	if err := calicotest.PutPool(ctx, cli, pool); err != nil {
		t.Fatal(err)
	}
	for node, ip := range map[string]string{"node-a": "192.0.2.1", "node-b": "192.0.2.2"} {
		if err := calicotest.PutPeer(ctx, cli, "/vpp-calico/hosts/", node, netip.MustParseAddr(ip)); err != nil {
			t.Fatal(err)
		}
	}
	sockDir, err := os.MkdirTemp("", "bi")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(sockDir)
	for _, node := range []string{"node-a", "node-b"} {
		sock := filepath.Join(sockDir, node+".sock")
		d := exec.Command(filepath.Join(binDir, "block-ipamd"), "--nodename", node, "--socket", sock,
			"--etcd-endpoints", srv.Endpoint(), "--metrics-address", "", "--log-level", "warn")
		if err := d.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Process.Kill(); d.Wait() })
		for {
			c, err := net.Dial("unix", sock)
			if err == nil {
				c.Close()
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("block-ipamd of %s: %v", node, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	runtime := libcni.NewCNIConfigWithCacheDir([]string{binDir}, t.TempDir(), nil)
	add := func(node, id string) string {
		t.Helper()
		conf := fmt.Sprintf(`{"cniVersion":"1.1.0","name":"net","plugins":[{"type":"block-ipam","ipam":{"type":"block-ipam",`+
			`"socket":%q}}]}`, filepath.Join(sockDir, node+".sock"))
		nc, err := libcni.ConfListFromBytes([]byte(conf))
		if err != nil {
			t.Fatal(err)
		}
		res, err := runtime.AddNetworkList(ctx, nc, &libcni.RuntimeConf{ContainerID: id, NetNS: "/var/run/netns/none", IfName: "eth0"})
		if err != nil {
			t.Fatalf("ADD %s on %s: %v", id, node, err)
		}
		raw, _ := json.Marshal(res)
		var r struct {
			IPs []struct{ Address string } `json:"ips"`
		}
		json.Unmarshal(raw, &r)
		return r.IPs[0].Address
	}
	add("node-b", "b-0") // node-b claims one of the two blocks
	var last string
	for i := 0; i < 17; i++ { // 16 fill node-a's block; the 17th is borrowed from node-b's
		last = add("node-a", fmt.Sprintf("a-%d", i))
	}
	borrowed := netip.MustParsePrefix(last).Addr()

	var out, errOut bytes.Buffer
	err = run(ctx, []string{"routes", "--etcd-endpoints", srv.Endpoint(), "--nodename", "node-c"}, &out, &errOut, env(nil))
	if err != nil {
		t.Fatalf("routes: %v\n%s", err, errOut.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	var blockA, blockB string
	for _, l := range lines {
		f := strings.Fields(l)
		if len(f) >= 5 && f[4] == "node-a" && strings.HasSuffix(f[0], "/28") {
			blockA = f[0]
		}
		if len(f) >= 5 && f[4] == "node-b" && strings.HasSuffix(f[0], "/28") {
			blockB = f[0]
		}
	}
	want := []string{
		blockA + " via 192.0.2.1 owner node-a encap none",
		blockB + " via 192.0.2.2 owner node-b encap none",
		netip.PrefixFrom(borrowed, 32).String() + " via 192.0.2.1 owner node-a encap none",
	}
	slices.Sort(want)
	got := slices.Clone(lines)
	slices.Sort(got)
	if blockA == "" || blockB == "" || !slices.Equal(got, want) {
		t.Fatalf("routes for node-c:\n%s\nwant (any order):\n%s", out.String(), strings.Join(want, "\n"))
	}
	if !netip.MustParsePrefix(blockB).Contains(borrowed) {
		t.Errorf("the 17th address %s of node-a is not in node-b's block %s", borrowed, blockB)
	}
	// node-b routes node-a's block and its borrowed address; node-a routes only node-b's block.
	for node, n := range map[string]int{"node-a": 1, "node-b": 2} {
		out.Reset()
		if err := run(ctx, []string{"routes", "--etcd-endpoints", srv.Endpoint(), "--nodename", node, "--output", "json"}, &out, &errOut, env(nil)); err != nil {
			t.Fatal(err)
		}
		var rs []map[string]any
		if err := json.Unmarshal(out.Bytes(), &rs); err != nil || len(rs) != n {
			t.Errorf("routes for %s: %v\n%s", node, err, out.String())
		}
	}
}
