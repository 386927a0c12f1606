package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/vpp-route-agent/vpp-route-agent/agent"
	"github.com/vpp-route-agent/vpp-route-agent/blockwatch"
	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/internal/etcdtest"
	"github.com/vpp-route-agent/vpp-route-agent/internal/vpptopo"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The lab's pools: small IPv4 blocks (16 addresses) so that a few pods claim several blocks (the IPv4
// pool's CIDR is --ipv4-pool's). The IPv4 pool is IPIP CrossSubnet, as Calico's default pool: blocks of a
// node in this node's subnet are routed flat, others through an IPIP tunnel (on the wired lab, node-2 sits
// behind the router). The IPv6 pool has no encapsulation (IPIP is IPv4-only), so its flat routes across
// the router must fail.
var (
	labPoolV4 = calico.IPPool{Name: "lab-ipv4", CIDR: netip.MustParsePrefix("10.244.0.0/16"), BlockSize: 28,
		IPIPMode: calico.EncapCrossSubnet, VXLANMode: calico.EncapNever}
	labPoolV6 = calico.IPPool{Name: "lab-ipv6", CIDR: netip.MustParsePrefix("fd00:10:244::/48"), BlockSize: 122,
		IPIPMode: calico.EncapNever, VXLANMode: calico.EncapNever}
)

type lab struct {
	o     options
	out   io.Writer
	etcd  *etcdtest.Server
	cli   *clientv3.Client
	cni   *libcni.CNIConfig
	nodes []*labNode
	steps []stepResult
	podN  int
	// poolV4 and poolV6 are the pools the lab creates (poolV4 with --ipv4-pool's CIDR).
	poolV4, poolV6 calico.IPPool
	// prom is the lab's Prometheus (--prometheus), nil when it runs none.
	prom *promServer
	// topo is the memif topology of the wired lab (--vpp with a lab build), nil otherwise: only then do
	// the steps ping pods.
	topo *vpptopo.Topology
}

type labNode struct {
	name string
	vpp  dataplane
	// addr4 and addr6 are the uplink's addresses with the subnet's length: the agent's --uplink-address,
	// and the peer IPs it registers.
	addr4, addr6 netip.Prefix
	metrics      string
	logPath      string
	pods         []string // container IDs
	// pod is the pod that answers pings (the node's first, its addresses on the VPP's loop1) on the wired
	// lab; released says that the node's blocks were released (its pod must no longer answer).
	pod      pingPod
	released bool

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}

	// ipamd is the node's block-ipam daemon, answering on ipamSock, its /metrics on ipamMetrics; it
	// runs for the whole lab.
	ipamd       *exec.Cmd
	ipamSock    string
	ipamMetrics string
	ipamLog     string
}

type stepResult struct {
	name   string
	pass   bool
	took   time.Duration
	detail string
}

