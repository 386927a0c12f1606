package cni_test

import (
	"context"
	"fmt"
	"maps"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/cni"
	"github.com/vpp-route-agent/vpp-route-agent/cni/ipamd"
	"github.com/vpp-route-agent/vpp-route-agent/cni/shim"
)

// held returns "handle/ifname" of every allocation, for compact comparisons.
func (e *env) held() map[string]int {
	out := map[string]int{}
	for _, a := range e.snapshot().Allocations {
		out[a.Handle+"/"+a.Secondary[ipamd.AttrIfname]+"@"+a.Node]++
	}
	return out
}

// TestGC: without cni.dev/valid-attachments GC releases nothing; with it, exactly this node's
// allocations on this network that are not listed, and never those of other nodes, other networks, or
// a network whose name extends this one's with a dot.
func TestGC(t *testing.T) {
	e := newEnv(t)
	e.putPool("p", "10.244.0.0/16", 26)
	net1 := e.list(netOpts{ipam: e.ipam("node1", nil)})
	net2 := e.list(netOpts{name: "net2", ipam: e.ipam("node1", nil)})
	dotted := e.list(netOpts{name: "net1.x", ipam: e.ipam("node1", nil)})
	net1node2 := e.list(netOpts{ipam: e.ipam("node2", nil)})
	e.mustAdd(net1, rt("c1", "eth0"))
	e.mustAdd(net1, rt("c2", "eth0"))
	e.mustAdd(net1, rt("c2", "net1"))
	e.mustAdd(net2, rt("c9", "eth0"))
	e.mustAdd(dotted, rt("c1", "eth0"))
	e.mustAdd(net1node2, rt("c5", "eth0"))
	before := e.held()

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// A runtime with no cached attachments, so that libcni issues no DELs of its own.
	fresh := func() *libcni.CNIConfig {
		return newRuntime(t.TempDir())
	}

	if err := fresh().GCNetworkList(ctx, net1, nil); err != nil {
		t.Fatalf("GC without valid-attachments: %v", err)
	}
	if got := e.held(); !maps.Equal(got, before) {
		t.Fatalf("GC without the key released something: %v -> %v", before, got)
	}

	valid := []types.GCAttachment{{ContainerID: "c1", IfName: "eth0"}, {ContainerID: "c2", IfName: "eth0"}}
	if err := fresh().GCNetworkList(ctx, net1, &libcni.GCArgs{ValidAttachments: valid}); err != nil {
		t.Fatalf("GC: %v", err)
	}
	want := map[string]int{"net1.c1/eth0@node1": 1, "net1.c2/eth0@node1": 1, "net2.c9/eth0@node1": 1, "net1.x.c1/eth0@node1": 1, "net1.c5/eth0@node2": 1}
	if got := e.held(); !maps.Equal(got, want) {
		t.Fatalf("after GC keeping c1 and c2/eth0: %v, want %v", got, want)
	}
	if h := e.snapshot().Handles["net1.c2"]; h == nil || h.Count() != 1 {
		t.Fatalf("handle net1.c2 = %+v, want count 1", h)
	}

	// Nothing valid (libcni sends null): every net1 allocation of node1 goes, nothing else.
	if err := fresh().GCNetworkList(ctx, net1, &libcni.GCArgs{}); err != nil {
		t.Fatalf("GC: %v", err)
	}
	want = map[string]int{"net2.c9/eth0@node1": 1, "net1.x.c1/eth0@node1": 1, "net1.c5/eth0@node2": 1}
	if got := e.held(); !maps.Equal(got, want) {
		t.Fatalf("after GC with nothing valid: %v, want %v", got, want)
	}
}

// TestGCRevalidates: an allocation GC found stale in its snapshot but that was released and
// allocated again (same container, same address, new sequence number) before GC got to it is kept.
func TestGCRevalidates(t *testing.T) {
	e := newEnv(t)
	e.putPool("tiny", "10.9.0.0/30", 30)
	list := e.list(netOpts{ipam: e.ipam("node1", nil)})
	for i := 1; i <= 4; i++ {
		e.mustAdd(list, rt(fmt.Sprintf("c%d", i), "eth0"))
	}
	// GC runs on a second daemon of node1 whose first write pauses, so that node1's own daemon
	// serves the DEL and ADD meanwhile.
	var armed atomic.Bool
	armed.Store(true)
	paused, release := make(chan struct{}), make(chan struct{})
	gcd := e.startDaemon("node1-gc", "node1", func(ctx context.Context) {
		if armed.CompareAndSwap(true, false) {
			close(paused)
			<-release
		}
	})
	defer gcd.Stop()
	gcIPAM := e.ipam("node1", nil)
	gcIPAM["socket"] = gcd.Socket
	valid := []types.GCAttachment{{ContainerID: "c1", IfName: "eth0"}, {ContainerID: "c2", IfName: "eth0"}, {ContainerID: "c3", IfName: "eth0"}}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	gcErr := make(chan error, 1)
	go func() {
		gcErr <- newRuntime(t.TempDir()).GCNetworkList(ctx, e.list(netOpts{ipam: gcIPAM}), &libcni.GCArgs{ValidAttachments: valid})
	}()
	<-paused
	// While GC pauses with c4 in its snapshot: c4 goes and comes back on the same (only free) address.
	e.mustDel(list, rt("c4", "eth0"))
	e.mustAdd(list, rt("c4", "eth0"))
	close(release)
	if err := <-gcErr; err != nil {
		t.Fatalf("GC: %v", err)
	}
	if got := e.held(); got["net1.c4/eth0@node1"] != 1 {
		t.Fatalf("GC released c4's new allocation: %v", got)
	}
}

