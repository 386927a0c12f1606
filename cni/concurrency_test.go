package cni_test

import (
	"bufio"
	"context"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/cni"
)

// addAll runs one ADD per (list, container) at once, each in its own plugin process, and returns the
// results and errors by index.
func (e *env) addAll(lists []*libcni.NetworkConfigList, cids []string) ([]*current.Result, []error, time.Duration) {
	return concurrently(len(cids), func(i int) (*current.Result, error) { return e.add(lists[i], rt(cids[i], "eth0")) })
}

// checkAccounted verifies that the successful results are exactly the allocations in etcd: no
// address twice, each held by the handle of the container it was returned to, on the right node.
func (e *env) checkAccounted(res []*current.Result, errs []error, cids, nodes []string) int {
	e.t.Helper()
	byAddr := map[netip.Addr]string{}
	ok := 0
	for i, r := range res {
		if errs[i] != nil {
			continue
		}
		ok++
		a := addrs(r)[0].Addr()
		if prev, dup := byAddr[a]; dup {
			e.t.Errorf("address %s returned to %s and %s", a, prev, cids[i])
		}
		byAddr[a] = cids[i]
	}
	s := e.snapshot()
	if len(s.Allocations) != ok {
		e.t.Errorf("%d successful ADDs, %d allocations in etcd", ok, len(s.Allocations))
	}
	for _, al := range s.Allocations {
		cid, found := byAddr[al.Addr]
		if !found {
			e.t.Errorf("allocation %s (%s) was returned to no ADD", al.Addr, al.Handle)
			continue
		}
		if al.Handle != "net1."+cid {
			e.t.Errorf("%s is held by %s, returned to %s", al.Addr, al.Handle, cid)
		}
		for i := range cids {
			if cids[i] == cid && al.Node != nodes[i] {
				e.t.Errorf("%s of %s records node %s, want %s", al.Addr, cid, al.Node, nodes[i])
			}
		}
	}
	return ok
}

// addConcurrently runs n ADDs of list on node at once, each its own process, requires every one to
// succeed with its own address, and returns the wall time.
func (e *env) addConcurrently(list *libcni.NetworkConfigList, node string, n int) time.Duration {
	e.t.Helper()
	lists, cids, nodes := make([]*libcni.NetworkConfigList, n), make([]string, n), make([]string, n)
	for i := range n {
		lists[i], cids[i], nodes[i] = list, fmt.Sprintf("c%03d", i), node
	}
	res, errs, wall := e.addAll(lists, cids)
	for i, err := range errs {
		if err != nil {
			e.t.Errorf("ADD %s: %v", cids[i], err)
		}
	}
	if ok := e.checkAccounted(res, errs, cids, nodes); ok != n {
		e.t.Fatalf("%d of %d ADDs succeeded", ok, n)
	}
	return wall
}

// TestConcurrentAdds100: 100 ADDs at once on one node, each its own process: all succeed, no
// address twice, every one accounted for.
func TestConcurrentAdds100(t *testing.T) {
	e := newEnv(t)
	e.putPool("p", "10.244.0.0/16", 26)
	wall := e.addConcurrently(e.list(netOpts{ipam: e.ipam("node1", nil)}), "node1", 100)
	t.Logf("100 concurrent ADDs on one node: %s wall, %d blocks", wall.Round(time.Millisecond), len(e.snapshot().Blocks))
}

// TestTwoDaemonsOneNode: two daemons serving one node (a rolling update overlapping, an operator's
// mistake) race for the same block in etcd; the conditional transactions alone keep every address
// unique.
func TestTwoDaemonsOneNode(t *testing.T) {
	e := newEnv(t)
	e.putPool("p", "10.244.0.0/16", 28)
	second := e.startDaemon("node1-second", "node1", nil)
	defer second.Stop()
	const n = 30
	lists, cids, nodes := make([]*libcni.NetworkConfigList, n), make([]string, n), make([]string, n)
	for i := range n {
		ipam := e.ipam("node1", nil)
		if i%2 == 1 {
			ipam["socket"] = second.Socket
		}
		lists[i], cids[i], nodes[i] = e.list(netOpts{ipam: ipam}), fmt.Sprintf("c%03d", i), "node1"
	}
	res, errs, wall := e.addAll(lists, cids)
	for i, err := range errs {
		if err != nil {
			t.Errorf("ADD %s: %v", cids[i], err)
		}
	}
	if ok := e.checkAccounted(res, errs, cids, nodes); ok != n {
		t.Fatalf("%d of %d ADDs succeeded", ok, n)
	}
	t.Logf("%d concurrent ADDs through two daemons of one node: %s wall", n, wall.Round(time.Millisecond))
}