func newLab(ctx context.Context, o options, out io.Writer) (*lab, error) {
	l := &lab{o: o, out: out, poolV4: labPoolV4, poolV6: labPoolV6}
	l.poolV4.CIDR = o.ipv4Pool
	l.logf("data directory %s", o.dataDir)
	etcd, err := etcdtest.New(etcdtest.Options{Dir: filepath.Join(o.dataDir, "etcd")})
	if err != nil {
		return nil, err
	}
	l.etcd = etcd
	if l.cli, err = etcd.Client(); err != nil {
		l.close()
		return nil, err
	}
	l.logf("etcd listening on %s", etcd.Endpoint())
	for _, p := range []calico.IPPool{l.poolV4, l.poolV6} {
		v, _ := calico.EncodeIPPool(p)
		if _, err := l.cli.Put(ctx, calico.IPPoolKey(p.Name), string(v)); err != nil {
			l.close()
			return nil, fmt.Errorf("create IP pool %s: %w", p.Name, err)
		}
	}
	// An explicit exec: libcni creates its default one lazily, racing when ADDs run concurrently.
	l.cni = libcni.NewCNIConfigWithCacheDir([]string{o.binDir}, filepath.Join(o.dataDir, "cni-cache"),
		&invoke.DefaultExec{RawExec: &invoke.RawExec{Stderr: os.Stderr}, PluginDecoder: version.PluginDecoder{}})
	if o.wired {
		start := time.Now()
		l.topo, err = vpptopo.Start(ctx, o.vppBin, vpptopo.Config{Kind: vpptopo.Routed, Nodes: o.nodes,
			Dir: filepath.Join(o.dataDir, "topo"), NoPods: true})
		if err != nil {
			l.close()
			return nil, err
		}
		l.logf("memif topology linked in %s: odd nodes in 192.168.51.0/24, even ones in 192.168.52.0/24, "+
			"a router VPP between them (no route to any pod block): %s", time.Since(start).Round(time.Millisecond), l.topo.Switch.CtlCommand())
	} else {
		l.logf("pod-to-pod pings need the lab build (memif and ping plugins: --vpp /opt/vpp-v26.06-lab); this run checks FIBs only")
	}
	for i := 1; i <= o.nodes; i++ {
		n := &labNode{
			name:    fmt.Sprintf("node-%d", i),
			addr4:   netip.PrefixFrom(netip.AddrFrom4([4]byte{192, 168, 100, byte(i)}), 24),
			addr6:   netip.MustParsePrefix(fmt.Sprintf("fd00:100::%d/64", i)),
			logPath: filepath.Join(o.dataDir, fmt.Sprintf("agent-node-%d.log", i)),
		}
		if n.metrics, err = freeAddr(); err != nil {
			l.close()
			return nil, err
		}
		if n.ipamMetrics, err = freeAddr(); err != nil {
			l.close()
			return nil, err
		}
		switch {
		case l.topo != nil:
			tn := l.topo.Nodes[i-1]
			n.addr4, n.addr6 = tn.Addr4, tn.Addr6
			n.vpp = &topoPlane{node: tn}
		case o.vppPkg == "":
			n.vpp, err = newSimPlane(o.dataDir, i)
		default:
			n.vpp, err = newRealPlane(ctx, o.vppBin, o.dataDir, i)
		}
		if err != nil {
			l.close()
			return nil, err
		}
		l.nodes = append(l.nodes, n)
		if err := l.startIPAMD(ctx, n); err != nil {
			l.close()
			return nil, err
		}
		if ctl := n.vpp.ctl(); ctl != "" {
			l.logf("%s: VPP pid %d, uplink %s (appears 2s after VPP starts): %s show ip fib", n.name, n.vpp.pid(), n.vpp.uplink(), ctl)
		}
	}
	if err := l.startPrometheus(ctx); err != nil {
		l.close()
		return nil, err
	}
	return l, nil
}

// startPrometheus runs the lab's Prometheus when --prometheus asks for it: every agent and block-ipamd
// scraped (the agents answer once the scenario starts them), the shipped rules loaded, its data under
// the data directory.
func (l *lab) startPrometheus(ctx context.Context) error {
	if l.o.promBin == "" {
		if l.o.promMode == "auto" && l.o.keepRunning {
			l.logf("no Prometheus: prometheus is not on PATH (Debian's package: make promtool); the daemons' /metrics are below")
		}
		return nil
	}
	addr := l.o.promAddr
	if addr == "" {
		var err error
		if addr, err = freeAddr(); err != nil {
			return err
		}
	}
	var targets []promTarget
	for _, n := range l.nodes {
		targets = append(targets, promTarget{job: "vpp-route-agent", node: n.name, addr: n.metrics},
			promTarget{job: "block-ipamd", node: n.name, addr: n.ipamMetrics})
	}
	start := time.Now()
	p, err := startPrometheus(ctx, l.o.promBin, filepath.Join(l.o.dataDir, "prometheus"), addr, targets, l.o.alertFor)
	if err != nil {
		return err
	}
	l.prom = p
	ready := time.Since(start)
	if err := p.waitScraped(ctx, len(targets)); err != nil {
		return err
	}
	rules := "the shipped alert rules (deploy/monitoring/rules.yml)"
	if l.o.alertFor >= 0 {
		rules += fmt.Sprintf(" with every `for` set to %s (--alert-for)", promDuration(l.o.alertFor))
	}
	l.logf("Prometheus pid %d ready in %s, first scrape after %s (agents down until they start), scraping %d daemons every %s with %s; data and log in %s",
		p.cmd.Process.Pid, ready.Round(time.Millisecond), time.Since(start).Round(time.Millisecond), len(targets), promInterval, rules, p.dir)
	l.logf("Prometheus web UI: %s/alerts  %s/targets", p.ui, p.ui)
	return nil
}

