package cni_test

import (
	"context"
	"encoding/json"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/cni"
	"github.com/vpp-route-agent/vpp-route-agent/cni/ipamd"
	"github.com/vpp-route-agent/vpp-route-agent/cni/shim"
)

var k8sArgs = [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", "ns1"}, {"K8S_POD_NAME", "pod1"}, {"K8S_POD_INFRA_CONTAINER_ID", "c1"}}

// TestAddDelLifecycle follows one node's first block through ADD, repeated ADD, DEL, repeated DEL, and
// DEL of containers that never were or whose data is gone, checking the exact keys and values Calico
// would have written.
func TestAddDelLifecycle(t *testing.T) {
	e := newEnv(t)
	e.putPool("default-ipv4-ippool", "10.244.0.0/16", 26)
	list := e.list(netOpts{ipam: e.ipam("node1", nil)})
	pool := netip.MustParsePrefix("10.244.0.0/16")
	wantBlock, _ := calico.FreeBlock(pool, 26, calico.BlockStartIndex("node1", pool, 26), nil)

	r := e.mustAdd(list, rt("c1", "eth0", k8sArgs...))
	first, _ := calico.OrdinalAddr(wantBlock, 0)
	if got := addrs(r); !slices.Equal(got, []netip.Prefix{netip.PrefixFrom(first, 32)}) {
		t.Fatalf("ADD = %v, want %s/32 (ordinal 0 of the node's first block %s)", got, first, wantBlock)
	}

	// The keys and values exactly as Calico writes them.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	get := func(key string) string {
		resp, err := e.cli.Get(ctx, key)
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("get %s: %v (%d keys)", key, err, len(resp.Kvs))
		}
		return string(resp.Kvs[0].Value)
	}
	if got := get(calico.HostAffinityKey("node1", wantBlock)); got != `{"state":"confirmed","deleted":false}` {
		t.Errorf("affinity value %s", got)
	}
	if got, want := get(calico.HandleKey("net1.c1")), `{"block":{"`+wantBlock.String()+`":1},"deleted":false}`; got != want {
		t.Errorf("handle value %s, want %s", got, want)
	}
	b := e.block(wantBlock.String())
	if b.Affinity == nil || *b.Affinity != "host:node1" {
		t.Fatalf("block affinity %v", b.Affinity)
	}
	a := b.AttributeOf(0)
	if a.Handle() != "net1.c1" || a.Secondary["namespace"] != "ns1" || a.Secondary["pod"] != "pod1" ||
		a.Secondary["node"] != "node1" || a.Secondary[ipamd.AttrIfname] != "eth0" || a.Secondary[ipamd.AttrNetwork] != "net1" {
		t.Errorf("attribute %+v", a)
	}
	ts, err := time.Parse("2006-01-02 15:04:05.999999999 -0700 MST", a.Secondary["timestamp"])
	if err != nil || ts.Location().String() != "UTC" || time.Since(ts) > time.Minute {
		t.Errorf("timestamp %q (%v) is not Go's time.Time.String() in UTC", a.Secondary["timestamp"], err)
	}
	if s, ok := b.SequenceOf(0); !ok || s+1 != b.SequenceNumber {
		t.Errorf("sequence of ordinal 0 = %d, block at %d", s, b.SequenceNumber)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal([]byte(get(calico.BlockKey(wantBlock))), &raw); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"cidr", "affinity", "allocations", "unallocated", "attributes", "sequenceNumber", "sequenceNumberForAllocation", "deleted"} {
		if _, ok := raw[f]; !ok {
			t.Errorf("block value lacks %q", f)
		}
	}

	// ADD again: the same address, nothing new.
	if r2 := e.mustAdd(list, rt("c1", "eth0", k8sArgs...)); !slices.Equal(addrs(r2), addrs(r)) {
		t.Fatalf("repeated ADD = %v, first gave %v", addrs(r2), addrs(r))
	}
	if n := len(e.snapshot().Allocations); n != 1 {
		t.Fatalf("repeated ADD left %d allocations", n)
	}

	r2 := e.mustAdd(list, rt("c2", "eth0"))
	e.mustDel(list, rt("c1", "eth0"))
	b = e.block(wantBlock.String())
	if b.Allocations[0] != nil || b.Unallocated[len(b.Unallocated)-1] != 0 {
		t.Fatalf("released ordinal 0 must go to the tail of unallocated: %v", b.Unallocated)
	}
	if _, ok := e.snapshot().Handles["net1.c1"]; ok {
		t.Fatal("handle of a released container still exists")
	}
	// FIFO: the next ADD does not reuse the just-released address.
	r3 := e.mustAdd(list, rt("c3", "eth0"))
	if addrs(r3)[0] == addrs(r)[0] || addrs(r3)[0] == addrs(r2)[0] {
		t.Fatalf("ADD after DEL reused %v", addrs(r3))
	}

	// DEL again, DEL of a container never added, DEL without netns: all succeed.
	e.mustDel(list, rt("c1", "eth0"))
	e.mustDel(list, rt("never", "eth0"))
	noNetns := rt("c2", "eth0")
	noNetns.NetNS = ""
	e.mustDel(list, noNetns)
	e.mustDel(list, rt("c3", "eth0"))
	b = e.block(wantBlock.String())
	if b.Allocated() != 0 || b.Affinity == nil || *b.Affinity != "host:node1" {
		t.Fatalf("emptied block: %d allocated, affinity %v; want 0 and kept", b.Allocated(), b.Affinity)
	}
	if len(e.snapshot().Handles) != 0 {
		t.Fatalf("handles left: %v", e.snapshot().Handles)
	}

	// DEL when the etcd data is already gone (the blocks and affinities deleted under the handle).
	e.mustAdd(list, rt("c4", "eth0"))
	for _, p := range []string{calico.BlockPrefix, calico.HostAffinityPrefix} {
		if _, err := e.cli.Delete(ctx, p, clientv3.WithPrefix()); err != nil {
			t.Fatal(err)
		}
	}
	e.mustDel(list, rt("c4", "eth0"))
	if len(e.snapshot().Handles) != 0 {
		t.Fatal("DEL with its block gone left the handle")
	}
}