// TestThreeNodesRace: three nodes race for the blocks of a small pool. Without strict affinity all
// ADDs succeed (borrowing at the end); with it, ADDs beyond a node's blocks fail with 100. Either way
// no address is handed out twice, no blocks overlap, and every allocation is accounted for.
func TestThreeNodesRace(t *testing.T) {
	for _, strict := range []bool{false, true} {
		t.Run(fmt.Sprintf("strict=%v", strict), func(t *testing.T) {
			e := newEnv(t)
			// 8 blocks of 8 addresses; 60 ADDs (strict: 4 blocks of 8, 30 ADDs, 10 per node).
			perNode, pool := 20, "10.9.0.0/26"
			if strict {
				perNode, pool = 10, "10.9.0.0/27"
				e.putIPAMConfig(calico.IPAMConfig{StrictAffinity: true, AutoAllocateBlocks: true})
			}
			e.putPool("small", pool, 29)
			var lists []*libcni.NetworkConfigList
			var cids, nodes []string
			for n := 1; n <= 3; n++ {
				node := fmt.Sprintf("node%d", n)
				l := e.list(netOpts{ipam: e.ipam(node, nil)})
				for i := range perNode {
					lists, cids, nodes = append(lists, l), append(cids, fmt.Sprintf("%s-c%02d", node, i)), append(nodes, node)
				}
			}
			res, errs, wall := e.addAll(lists, cids)
			for i, err := range errs {
				if err != nil && (!strict || codeOf(err) != cni.ErrPoolExhausted) {
					t.Errorf("ADD %s: %v", cids[i], err)
				}
			}
			ok := e.checkAccounted(res, errs, cids, nodes)
			s := e.snapshot()
			if !strict && ok != len(cids) {
				t.Errorf("%d of %d ADDs succeeded without strict affinity", ok, len(cids))
			}
			owners := map[string]int{}
			for _, b := range s.Blocks {
				owners[calico.OwnerOf(b, false).Node]++
			}
			if strict {
				// A node fails only once its own blocks are full and no block is left to claim.
				for _, a := range s.Allocations {
					if a.Node != a.Owner {
						t.Errorf("strict affinity, yet %s of %s is in %s's block", a.Addr, a.Node, a.Owner)
					}
				}
				if ok < len(cids) && len(s.Blocks) != 4 {
					t.Errorf("%d ADDs failed with %d of 4 blocks claimed", len(cids)-ok, len(s.Blocks))
				}
				for n := 1; n <= 3; n++ {
					node, got := fmt.Sprintf("node%d", n), 0
					for _, a := range s.Allocations {
						if a.Node == node {
							got++
						}
					}
					if want := min(perNode, 8*owners[node]); got != want {
						t.Errorf("%s holds %d addresses with %d blocks, want %d", node, got, owners[node], want)
					}
				}
			}
			t.Logf("%d ADDs, %d succeeded, in %s; blocks per node %v", len(cids), ok, wall.Round(time.Millisecond), owners)
		})
	}
}

// roundTrips returns "VERB=n" for each ADD and DEL node's daemons answered, in order: the etcd round
// trips of its operation, from the reply.
func (e *env) roundTrips(node string) []string {
	var got []string
	for _, c := range e.served("ADD", "DEL") {
		if c.node == node {
			got = append(got, fmt.Sprintf("%s=%d", c.verb, c.reply.RoundTrips))
		}
	}
	return got
}

// TestRoundTrips: with the daemon's watch-fed node state, ADD takes one etcd round trip (a write
// conditional on the block and the state it decided on), a repeated ADD one (the same transaction's
// failure branch reads the handle), DEL one (a write conditional on the handle's value derived from
// the node's blocks); claiming the node's first block takes two (list blocks, write). Counted by the
// daemon, reported in the plugin's log.
func TestRoundTrips(t *testing.T) {
	e := newEnv(t)
	e.putPool("p", "10.244.0.0/16", 26)
	list := e.list(netOpts{ipam: e.ipam("node1", nil)})
	e.mustAdd(list, rt("c1", "eth0")) // claims the block
	e.mustAdd(list, rt("c2", "eth0"))
	e.mustAdd(list, rt("c2", "eth0")) // idempotent
	e.mustDel(list, rt("c2", "eth0"))
	got := e.roundTrips("node1")
	want := []string{"ADD=2", "ADD=1", "ADD=1", "DEL=1"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("round trips %v, want %v (claim, common ADD, repeated ADD, DEL)", got, want)
	}
	t.Logf("etcd round trips: claim ADD %s, common ADD %s, repeated ADD %s, DEL %s", got[0], got[1], got[2], got[3])
}