// freeAddr returns a loopback address with a free TCP port.
func freeAddr() (string, error) {
	port, err := etcdtest.FreePort()
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("127.0.0.1:%d", port), nil
}

func (l *lab) close() {
	if l.prom != nil {
		l.prom.stop()
	}
	for _, n := range l.nodes {
		l.stopAgent(n)
		if n.ipamd != nil {
			n.ipamd.Process.Signal(syscall.SIGTERM)
			n.ipamd.Wait()
		}
		if n.vpp != nil {
			n.vpp.close()
		}
	}
	if l.topo != nil {
		l.topo.Stop()
	}
	if l.cli != nil {
		l.cli.Close()
	}
	if l.etcd != nil {
		l.etcd.Stop()
	}
}

func (l *lab) logf(format string, args ...any) {
	fmt.Fprintf(l.out, "%s  %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}

// startAgent runs the real vpp-route-agent binary for node n.
func (l *lab) startAgent(n *labNode) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	logf, err := os.OpenFile(n.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(filepath.Join(l.o.binDir, "vpp-route-agent"),
		"--nodename", n.name,
		"--etcd-endpoints", l.etcd.Endpoint(),
		"--vpp-api-socket", n.vpp.socket(),
		"--uplink-interface", n.vpp.uplink(),
		"--uplink-address", n.addr4.String(),
		"--uplink-address", n.addr6.String(),
		"--metrics-address", n.metrics,
		"--registration-ttl", "10s",
		"--peer-loss-grace", "5s",
		"--resync-interval", "30s",
	)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")} // nothing from the caller's environment leaks in
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start agent of %s: %w", n.name, err)
	}
	n.cmd = cmd
	n.exited = make(chan struct{})
	go func() { cmd.Wait(); logf.Close(); close(n.exited) }()
	return nil
}

// startIPAMD runs node n's block-ipam daemon (the real block-ipamd binary) and waits for its socket.
func (l *lab) startIPAMD(ctx context.Context, n *labNode) error {
	n.ipamSock = filepath.Join(l.o.dataDir, "ipam-"+n.name+".sock")
	n.ipamLog = filepath.Join(l.o.dataDir, "block-ipamd-"+n.name+".log")
	logf, err := os.OpenFile(n.ipamLog, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close() // the child has its own descriptor
	cmd := exec.Command(filepath.Join(l.o.binDir, "block-ipamd"), "--nodename", n.name, "--socket", n.ipamSock,
		"--etcd-endpoints", l.etcd.Endpoint(), "--metrics-address", n.ipamMetrics, "--capacity-interval", promInterval.String())
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start block-ipamd of %s: %w", n.name, err)
	}
	n.ipamd = cmd
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.Dial("unix", n.ipamSock)
		if err == nil {
			c.Close()
			l.logf("%s: block-ipamd pid %d on %s", n.name, cmd.Process.Pid, n.ipamSock)
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("block-ipamd of %s does not listen on %s; see %s", n.name, n.ipamSock, n.ipamLog)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stopAgent sends SIGTERM and waits for a normal exit (routes and registration stay).
func (l *lab) stopAgent(n *labNode) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return
	}
	n.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-n.exited:
	case <-time.After(10 * time.Second):
		n.cmd.Process.Kill()
		<-n.exited
	}
	n.cmd = nil
}