// TestTwoInterfaces: two interfaces of one container on one network share Calico's per-container
// handle and are told apart by the ifname attribute; each ADD is idempotent, each DEL releases only
// its interface.
func TestTwoInterfaces(t *testing.T) {
	e := newEnv(t)
	e.putPool("p", "10.244.0.0/16", 26)
	list := e.list(netOpts{ipam: e.ipam("node1", nil)})
	a := e.mustAdd(list, rt("c1", "eth0"))
	b := e.mustAdd(list, rt("c1", "net1"))
	if addrs(a)[0] == addrs(b)[0] {
		t.Fatalf("both interfaces got %v", addrs(a))
	}
	if again := e.mustAdd(list, rt("c1", "net1")); addrs(again)[0] != addrs(b)[0] {
		t.Fatalf("repeated ADD of net1 = %v, want %v", addrs(again), addrs(b))
	}
	s := e.snapshot()
	if h := s.Handles["net1.c1"]; h == nil || h.Count() != 2 {
		t.Fatalf("handle net1.c1 = %+v, want one handle counting 2", h)
	}
	e.mustDel(list, rt("c1", "net1"))
	s = e.snapshot()
	if len(s.Allocations) != 1 || s.Allocations[0].Addr != addrs(a)[0].Addr() || s.Handles["net1.c1"].Count() != 1 {
		t.Fatalf("after DEL net1: %+v %+v", s.Allocations, s.Handles)
	}
	// A CHECK of eth0 still passes; one of net1 fails.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e.cni.CheckNetworkList(ctx, list, rt("c1", "eth0")); err != nil {
		t.Fatalf("CHECK eth0: %v", err)
	}
	e.mustDel(list, rt("c1", "eth0"))
	if len(e.snapshot().Handles) != 0 {
		t.Fatal("handle left after both DELs")
	}
}

// TestDelHandleElsewhere: DEL derives the handle's value from the node's blocks in the daemon's node
// state. A handle spread over two of the node's blocks is guessed right (one round trip); when it also
// holds an address borrowed in another node's block the guess is wrong, the conditional write fails,
// and DEL continues from what its failure branch read (plus a read of the other node's block: three
// round trips; emptying one of the node's own blocks whose pool still selects the node costs none),
// releasing exactly this interface's address either way.
func TestDelHandleElsewhere(t *testing.T) {
	e := newEnv(t)
	e.putPool("p", "10.9.0.0/28", 30)
	list := e.list(netOpts{ipam: e.ipam("node1", nil)})
	node2 := e.list(netOpts{ipam: e.ipam("node2", nil)})
	first := addrs(e.mustAdd(list, rt("c1", "eth0")))[0].Addr()
	for _, c := range []string{"x1", "x2", "x3"} {
		e.mustAdd(list, rt(c, "eth0")) // fills c1's block
	}
	second := addrs(e.mustAdd(list, rt("c1", "net1")))[0].Addr()
	blockA, blockB := netip.PrefixFrom(first, 30).Masked(), netip.PrefixFrom(second, 30).Masked()
	if blockA == blockB {
		t.Fatalf("net1 got %s in the full block %s", second, blockA)
	}
	n2 := addrs(e.mustAdd(node2, rt("y1", "eth0")))[0].Addr()
	blockC := netip.PrefixFrom(n2, 30).Masked()
	borrowed, _ := calico.OrdinalAddr(blockC, 3)
	e.mustAdd(list, rt("c1", "net2", [2]string{"IP", borrowed.String()}))

	e.mustDel(list, rt("c1", "net1"))
	h := e.snapshot().Handles["net1.c1"]
	if h == nil || h.Count() != 2 || h.Block[blockA.String()] != 1 || h.Block[blockC.String()] != 1 {
		t.Fatalf("after DEL net1 the handle is %+v, want {%s: 1, %s: 1}", h, blockA, blockC)
	}
	e.mustDel(list, rt("c1", "net2"))
	e.mustDel(list, rt("c1", "eth0"))
	if _, ok := e.snapshot().Handles["net1.c1"]; ok {
		t.Fatal("handle left after all DELs")
	}
	got := e.roundTrips("node1")
	if dels := got[len(got)-3:]; strings.Join(dels, " ") != "DEL=3 DEL=3 DEL=1" {
		t.Errorf("DEL round trips %v, want [DEL=3 DEL=3 DEL=1]: wrong guesses while the borrowed address is held, which also needs its block read", dels)
	}
}