// TestNodeCacheIsOnlyAHint: the daemon's node state never decides anything etcd does not confirm.
// When another node writes the node's block, when the block's pool is disabled, or when the daemon
// restarted, ADD still gives a correct address. The state's watches usually deliver the change before
// the next ADD (one round trip); when they are behind, the write loses and reads in its failure
// branch (one more).
func TestNodeCacheIsOnlyAHint(t *testing.T) {
	e := newEnv(t)
	e.putPool("a", "10.244.0.0/16", 26)
	e.putPool("b", "10.245.0.0/16", 26)
	list := e.list(netOpts{ipam: e.ipam("node1", nil)})
	first := addrs(e.mustAdd(list, rt("c1", "eth0")))[0].Addr()
	if !mustPrefix("10.244.0.0/16").Contains(first) {
		t.Fatalf("first ADD %s, want pool a", first)
	}
	e.mustAdd(list, rt("c2", "eth0")) // warm: one round trip

	// node2 borrows an address of node1's block: the cached block is stale.
	block := netip.PrefixFrom(first, 26).Masked()
	borrowed, _ := calico.OrdinalAddr(block, 2)
	e.mustAdd(e.list(netOpts{ipam: e.ipam("node2", nil)}), rt("n2", "eth0", [2]string{"IP", borrowed.String()}))
	if got := addrs(e.mustAdd(list, rt("c3", "eth0")))[0].Addr(); got == borrowed {
		t.Fatalf("ADD with a stale cache handed out %s, borrowed by node2", got)
	}

	// Pool a disabled: allocation moves to pool b at once, cache or no cache.
	e.putPool("a", "10.244.0.0/16", 26, func(p *calico.IPPool) { p.Disabled = true })
	if got := addrs(e.mustAdd(list, rt("c4", "eth0")))[0].Addr(); !mustPrefix("10.245.0.0/16").Contains(got) {
		t.Fatalf("ADD after pool a was disabled gave %s", got)
	}

	// A restarted daemon (on the same socket) starts with nothing cached.
	e.restartDaemon("node1")
	e.socket("node1")
	e.mustAdd(list, rt("c5", "eth0"))

	got := e.roundTrips("node1")
	// At most: claim, warm, stale block (watch behind: +1), claim in pool b (watch behind: +1),
	// restarted daemon (its followers read the state before it answers).
	most := []int{2, 1, 2, 3, 1}
	ok := len(got) == len(most)
	for i := 0; ok && i < len(got); i++ {
		n, _ := strconv.Atoi(strings.TrimPrefix(got[i], "ADD="))
		ok = strings.HasPrefix(got[i], "ADD=") && n >= 1 && n <= most[i]
	}
	if !ok {
		t.Errorf("round trips %v, want at most ADD=%v (claim, warm, stale block, claim in pool b, restarted daemon)", got, most)
	}
}

// TestBatchedAdds: ADDs that queue while the daemon's state loop is busy are served together by the
// first of them, in its one etcd transaction; the others answer without a round trip of their own.
func TestBatchedAdds(t *testing.T) {
	e := newEnv(t)
	e.putPool("p", "10.244.0.0/16", 26)
	var armed atomic.Bool
	paused, release := make(chan struct{}), make(chan struct{})
	d := e.startDaemon("batch", "node1", func(ctx context.Context) {
		if armed.CompareAndSwap(true, false) {
			close(paused)
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
	})
	defer d.Stop()
	ipam := e.ipam("node1", nil)
	ipam["socket"] = d.Socket
	list := e.list(netOpts{ipam: ipam})
	r0 := e.mustAdd(list, rt("c0", "eth0")) // claims the block, which the daemon's node state then holds

	// hold's write pauses; the n ADDs queue behind it.
	armed.Store(true)
	holdErr := make(chan error, 1)
	var rHold *current.Result
	go func() {
		var err error
		rHold, err = e.add(list, rt("hold", "eth0"))
		holdErr <- err
	}()
	<-paused
	const n = 12
	cids, lists, nodes := make([]string, n), make([]*libcni.NetworkConfigList, n), make([]string, n)
	for i := range n {
		cids[i], lists[i], nodes[i] = fmt.Sprintf("g%02d", i), list, "node1"
	}
	done := make(chan struct{})
	var res []*current.Result
	var errs []error
	go func() {
		defer close(done)
		res, errs, _ = e.addAll(lists, cids)
	}()
	deadline := time.Now().Add(30 * time.Second)
	for d.Queued() < n && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	close(release)
	<-done
	if err := <-holdErr; err != nil {
		t.Fatal(err)
	}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("ADD %s: %v", cids[i], err)
		}
	}
	cids = append([]string{"c0", "hold"}, cids...)
	res = append([]*current.Result{r0, rHold}, res...)
	errs = append([]error{nil, nil}, errs...)
	nodes = append([]string{"node1", "node1"}, nodes...)
	if ok := e.checkAccounted(res, errs, cids, nodes); ok != n+2 {
		t.Fatalf("%d of %d accounted", ok, n+2)
	}
	rts, batched := 0, 0
	for _, c := range e.served("ADD") {
		if strings.HasPrefix(c.container, "g") {
			batched += c.reply.Batched
			rts += int(c.reply.RoundTrips)
		}
	}
	if batched != n-1 || rts != 1 {
		t.Errorf("the %d queued ADDs: %d served by another's write, %d etcd round trips in all; want %d and 1", n, batched, rts, n-1)
	}
	t.Logf("%d queued ADDs: %d served by the first one's write, %d etcd round trip in all", n, batched, rts)
}