func (l *lab) agentRunning(n *labNode) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return false
	}
	select {
	case <-n.exited:
		return false
	default:
		return true
	}
}

// waitReady polls /readyz of every given node until it answers 200.
func (l *lab) waitReady(ctx context.Context, nodes ...*labNode) error {
	deadline := time.Now().Add(l.o.settle)
	client := &http.Client{Timeout: time.Second}
	for _, n := range nodes {
		for {
			if !l.agentRunning(n) {
				return fmt.Errorf("agent of %s exited; see %s", n.name, n.logPath)
			}
			resp, err := client.Get("http://" + n.metrics + "/readyz")
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					break
				}
			}
			if time.Now().After(deadline) || ctx.Err() != nil {
				return fmt.Errorf("%s not ready after %s; see %s", n.name, l.o.settle, n.logPath)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return nil
}

// netconf is the network configuration a runtime on node n would use: block-ipam as the only plugin.
func (l *lab) netconf(n *labNode) (*libcni.NetworkConfigList, error) {
	conf := map[string]any{
		"cniVersion": "1.1.0",
		"name":       "lab",
		"plugins": []any{map[string]any{
			"type": "block-ipam",
			"ipam": map[string]any{
				"type":        "block-ipam",
				"socket":      n.ipamSock,
				"nodename":    n.name,
				"assign_ipv4": "true",
				"assign_ipv6": "true",
				"log_file":    filepath.Join(l.o.dataDir, "block-ipam.log"),
			},
		}},
	}
	raw, _ := json.Marshal(conf)
	return libcni.ConfListFromBytes(raw)
}

func (l *lab) runtimeConf(id string) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{ContainerID: id, NetNS: "/var/run/netns/vpplab-" + id, IfName: "eth0",
		Args: [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", "lab"}, {"K8S_POD_NAME", id}}}
}

// addPods places count pods on n through block-ipam, as a runtime would, a few at a time.
func (l *lab) addPods(ctx context.Context, n *labNode, count int) error {
	nc, err := l.netconf(n)
	if err != nil {
		return err
	}
	ids := make([]string, count)
	for i := range ids {
		l.podN++
		ids[i] = fmt.Sprintf("%s-pod-%d", n.name, l.podN)
	}
	errs := make([]error, count)
	results := make([]types.Result, count)
	sem := make(chan struct{}, 4)
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			actx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			results[i], errs[i] = l.cni.AddNetworkList(actx, nc, l.runtimeConf(id))
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			return fmt.Errorf("ADD %s: %w", ids[i], err)
		}
		n.pods = append(n.pods, ids[i])
	}
	if !n.pod.v4.IsValid() {
		pod, err := podOf(ids[0], results[0])
		if err != nil {
			return err
		}
		n.pod = pod
	}
	return nil
}

// delPods removes every pod of n through block-ipam.
func (l *lab) delPods(ctx context.Context, n *labNode) error {
	nc, err := l.netconf(n)
	if err != nil {
		return err
	}
	for _, id := range n.pods {
		dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := l.cni.DelNetworkList(dctx, nc, l.runtimeConf(id))
		cancel()
		if err != nil {
			return fmt.Errorf("DEL %s: %w", id, err)
		}
	}
	n.pods = nil
	return nil
}