// TestStatus: STATUS succeeds when ADD can be served, and fails with 50 naming the endpoint within its
// 2 s budget when etcd is down, and naming the socket when no daemon answers; ADD and DEL then fail
// with 11.
func TestStatus(t *testing.T) {
	e := newEnv(t)
	e.putPool("p", "10.244.0.0/16", 26)
	list := e.list(netOpts{ipam: e.ipam("node1", nil)})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := e.cni.GetStatusNetworkList(ctx, list); err != nil {
		t.Fatalf("STATUS: %v", err)
	}
	noPools := newEnv(t)
	wantCode(t, noPools.cni.GetStatusNetworkList(ctx, noPools.list(netOpts{ipam: noPools.ipam("node1", nil)})), cni.ErrPluginNotAvailable, "pool")

	e.srv.Stop()
	start := time.Now()
	err := e.cni.GetStatusNetworkList(ctx, list)
	wantCode(t, err, cni.ErrPluginNotAvailable, e.srv.Endpoint())
	if d := time.Since(start); d > 4*time.Second {
		t.Errorf("STATUS took %s with etcd down, budget 2 s", d)
	}
	// ADD and DEL with etcd down: 11 within their deadline, naming etcd.
	short := e.list(netOpts{ipam: e.ipam("node1", map[string]any{"timeout": "2s"})})
	_, err = e.add(short, rt("down", "eth0"))
	wantCode(t, err, 11, "etcd")
	wantCode(t, e.del(short, rt("down", "eth0")), 11, "etcd")
	if err := e.srv.Start(); err != nil {
		t.Fatal(err)
	}
	if err := e.cni.GetStatusNetworkList(ctx, list); err != nil {
		t.Fatalf("STATUS after etcd restart: %v", err)
	}

	nowhere := filepath.Join(e.sockDir, "nowhere.sock")
	gone := e.list(netOpts{ipam: e.ipam("node1", map[string]any{"socket": nowhere})})
	wantCode(t, e.cni.GetStatusNetworkList(ctx, gone), cni.ErrPluginNotAvailable, nowhere)
	_, err = e.add(gone, rt("c1", "eth0"))
	wantCode(t, err, 11, nowhere)
	wantCode(t, e.del(gone, rt("c1", "eth0")), 11, nowhere)
}