// daemonProcess runs block-ipamd for node on sock with extra environment, and returns the command and
// a channel that receives a value at each of the daemon's test pauses.
func (e *env) daemonProcess(node, sock string, env ...string) (*exec.Cmd, <-chan struct{}) {
	e.t.Helper()
	cmd := exec.Command(filepath.Join(pluginDir, "block-ipamd"), "--nodename", node, "--socket", sock,
		"--metrics-address", "", "--log-level", "warn", "--etcd-endpoints", e.srv.Endpoint())
	cmd.Env = append(os.Environ(), env...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		e.t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	pauses := make(chan struct{}, 100)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "test pause before commit") {
				pauses <- struct{}{}
			}
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := waitSocket(ctx, sock); err != nil {
		e.t.Fatal(err)
	}
	return cmd, pauses
}

// TestKillDaemonMidBatch: a daemon killed with SIGKILL while its one transaction for a batch of ADDs
// is about to be sent leaves etcd exactly as it was (the batch is one transaction); the shims waiting
// on it fail with 11; the runtime's retries, served by a new daemon, succeed, and the ADD that had
// completed before gets its address again.
func TestKillDaemonMidBatch(t *testing.T) {
	e := newEnv(t)
	e.putPool("p", "10.244.0.0/16", 26)
	sock := filepath.Join(e.sockDir, "proc.sock")
	ipam := e.ipam("node1", map[string]any{"socket": sock})
	list := e.list(netOpts{ipam: ipam})
	dump := func() map[string]int64 {
		resp, err := e.cli.Get(t.Context(), "/calico/ipam/", clientv3.WithPrefix())
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]int64{}
		for _, kv := range resp.Kvs {
			out[string(kv.Key)] = kv.ModRevision
		}
		return out
	}

	// Every write pauses 1 s: x0's write pauses while x1..x9 queue; the next batch is x1 serving the
	// others in one write, killed in its pause.
	cmd, pauses := e.daemonProcess("node1", sock, "BLOCK_IPAM_TEST_PAUSE=1s")
	first := make(chan error, 1)
	var r0 *current.Result
	go func() {
		var err error
		r0, err = e.add(list, rt("x0", "eth0"))
		first <- err
	}()
	<-pauses // x0's claim
	const n = 10
	lists, cids, nodes := make([]*libcni.NetworkConfigList, n-1), make([]string, n-1), make([]string, n-1)
	for i := range n - 1 {
		lists[i], cids[i], nodes[i] = list, fmt.Sprintf("x%d", i+1), "node1"
	}
	done := make(chan struct{})
	var errs []error
	go func() {
		defer close(done)
		_, errs, _ = e.addAll(lists, cids)
	}()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	<-pauses // the batch's write
	before := dump()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	<-done
	if after := dump(); !maps.Equal(before, after) {
		t.Fatalf("killed daemon changed etcd: %v -> %v", before, after)
	}
	for i, err := range errs {
		if codeOf(err) != 11 {
			t.Errorf("ADD %s to a killed daemon: %v, want code 11", cids[i], err)
		}
	}

	// The runtime retries, against a new daemon on the same socket (the dead one's is replaced).
	e.daemonProcess("node1", sock)
	res, errs, _ := e.addAll(lists, cids)
	again := e.mustAdd(list, rt("x0", "eth0"))
	if addrs(again)[0] != addrs(r0)[0] {
		t.Fatalf("x0 again got %v, first %v", addrs(again), addrs(r0))
	}
	e.checkAccounted(append([]*current.Result{r0}, res...), append([]error{nil}, errs...),
		append([]string{"x0"}, cids...), append([]string{"node1"}, nodes...))
}