// releaseBlocks deletes n's empty blocks and their affinities, as removing a node from the cluster does
// (calicoctl ipam release / node deletion). It refuses a block that still holds addresses.
func (l *lab) releaseBlocks(ctx context.Context, n *labNode) (int, error) {
	snap, err := l.snapshot(ctx)
	if err != nil {
		return 0, err
	}
	released := 0
	for cidr, b := range snap.Blocks.All() {
		if b.Owner.Node != n.name {
			continue
		}
		key := calico.BlockKey(cidr)
		resp, err := l.cli.Get(ctx, key)
		if err != nil || len(resp.Kvs) != 1 {
			return released, fmt.Errorf("read %s: %v", key, err)
		}
		blk, err := calico.DecodeBlock(resp.Kvs[0].Value)
		if err != nil {
			return released, err
		}
		if blk.Allocated() > 0 {
			return released, fmt.Errorf("block %s still holds %d addresses", cidr, blk.Allocated())
		}
		txn, err := l.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", resp.Kvs[0].ModRevision)).
			Then(clientv3.OpDelete(key), clientv3.OpDelete(calico.HostAffinityKey(n.name, cidr))).Commit()
		if err != nil || !txn.Succeeded {
			return released, fmt.Errorf("release %s: changed concurrently or %v", cidr, err)
		}
		released++
	}
	return released, nil
}

// snapshot lists etcd once, as the agents see it.
func (l *lab) snapshot(ctx context.Context) (*blockwatch.Snapshot, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return blockwatch.List(ctx, blockwatch.Config{Client: l.cli, LegacyHostAffinity: true, Logger: slog.New(slog.DiscardHandler)})
}

// fib returns node n's routes inside the lab's pools as "prefix via next-hop", sorted; a failed dump is
// one line saying so (which never equals a desired FIB).
func (l *lab) fib(n *labNode) []string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	routes, err := n.vpp.apiRoutes(ctx)
	if err != nil {
		return []string{"dump failed: " + err.Error()}
	}
	tunnels, err := n.vpp.ipipTunnels(ctx)
	if err != nil {
		return []string{"tunnel dump failed: " + err.Error()}
	}
	var out []string
	for _, r := range routes {
		if !l.poolV4.CIDR.Contains(r.Prefix.Addr()) && !l.poolV6.CIDR.Contains(r.Prefix.Addr()) {
			continue
		}
		var nhs []string
		for _, p := range r.Paths {
			// A host prefix added through a tunnel dumps its own address as next hop (as VPP does).
			if dst, ok := tunnels[p.SwIfIndex]; ok && (!p.NextHop.IsValid() || r.Prefix.IsSingleIP() && p.NextHop == r.Prefix.Addr()) {
				nhs = append(nhs, "ipip "+dst.String())
			} else {
				nhs = append(nhs, p.NextHop.String())
			}
		}
		out = append(out, r.Prefix.String()+" via "+strings.Join(nhs, ","))
	}
	slices.Sort(out)
	return out
}

// desired returns what node n's FIB must hold, computed from etcd as the routes subcommand does (with
// the uplink's subnets, against which CrossSubnet tests each next hop). An IPIP route goes through the
// tunnel to its next hop, with no next hop of its own: fib shows it as "via ipip <tunnel destination>".
func desired(snap *blockwatch.Snapshot, n *labNode) []string {
	routes, _ := agent.Desired(snap, agent.Options{NodeName: n.name, UplinkPrefixes: []netip.Prefix{n.addr4, n.addr6}})
	out := make([]string, 0, len(routes))
	for _, r := range routes {
		nh := r.NextHop.String()
		if r.Encap == calico.EncapIPIP {
			nh = "ipip " + nh
		}
		out = append(out, r.Prefix.String()+" via "+nh)
	}
	slices.Sort(out)
	return out
}

// converge waits until every node's FIB equals its desired routes; it returns the time it took, or the
// first difference when the settle timeout runs out.
func (l *lab) converge(ctx context.Context, since time.Time) (time.Duration, error) {
	deadline := time.Now().Add(l.o.settle)
	for {
		snap, err := l.snapshot(ctx)
		if err != nil {
			return 0, err
		}
		diff := ""
		for _, n := range l.nodes {
			if got, want := l.fib(n), desired(snap, n); !slices.Equal(got, want) {
				diff = fmt.Sprintf("%s FIB %q, want %q", n.name, got, want)
				break
			}
		}
		if diff == "" {
			return time.Since(since), nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return 0, fmt.Errorf("not converged after %s: %s", l.o.settle, diff)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