// TestErrorCodes runs the binary directly, as a runtime does, into every error it can give.
func TestErrorCodes(t *testing.T) {
	e := newEnv(t)
	e.putPool("p", "10.244.0.0/16", 26)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	conf := func(ipam map[string]any, top map[string]any) []byte {
		o := netOpts{ipam: e.ipam("node1", ipam)}
		if v, ok := top["cniVersion"].(string); ok {
			o.cniVersion = v
		}
		return pluginConf(t, e.list(o))
	}
	run := func(envv []string, stdin []byte) (error, time.Duration) {
		t.Helper()
		start := time.Now()
		out, stderr, err := execPlugin(ctx, envv, stdin)
		d := time.Since(start)
		if err == nil {
			return nil, d
		}
		if _, ok := err.(*exec.ExitError); !ok {
			t.Fatalf("exec: %v", err)
		}
		_ = stderr
		return decodeError(t, out), d
	}
	add := func(cid string) []string { return cniEnv("ADD", cid, "eth0", "/var/run/netns/x", "") }

	// 7 naming the field, from the daemon before any etcd work (the plugin forwards the call;
	// TestDecodeChecksEachRule); with no daemon to ask, 11: the runtime retries, and gets the 7 once
	// the daemon is there.
	err, _ := run(add("c1"), conf(map[string]any{"assign_ipv4": "maybe"}, nil))
	wantCode(t, err, 7, "assign_ipv4")
	err, _ = run(add("c1"), conf(map[string]any{"socket": "/nonexistent/block-ipam.sock", "assign_ipv4": "maybe"}, nil))
	wantCode(t, err, 11, "/nonexistent/block-ipam.sock")
	// 7: a nodename that is not the daemon's, naming both.
	err, _ = run(add("c1"), conf(map[string]any{"nodename": "node9"}, nil))
	wantCode(t, err, 7, `names node "node9", but the block-ipam daemon at this socket serves node "node1"`)
	// Undecodable configuration: the plugin finds no socket in it and asks the daemon at the default
	// socket (none here: 11); a daemon answers 6 (TestDecodeChecksEachRule).
	err, _ = run(add("c1"), []byte("{not json"))
	wantCode(t, err, 11, shim.DefaultSocket)
	// 1: unsupported cniVersion.
	err, _ = run(add("c1"), conf(nil, map[string]any{"cniVersion": "0.2.0"}))
	wantCode(t, err, 1, "")
	// The plugin answers only VERSION: an unknown command, or a cniVersion the verb does not allow, is
	// the daemon's to refuse (4, 1); with no daemon to ask, 11 like any other call.
	down := map[string]any{"socket": "/nonexistent/block-ipam.sock"}
	err, _ = run(cniEnv("FROB", "c1", "eth0", "/x", ""), conf(nil, nil))
	wantCode(t, err, 4, "FROB")
	err, _ = run(cniEnv("FROB", "c1", "eth0", "/x", ""), conf(down, nil))
	wantCode(t, err, 11, "/nonexistent/block-ipam.sock")
	err, _ = run(cniEnv("CHECK", "c1", "eth0", "/x", ""), conf(down, map[string]any{"cniVersion": "0.3.1"}))
	wantCode(t, err, 11, "/nonexistent/block-ipam.sock")
	// 4: missing CNI_CONTAINERID; malformed CNI_ARGS.
	err, _ = run(cniEnv("ADD", "", "eth0", "/x", ""), conf(nil, nil))
	wantCode(t, err, 4, "CNI_CONTAINERID")
	err, _ = run(cniEnv("ADD", "c1", "eth0", "/x", "K8S_POD_NAME"), conf(nil, nil))
	wantCode(t, err, 4, "CNI_ARGS")
	// 8: the plugin's own netns, refused before anything is allocated.
	err, _ = run(cniEnv("ADD", "c1", "eth0", "/proc/self/ns/net", ""), conf(nil, nil))
	wantCode(t, err, 8, "")
	if n := len(e.snapshot().Allocations); n != 0 {
		t.Fatalf("ADD into the plugin's own netns leaked %d allocations", n)
	}
	// 11: etcd unreachable until the deadline (a daemon whose only endpoint is dead).
	dead := e.startDaemonWith("dead", "node1", []string{"http://127.0.0.1:1"}, nil)
	defer dead.Stop()
	err, _ = run(add("c1"), conf(map[string]any{"socket": dead.Socket, "timeout": "1s"}, nil))
	wantCode(t, err, 11, "127.0.0.1:1")
	// VERSION answers without a daemon.
	out, _, verr := execPlugin(ctx, cniEnv("VERSION", "", "", "", ""), nil)
	if verr != nil || !strings.Contains(string(out), `"1.1.0"`) || !strings.Contains(string(out), `"0.3.1"`) {
		t.Errorf("VERSION: %v %s", verr, out)
	}

	// 11: every attempt loses its race: a daemon whose pause before each write rewrites the node's block
	// (the same value, a new ModRevision), as another writer would between the read and the write.
	e.mustAdd(e.list(netOpts{ipam: e.ipam("node1", nil)}), rt("c0", "eth0"))
	var blockKey string
	for cidr := range e.snapshot().Blocks {
		blockKey = calico.BlockKey(cidr)
	}
	resp, gerr := e.cli.Get(ctx, blockKey)
	if gerr != nil {
		t.Fatal(gerr)
	}
	val := string(resp.Kvs[0].Value)
	slow := e.startDaemon("slow", "node1", func(ctx context.Context) {
		if _, err := e.cli.Put(ctx, blockKey, val); err != nil && ctx.Err() == nil {
			t.Errorf("rewriting the block before the daemon's write: %v", err)
		}
	})
	defer slow.Stop()
	err, _ = run(add("c2"), conf(map[string]any{"timeout": "1500ms", "socket": slow.Socket}, nil))
	wantCode(t, err, 11, "gave up")

	// 102: a block the handle points into no longer decodes.
	e.put(blockKey, []byte(strings.Replace(val, `"allocations":[0`, `"allocations":[7`, 1)))
	err, _ = run(cniEnv("DEL", "c0", "eth0", "", ""), conf(nil, nil))
	wantCode(t, err, cni.ErrDatastore, "invariant")
	e.put(blockKey, []byte(val))

	// CHECK needs cniVersion >= 0.4.0 (1).
	err, _ = run(cniEnv("CHECK", "c0", "eth0", "/x", ""), conf(nil, map[string]any{"cniVersion": "0.3.1"}))
	wantCode(t, err, 1, "")
	e.mustDel(e.list(netOpts{ipam: e.ipam("node1", nil)}), rt("c0", "eth0"))
}

// TestEndpointFailover: the daemon's client passes over an unreachable first endpoint.
func TestEndpointFailover(t *testing.T) {
	e := newEnv(t)
	e.putPool("p", "10.244.0.0/16", 26)
	d := e.startDaemonWith("failover", "node1", []string{"http://127.0.0.1:1", e.srv.Endpoint()}, nil)
	defer d.Stop()
	list := e.list(netOpts{ipam: e.ipam("node1", map[string]any{"socket": d.Socket})})
	e.mustAdd(list, rt("c1", "eth0"))
	e.mustDel(list, rt("c1", "eth0"))
}
