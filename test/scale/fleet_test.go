package scale

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/vpp-route-agent/vpp-route-agent/blockwatch"
	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/internal/calicotest"
	"github.com/vpp-route-agent/vpp-route-agent/test/vppsim"
)

var pool = netip.MustParsePrefix("10.0.0.0/8")

// newClient is a client of one endpoint (host:port or URL), as each node has its own.
func newClient(endpoint string) (*clientv3.Client, error) {
	if !strings.Contains(endpoint, "://") {
		endpoint = "http://" + endpoint
	}
	return clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
}

// --- M watchers of the real blockwatch code ---

// fleet is M blockwatch.Watchers, each with its own etcd client (its own TCP connection, as on M
// nodes), whose snapshots are drained and dropped.
type fleet struct {
	ws     []*blockwatch.Watcher
	clis   []*clientv3.Client
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// startFleet starts m watchers of endpoint, their configuration changed by mod (if not nil).
func startFleet(tb testing.TB, endpoint string, m int, mod func(*blockwatch.Config)) *fleet {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	f := &fleet{cancel: cancel}
	tb.Cleanup(f.close)
	for range m {
		cli, err := newClient(endpoint)
		if err != nil {
			tb.Fatal(err)
		}
		f.clis = append(f.clis, cli)
		cfg := blockwatch.Config{Client: cli, Logger: slog.New(slog.DiscardHandler)}
		if mod != nil {
			mod(&cfg)
		}
		w, err := blockwatch.New(cfg)
		if err != nil {
			tb.Fatal(err)
		}
		f.ws = append(f.ws, w)
		f.wg.Go(func() { _ = w.Run(ctx) })
		f.wg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case <-w.Updates():
				}
			}
		})
	}
	return f
}

// waitRevision waits until every watcher is synced at revision rev or later.
func (f *fleet) waitRevision(rev int64, within time.Duration) error {
	deadline := time.Now().Add(within)
	for i := 0; i < len(f.ws); {
		st := f.ws[i].Status()
		if st.Synced && st.Revision >= rev {
			i++
			continue
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d watchers not in sync at revision %d after %s; watcher %d at revision %d (synced %v, last error %q)",
				f.behind(rev), len(f.ws), rev, within, i, st.Revision, st.Synced, st.LastError)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return nil
}

// behind is the number of watchers not in sync at revision rev or later.
func (f *fleet) behind(rev int64) int {
	n := 0
	for _, w := range f.ws {
		if st := w.Status(); !st.Synced || st.Revision < rev {
			n++
		}
	}
	return n
}

// errors counts the watchers' last errors (the first 60 characters), for the log.
func (f *fleet) errors() map[string]int {
	out := map[string]int{}
	for _, w := range f.ws {
		if e := w.Status().LastError; e != "" {
			out[e[:min(len(e), 60)]]++
		}
	}
	return out
}

// relists is the number of relists the watchers made after their first list.
func (f *fleet) relists() (n uint64) {
	for _, w := range f.ws {
		n += w.Status().Relists
	}
	return n
}

func (f *fleet) close() {
	f.cancel()
	f.wg.Wait()
	for _, c := range f.clis {
		c.Close()
	}
	f.clis = nil
}

// --- the IPAM writer ---

// writer does pod ADDs as Calico's IPAM does them: it takes the next free address of a block, bumps
// the sequence number and rewrites the whole block value, conditionally on the revision it read.
type writer struct {
	cli    *clientv3.Client
	blocks []*calico.Block
	revs   []int64
	next   int
	// bytes is the total size of the values written by add.
	bytes int64
}

// nodeName names the i-th remote node, which owns blocks and registers a peer.
func nodeName(i int) string { return fmt.Sprintf("node-%04d", i) }

// peerOf is the peer IP of the i-th remote node (outside the pool).
func peerOf(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{192, 168, byte(1 + i/250), byte(1 + i%250)})
}