// TestCheck: CHECK passes while the reservation exists and fails with 103 when it is gone or when
// prevResult names an address of the pools the handle does not hold; addresses outside the pools are
// not the IPAM's business.
func TestCheck(t *testing.T) {
	e := newEnv(t)
	e.putPool("p", "10.244.0.0/16", 26)
	list := e.list(netOpts{ipam: e.ipam("node1", nil)})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	r := e.mustAdd(list, rt("c1", "eth0"))
	if err := e.cni.CheckNetworkList(ctx, list, rt("c1", "eth0")); err != nil {
		t.Fatalf("CHECK after ADD: %v", err)
	}

	// prevResult with an extra address: inside the pools it fails, outside it is ignored.
	check := func(extra string) error {
		prev := map[string]any{"cniVersion": "1.1.0", "ips": []map[string]string{{"address": addrs(r)[0].String()}, {"address": extra}}}
		conf, err := libcni.InjectConf(list.Plugins[0], map[string]any{"name": list.Name, "cniVersion": "1.1.0", "prevResult": prev})
		if err != nil {
			t.Fatal(err)
		}
		out, _, err := execPlugin(ctx, cniEnv("CHECK", "c1", "eth0", "/var/run/netns/x", ""), conf.Bytes)
		if err != nil {
			return decodeError(t, out)
		}
		return nil
	}
	if err := check("192.168.0.1/32"); err != nil {
		t.Fatalf("CHECK with an address outside the pools: %v", err)
	}
	wantCode(t, check("10.244.99.1/32"), cni.ErrCheckFailed, "10.244.99.1")

	// Released behind the runtime's back (another runtime instance, no shared cache): CHECK fails.
	other := newRuntime(t.TempDir())
	if err := other.DelNetworkList(ctx, list, rt("c1", "eth0")); err != nil {
		t.Fatal(err)
	}
	wantCode(t, e.cni.CheckNetworkList(ctx, list, rt("c1", "eth0")), cni.ErrCheckFailed, "net1.c1")
}

// TestCalicoWrittenBlock: a block written by Calico (node-a's block with a borrowed address, from the
// shared examples) is allocated from in Calico's FIFO order and written back without disturbing the
// allocations and attributes already in it.
func TestCalicoWrittenBlock(t *testing.T) {
	e := newEnv(t)
	orig := e.putCalicoBlock("mixed-borrowed-v4.json")
	e.putPool("p", "10.244.0.0/16", 26)

	list := e.list(netOpts{ipam: e.ipam("node-a", nil)})
	r := e.mustAdd(list, rt("c1", "eth0"))
	head, _ := calico.OrdinalAddr(orig.CIDR, orig.Unallocated[0])
	if addrs(r)[0].Addr() != head {
		t.Fatalf("ADD = %v, want %s (the head of Calico's unallocated FIFO)", addrs(r), head)
	}
	b := e.block(orig.CIDR.String())
	for ord := range orig.Allocations {
		was, now := orig.AttributeOf(ord), b.AttributeOf(ord)
		if was == nil {
			continue
		}
		if now == nil || now.Handle() != was.Handle() || !maps.Equal(now.Secondary, was.Secondary) {
			t.Errorf("ordinal %d changed: %+v -> %+v", ord, was, now)
		}
	}
	if b.SequenceNumber != orig.SequenceNumber+1 {
		t.Errorf("sequence number %d -> %d, want +1", orig.SequenceNumber, b.SequenceNumber)
	}
	e.mustDel(list, rt("c1", "eth0"))
	b = e.block(orig.CIDR.String())
	if !slices.Equal(b.Unallocated, append(slices.Clone(orig.Unallocated[1:]), orig.Unallocated[0])) {
		t.Errorf("unallocated after ADD+DEL = %v, want the head moved to the tail of %v", b.Unallocated, orig.Unallocated)
	}
}

// cniEnv is the environment a runtime gives the plugin.
func cniEnv(cmd, cid, ifname, netns, args string) []string {
	env := []string{"CNI_COMMAND=" + cmd, "CNI_PATH=" + pluginDir, "PATH=" + os.Getenv("PATH")}
	for k, v := range map[string]string{"CNI_CONTAINERID": cid, "CNI_IFNAME": ifname, "CNI_NETNS": netns, "CNI_ARGS": args} {
		if v != "" {
			env = append(env, k+"="+v)
		}
	}
	return env
}

// decodeError parses the error JSON a plugin printed.
func decodeError(t *testing.T, out []byte) error {
	t.Helper()
	var te types.Error
	if err := json.Unmarshal(out, &te); err != nil || te.Code == 0 {
		t.Fatalf("plugin failed with output %q, not a CNI error", out)
	}
	return &te
}

// TestResolvConfReadOnlyForADD: only ADD prints DNS, so only ADD reads the resolvConf file, in the
// plugin and in LoadConfig. Once the file is gone, ADD fails with 7 naming the field, and CHECK, GC,
// STATUS and DEL still succeed: DEL releases, or the pod would stick in Terminating.
func TestResolvConfReadOnlyForADD(t *testing.T) {
	e := newEnv(t)
	e.putPool("p", "10.244.0.0/16", 26)
	resolv := filepath.Join(e.tmp, "resolv.conf")
	if err := os.WriteFile(resolv, []byte("nameserver 10.96.0.10\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	list := e.list(netOpts{ipam: e.ipam("node1", map[string]any{"resolvConf": resolv})})
	res := e.mustAdd(list, rt("c1", "eth0"))
	if len(res.DNS.Nameservers) != 1 {
		t.Fatalf("ADD's DNS %+v, want the file's nameserver", res.DNS)
	}
	if err := os.Remove(resolv); err != nil {
		t.Fatal(err)
	}
	_, err := e.add(list, rt("c2", "eth0"))
	wantCode(t, err, types.ErrInvalidNetworkConfig, "ipam.resolvConf")

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := e.cni.CheckNetworkList(ctx, list, rt("c1", "eth0")); err != nil {
		t.Errorf("CHECK without the resolvConf file: %v", err)
	}
	if err := e.cni.GetStatusNetworkList(ctx, list); err != nil {
		t.Errorf("STATUS without the resolvConf file: %v", err)
	}
	if err := e.cni.GCNetworkList(ctx, list, &libcni.GCArgs{ValidAttachments: []types.GCAttachment{{ContainerID: "c1", IfName: "eth0"}}}); err != nil {
		t.Errorf("GC without the resolvConf file: %v", err)
	}
	e.mustDel(list, rt("c1", "eth0"))
	if s := e.snapshot(); len(s.Allocations) != 0 {
		t.Fatalf("after DEL: %+v", s.Allocations)
	}

	// The daemon alone (a frame whose plugin could not read the file): DEL is served.
	var f []byte
	for k, v := range map[string]string{"CNI_COMMAND": "DEL", "CNI_CONTAINERID": "c1", "CNI_IFNAME": "eth0", "CNI_PATH": "/p",
		shim.KeyResolvConfErr: "open /etc/cni/resolv.conf: no such file or directory"} {
		f = shim.AppendRecord(f, k, []byte(v))
	}
	f = shim.Seal(shim.AppendRecord(f, shim.KeyStdin, []byte(`{"cniVersion":"1.1.0","name":"n","ipam":{"resolvConf":"/etc/cni/resolv.conf"}}`)))
	if call, err := cni.Decode(f); err != nil || call.Request().Verb != "DEL" {
		t.Errorf("DEL frame without the resolvConf file: %v", err)
	}
	// LoadConfig reads the file for ADD only.
	stdin := []byte(`{"cniVersion":"1.1.0","name":"n","ipam":{"resolvConf":"` + resolv + `"}}`)
	for _, verb := range []string{"DEL", "CHECK", "GC", "STATUS"} {
		if _, err := cni.LoadConfig(verb, stdin, ""); err != nil {
			t.Errorf("LoadConfig %s: %v", verb, err)
		}
	}
	if _, err := cni.LoadConfig("ADD", stdin, ""); err == nil {
		t.Error("LoadConfig ADD without the resolvConf file succeeded")
	}
}