// newWriter fills etcd with what Calico writes with strict affinity on: the IPAM config, the pool,
// the peers of nodes nodes (at least owners) and n blocks owned round-robin by the first owners of
// them, with their confirmed affinities, each holding pods allocated pods (realistic attributes),
// and returns a writer of more ADDs.
func newWriter(ctx context.Context, cli *clientv3.Client, n, owners, nodes, pods int) (*writer, error) {
	if err := calicotest.PutPool(ctx, cli, calico.IPPool{Name: "default-ipv4-ippool", CIDR: pool, BlockSize: 26}); err != nil {
		return nil, err
	}
	for i := range max(nodes, owners) {
		if err := calicotest.PutPeer(ctx, cli, blockwatch.DefaultHostsPrefix, nodeName(i), peerOf(i)); err != nil {
			return nil, err
		}
	}
	cfg, err := calico.EncodeIPAMConfig(calico.IPAMConfig{StrictAffinity: true, AutoAllocateBlocks: true})
	if err != nil {
		return nil, err
	}
	if _, err := cli.Put(ctx, calico.IPAMConfigKey, string(cfg)); err != nil {
		return nil, err
	}
	confirmed, err := calico.EncodeAffinity(calico.AffinityValue{State: calico.AffinityConfirmed})
	if err != nil {
		return nil, err
	}
	w := &writer{cli: cli}
	for i := range n {
		b := calicotest.Block(calicotest.BlockCIDR(i), nodeName(i%owners), i)
		for range pods {
			w.allocate(b, i)
		}
		v, err := calico.EncodeBlock(b)
		if err != nil {
			return nil, err
		}
		if _, err := cli.Put(ctx, calico.HostAffinityKey(nodeName(i%owners), b.CIDR), string(confirmed)); err != nil {
			return nil, err
		}
		resp, err := cli.Put(ctx, calico.BlockKey(b.CIDR), string(v))
		if err != nil {
			return nil, err
		}
		w.blocks = append(w.blocks, b)
		w.revs = append(w.revs, resp.Header.Revision)
	}
	return w, nil
}

// mark rewrites the first node's peer registration (same value) and returns its revision: a write
// every watcher and agent receives, whatever it reads block owners from.
func (w *writer) mark(ctx context.Context) (int64, error) {
	resp, err := w.cli.Put(ctx, calicotest.PeerKey(blockwatch.DefaultHostsPrefix, nodeName(0), peerOf(0)), peerOf(0).String())
	if err != nil {
		return 0, fmt.Errorf("mark: %w", err)
	}
	return resp.Header.Revision, nil
}

func (w *writer) allocate(b *calico.Block, i int) int {
	node := strings.TrimPrefix(*b.Affinity, "host:")
	seq := b.SequenceNumber
	return calicotest.Allocate(b, fmt.Sprintf("k8s-pod-network.%016x%048x", uint64(i), seq),
		calicotest.PodAttrs(node, "default", fmt.Sprintf("pod-%d-%d", i, seq), time.Unix(0, int64(seq))))
}

// add allocates one pod address in the next block (round-robin) and writes the block back if its
// revision is still the one read (Calico's compare-and-swap); it returns the write's revision.
func (w *writer) add(ctx context.Context) (int64, error) {
	i := w.next % len(w.blocks)
	w.next++
	b := w.blocks[i]
	if w.allocate(b, i) < 0 {
		return 0, fmt.Errorf("block %s is full: use more blocks or fewer ADDs", b.CIDR)
	}
	v, err := calico.EncodeBlock(b)
	if err != nil {
		return 0, err
	}
	key := calico.BlockKey(b.CIDR)
	resp, err := w.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", w.revs[i])).
		Then(clientv3.OpPut(key, string(v))).Commit()
	if err != nil {
		return 0, fmt.Errorf("write block %s: %w", b.CIDR, err)
	}
	if !resp.Succeeded {
		return 0, fmt.Errorf("write block %s: modified by someone else", b.CIDR)
	}
	w.revs[i] = resp.Header.Revision
	w.bytes += int64(len(v))
	return resp.Header.Revision, nil
}

// --- real agent processes ---

var agentBuild struct {
	once sync.Once
	bin  string
	err  error
}

// agentBinary builds cmd/vpp-route-agent once per test binary run.
func agentBinary(tb testing.TB) string {
	tb.Helper()
	agentBuild.once.Do(func() {
		dir, err := os.MkdirTemp("", "scale-bin-")
		if err != nil {
			agentBuild.err = err
			return
		}
		agentBuild.bin = filepath.Join(dir, "vpp-route-agent")
		out, err := exec.Command("go", "build", "-o", agentBuild.bin,
			"github.com/vpp-route-agent/vpp-route-agent/cmd/vpp-route-agent").CombinedOutput()
		if err != nil {
			agentBuild.err = fmt.Errorf("go build cmd/vpp-route-agent: %w\n%s", err, out)
		}
	})
	if agentBuild.err != nil {
		tb.Fatal(agentBuild.err)
	}
	return agentBuild.bin
}

// agentProc is a vpp-route-agent process with its simulated VPP.
type agentProc struct {
	*child
	node string
	sim  *vppsim.Sim
	url  string // metrics and health server
}

const uplinkName = "GigabitEthernet0/8/0"

// startAgent runs the i-th agent (node "agent-<i>", peer 172.31.0.<i+1>) against endpoint, with the
// extra flags, and waits until it serves /readyz.
func startAgent(tb testing.TB, i int, endpoint string, extra ...string) *agentProc {
	tb.Helper()
	sim, err := vppsim.New(vppsim.Config{Interfaces: []string{uplinkName}})
	if err != nil {
		tb.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "scale-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "api.sock")
	if err := sim.Listen(sock); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { sim.Close() })
	node := fmt.Sprintf("agent-%d", i)
	args := append([]string{"--nodename", node, "--etcd-endpoints", "http://" + endpoint, "--vpp-api-socket", sock,
		"--uplink-interface", uplinkName, "--uplink-address", fmt.Sprintf("172.31.0.%d/16", i+1),
		"--metrics-address", "127.0.0.1:0", "--log-format", "json"}, extra...)
	c := startChild(tb, node, agentBinary(tb), nil, args...)
	a := &agentProc{child: c, node: node, sim: sim}
	deadline := time.Now().Add(30 * time.Second)
	for a.url == "" {
		if _, rest, ok := strings.Cut(c.stderr(), `"msg":"serving metrics and health"`); ok {
			if _, addr, ok := strings.Cut(rest, `"address":"`); ok {
				a.url = "http://" + addr[:strings.IndexByte(addr, '"')]
			}
		}
		if c.exited() || time.Now().After(deadline) {
			tb.Fatalf("%s does not serve metrics:\n%s", node, c.stderr())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return a
}

var httpClient = &http.Client{Timeout: 5 * time.Second}

// ready reports whether /readyz answers 200, and its body.
func (a *agentProc) ready() (bool, string) {
	resp, err := httpClient.Get(a.url + "/readyz")
	if err != nil {
		return false, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode == http.StatusOK, string(body)
}

// waitReady waits until /readyz answers 200.
func (a *agentProc) waitReady(within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		ok, body := a.ready()
		if ok {
			return nil
		}
		if a.exited() || time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %s: %s", a.node, within, body)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// events is the number of watch events of source (blocks, hosts, ...) the agent has received: the sum
// of its vpp_route_agent_etcd_events_total{source="<source>",...} series.
func (a *agentProc) events(source string) (float64, error) {
	resp, err := httpClient.Get(a.url + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	var sum float64
	for _, line := range strings.Split(string(body), "\n") {
		// client_golang writes labels in name order: source before type.
		if rest, ok := strings.CutPrefix(line, `vpp_route_agent_etcd_events_total{source="`+source+`"`); ok {
			f := strings.Fields(rest)
			v, err := strconv.ParseFloat(f[len(f)-1], 64)
			if err != nil {
				return 0, fmt.Errorf("%s: metrics line %q: %w", a.node, line, err)
			}
			sum += v
		}
	}
	return sum, nil
}

// waitEvents waits until the agent has received at least n events of source.
func (a *agentProc) waitEvents(source string, n float64, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		got, err := a.events(source)
		if err == nil && got >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.Join(fmt.Errorf("%s: %v %s events after %s, want %v", a.node, got, source, within, n), err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
