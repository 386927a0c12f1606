package calicointerop_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/internal/etcdtest"
	"github.com/vpp-route-agent/vpp-route-agent/internal/ipamcheck"
	"github.com/vpp-route-agent/vpp-route-agent/internal/ipamdtest"
)

// EnvCalicoDir names the directory holding Calico's calico-ipam and calicoctl (build-calico.sh's
// output). Unset: every test of this package skips.
const EnvCalicoDir = "CALICO_BIN_DIR"

// network is the CNI network both plugins serve: the same name gives the same handle
// (<network>.<containerID>), so that either plugin's DEL releases the other's allocation.
const network = "k8s-pod-network"

var (
	calicoDir string // Calico's binaries
	pluginDir string // what libcni executes: block-ipam and a calico-ipam wrapper
)

func TestMain(m *testing.M) { os.Exit(runMain(m)) }

func runMain(m *testing.M) int {
	calicoDir = os.Getenv(EnvCalicoDir)
	if calicoDir == "" {
		return m.Run()
	}
	for _, b := range []string{"calico-ipam", "calicoctl"} {
		if _, err := os.Stat(filepath.Join(calicoDir, b)); err != nil {
			fmt.Fprintf(os.Stderr, "%s=%s: %v (build them with test/calicointerop/build-calico/build-calico.sh, or make test-calico)\n", EnvCalicoDir, calicoDir, err)
			return 1
		}
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "calico-interop tests need root: calico-ipam runs in its own mount namespace (unshare -m)")
		return 1
	}
	dir, err := os.MkdirTemp("", "calico-interop-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	// block-ipamd beside the plugin: `block-ipam release-node` runs it.
	for _, b := range []string{"block-ipam", "block-ipamd"} {
		build := exec.Command("go", "build", "-trimpath", "-o", filepath.Join(dir, b), "github.com/vpp-route-agent/vpp-route-agent/cmd/"+b)
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "build %s: %v\n%s", b, err, out)
			return 1
		}
	}
	// calico-ipam writes a marker under /var/run/calico on specific-address requests: each call runs
	// in its own mount namespace with a private /run, so that tests leave nothing on the machine.
	// The binary dispatches on its name, which exec keeps.
	wrapper := fmt.Sprintf("#!/bin/sh\nexec unshare -m /bin/sh -c 'mount -t tmpfs tmpfs /run && exec \"$0\"' %s\n",
		filepath.Join(calicoDir, "calico-ipam"))
	if err := os.WriteFile(filepath.Join(dir, "calico-ipam"), []byte(wrapper), 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	pluginDir = dir
	return m.Run()
}

// plugin names one of the two IPAM plugins.
type plugin string

const (
	calicoIPAM plugin = "calico-ipam"
	blockIPAM  plugin = "block-ipam"
)

// pod is a container one of the plugins gave addresses to.
type pod struct {
	cid, node string
	by        plugin
	addrs     []netip.Addr
	// noEndpoint: the pod has no WorkloadEndpoint (ipam check then counts its addresses as leaked).
	noEndpoint bool
}

// world is one etcd with Calico's resources, both plugins, calicoctl, and the pods created so far.
type world struct {
	t       *testing.T
	cli     *clientv3.Client
	ep      string
	tmp     string
	kubecfg string
	log     *os.File
	cni     map[string]*libcni.CNIConfig // per node: each node's runtime has its own cache
	sockDir string
	daemons map[string]string // node -> socket of its block-ipam daemon

	mu   sync.Mutex // guards pods, cni and daemons
	pods map[string]*pod
}

func newWorld(t *testing.T) *world {
	t.Helper()
	if calicoDir == "" {
		t.Skipf("%s not set: run `make test-calico`, which builds Calico v3.31.0's calico-ipam and calicoctl", EnvCalicoDir)
	}
	srv, cli := etcdtest.Start(t)
	w := &world{t: t, cli: cli, ep: srv.Endpoint(), tmp: t.TempDir(), cni: map[string]*libcni.CNIConfig{}, pods: map[string]*pod{},
		daemons: map[string]string{}}
	var err error
	w.sockDir = ipamdtest.SocketDir(t)
	if w.log, err = os.Create(filepath.Join(w.tmp, "plugins.log")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		w.log.Close()
		if t.Failed() {
			if data, _ := os.ReadFile(w.log.Name()); len(data) > 0 {
				t.Logf("plugin stderr (last 4 kB):\n%s", tail(data, 4096))
			}
		}
	})
	// calicoctl ipam check lists Kubernetes services even on etcd: a stand-in API server with none.
	api := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("Content-Type", "application/json")
		if r.URL.Path != "/api/v1/services" {
			rw.WriteHeader(http.StatusNotFound)
			fmt.Fprint(rw, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}`)
			return
		}
		fmt.Fprint(rw, `{"kind":"ServiceList","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":[]}`)
	}))
	t.Cleanup(api.Close)
	w.kubecfg = filepath.Join(w.tmp, "kubeconfig")
	kc := fmt.Sprintf("apiVersion: v1\nkind: Config\nclusters:\n- name: stand-in\n  cluster:\n    server: %s\ncontexts:\n- name: c\n  context:\n    cluster: stand-in\n    user: u\nusers:\n- name: u\n  user: {}\ncurrent-context: c\n", api.URL)
	if err := os.WriteFile(w.kubecfg, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	// What calico/node and kube-controllers would have written: ipam check reads both.
	now := time.Now().UTC().Format(time.RFC3339)
	w.put("/calico/resources/v3/projectcalico.org/clusterinformations/default",
		`{"kind":"ClusterInformation","apiVersion":"projectcalico.org/v3","metadata":{"name":"default","uid":"6c8f0b9e-0000-4000-8000-000000000001","creationTimestamp":"`+now+`"},"spec":{"clusterGUID":"interop-test","clusterType":"vpp-route-agent-test","calicoVersion":"v3.31.0","datastoreReady":true}}`)
	w.put("/calico/resources/v3/projectcalico.org/kubecontrollersconfigurations/default",
		`{"kind":"KubeControllersConfiguration","apiVersion":"projectcalico.org/v3","metadata":{"name":"default","uid":"6c8f0b9e-0000-4000-8000-000000000002","creationTimestamp":"`+now+`"},"spec":{"controllers":{}}}`)
	return w
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

func (w *world) put(key, val string) {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := w.cli.Put(ctx, key, val); err != nil {
		w.t.Fatal(err)
	}
}

// calicoctl runs calicoctl against the etcd, with stdin, and fails the test when it fails.
func (w *world) calicoctl(stdin string, args ...string) string {
	w.t.Helper()
	out, err := w.calicoctlErr(stdin, args...)
	if err != nil {
		w.t.Fatalf("calicoctl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func (w *world) calicoctlErr(stdin string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(calicoDir, "calicoctl"), append(args, "--allow-version-mismatch")...)
	cmd.Env = append(os.Environ(), "DATASTORE_TYPE=etcdv3", "ETCD_ENDPOINTS="+w.ep, "KUBECONFIG="+w.kubecfg)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// apply applies Calico resources given as JSON objects with calicoctl, as an operator would.
func (w *world) apply(resources ...string) {
	w.t.Helper()
	w.calicoctl(strings.Join(resources, "\n---\n"), "apply", "-f", "-")
}

func poolRes(name, cidr string, blockSize int, extra string) string {
	return fmt.Sprintf(`{"apiVersion":"projectcalico.org/v3","kind":"IPPool","metadata":{"name":%q},"spec":{"cidr":%q,"blockSize":%d,"ipipMode":"Never","vxlanMode":"Never"%s}}`,
		name, cidr, blockSize, extra)
}

func nodeRes(name string, labels map[string]string) string {
	l, _ := json.Marshal(labels)
	return fmt.Sprintf(`{"apiVersion":"projectcalico.org/v3","kind":"Node","metadata":{"name":%q,"labels":%s},"spec":{}}`, name, l)
}

// runtime returns node's libcni runtime (one per node, as each node's kubelet has its own cache).
func (w *world) runtime(node string) *libcni.CNIConfig {
	w.mu.Lock()
	defer w.mu.Unlock()
	if c := w.cni[node]; c != nil {
		return c
	}
	exec := &invoke.DefaultExec{RawExec: &invoke.RawExec{Stderr: w.log}, PluginDecoder: version.PluginDecoder{}}
	c := libcni.NewCNIConfigWithCacheDir([]string{pluginDir}, filepath.Join(w.tmp, "cni-cache-"+node), exec)
	w.cni[node] = c
	return c
}

// daemon returns the socket of node's block-ipam daemon (in this process), starting it on first use;
// it stops when the test ends.
func (w *world) daemon(node string) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if s, ok := w.daemons[node]; ok {
		return s
	}
	d := ipamdtest.Start(w.t, ipamdtest.Options{Node: node, Endpoints: []string{w.ep}, Socket: filepath.Join(w.sockDir, node+".sock"), Log: w.log})
	w.daemons[node] = d.Socket
	return d.Socket
}

// families says which families an ADD assigns.
type families struct{ v4, v6 bool }

var v4only = families{v4: true}

// netList is the network configuration of plugin p on node: the same network name for both,
// calico-ipam with its per-node lock, block-ipam with its node's daemon, as on a node where one of them
// is installed.
func (w *world) netList(p plugin, node string, f families) *libcni.NetworkConfigList {
	w.t.Helper()
	b := func(v bool) string { return fmt.Sprint(v) }
	var conf map[string]any
	if p == calicoIPAM {
		conf = map[string]any{
			"type": "calico-ipam", "etcd_endpoints": w.ep, "datastore_type": "etcdv3", "nodename": node,
			"ipam_lock_file": filepath.Join(w.tmp, node+".calico-ipam.lock"), "log_level": "error",
			"ipam": map[string]any{"type": "calico-ipam", "assign_ipv4": b(f.v4), "assign_ipv6": b(f.v6)},
		}
	} else {
		conf = map[string]any{
			"type": "block-ipam",
			"ipam": map[string]any{"type": "block-ipam", "etcd_endpoints": w.ep, "nodename": node,
				"socket": w.daemon(node), "log_level": "warn", "timeout": "60s",
				"assign_ipv4": b(f.v4), "assign_ipv6": b(f.v6)},
		}
	}
	data, _ := json.Marshal(map[string]any{"cniVersion": "1.0.0", "name": network, "plugins": []any{conf}})
	l, err := libcni.NetworkConfFromBytes(data)
	if err != nil {
		w.t.Fatal(err)
	}
	return l
}

// rtConf is the runtime configuration a kubelet passes for pod cid (its pod name is cid too).
func rtConf(cid string, args ...[2]string) *libcni.RuntimeConf {
	base := [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", "default"}, {"K8S_POD_NAME", cid}, {"K8S_POD_INFRA_CONTAINER_ID", cid}}
	return &libcni.RuntimeConf{ContainerID: cid, IfName: "eth0", NetNS: "/var/run/netns/interop-" + cid, Args: append(base, args...)}
}

// add runs plugin p's ADD of pod cid on node and records the pod.
func (w *world) add(p plugin, node, cid string, f families, args ...[2]string) (*pod, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	res, err := w.runtime(node).AddNetworkList(ctx, w.netList(p, node, f), rtConf(cid, args...))
	if err != nil {
		return nil, fmt.Errorf("%s ADD %s on %s: %w", p, cid, node, err)
	}
	r, err := current.NewResultFromResult(res)
	if err != nil {
		return nil, err
	}
	pd := &pod{cid: cid, node: node, by: p}
	for _, ip := range r.IPs {
		a, _ := netip.AddrFromSlice(ip.Address.IP)
		pd.addrs = append(pd.addrs, a.Unmap())
	}
	w.mu.Lock()
	w.pods[cid] = pd
	w.mu.Unlock()
	return pd, nil
}

func (w *world) mustAdd(p plugin, node, cid string, f families, args ...[2]string) *pod {
	w.t.Helper()
	pd, err := w.add(p, node, cid, f, args...)
	if err != nil {
		w.t.Fatal(err)
	}
	return pd
}

// del runs plugin p's DEL of pod cid on node (which need not be the plugin that added it).
func (w *world) del(p plugin, node, cid string, f families) error {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if err := w.runtime(node).DelNetworkList(ctx, w.netList(p, node, f), rtConf(cid)); err != nil {
		return fmt.Errorf("%s DEL %s on %s: %w", p, cid, node, err)
	}
	w.mu.Lock()
	delete(w.pods, cid)
	w.mu.Unlock()
	return nil
}

func (w *world) mustDel(p plugin, node, cid string, f families) {
	w.t.Helper()
	if err := w.del(p, node, cid, f); err != nil {
		w.t.Fatal(err)
	}
}

// op is one ADD or DEL of a concurrent batch.
type op struct {
	del  bool
	p    plugin
	node string
	cid  string
	f    families
}

// run runs the operations all at once, each in its own plugin process, and fails on any error.
func (w *world) run(ops []op) {
	w.t.Helper()
	errs := make([]error, len(ops))
	var wg sync.WaitGroup
	for i, o := range ops {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if o.del {
				errs[i] = w.del(o.p, o.node, o.cid, o.f)
			} else {
				_, errs[i] = w.add(o.p, o.node, o.cid, o.f)
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			w.t.Error(err)
		}
	}
	if w.t.Failed() {
		w.t.FailNow()
	}
}

// syncEndpoints writes one Calico WorkloadEndpoint per live pod (what the calico CNI plugin would
// write beside its IPAM) and deletes the others: ipam check compares the allocations with them.
func (w *world) syncEndpoints() {
	w.t.Helper()
	const prefix = "/calico/resources/v3/projectcalico.org/workloadendpoints/default/"
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := w.cli.Delete(ctx, prefix, clientv3.WithPrefix()); err != nil {
		w.t.Fatal(err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, pd := range w.pods {
		if pd.noEndpoint {
			continue
		}
		var nets []string
		for _, a := range pd.addrs {
			nets = append(nets, calico.HostPrefix(a).String())
		}
		// Calico's name: <node>-k8s-<pod>-<endpoint> (node and pod names here have no dashes).
		name := pd.node + "-k8s-" + pd.cid + "-eth0"
		ipn, _ := json.Marshal(nets)
		val := fmt.Sprintf(`{"kind":"WorkloadEndpoint","apiVersion":"projectcalico.org/v3","metadata":{"name":%q,"namespace":"default","uid":"00000000-0000-4000-8000-%012x","creationTimestamp":"2026-01-01T00:00:00Z","labels":{"projectcalico.org/namespace":"default","projectcalico.org/orchestrator":"k8s"}},"spec":{"orchestrator":"k8s","node":%q,"containerID":%q,"pod":%q,"endpoint":"eth0","ipNetworks":%s,"interfaceName":"cali%s"}}`,
			name, len(name), pd.node, pd.cid, pd.cid, ipn, pd.cid)
		if _, err := w.cli.Put(ctx, prefix+name, val); err != nil {
			w.t.Fatal(err)
		}
	}
}

var problemsRe = regexp.MustCompile(`Check complete; found (\d+) problems`)
var missingHandlesRe = regexp.MustCompile(`Found (\d+) handles mentioned in blocks with no matching handle resource`)

// check runs `calicoctl ipam check` after syncing the WorkloadEndpoints and requires no problem and
// no allocation without its handle; then this project's own checker (no overlap, no address twice,
// handles equal to the allocations, affinities confirmed and matching), and that every live pod's
// addresses are allocated to it.
func (w *world) check() {
	w.t.Helper()
	w.syncEndpoints()
	out := w.calicoctl("", "ipam", "check", "--show-problem-ips")
	m := problemsRe.FindStringSubmatch(out)
	mh := missingHandlesRe.FindStringSubmatch(out)
	if m == nil || mh == nil || m[1] != "0" || mh[1] != "0" {
		w.t.Fatalf("calicoctl ipam check found problems:\n%s", out)
	}
	s := w.snapshot()
	byPlugin := map[plugin]int{}
	for _, a := range s.Allocations {
		// block-ipam's allocations carry its network attribute; calico-ipam's do not.
		if a.Secondary["network"] != "" {
			byPlugin[blockIPAM]++
		} else {
			byPlugin[calicoIPAM]++
		}
	}
	w.t.Logf("ipam check: %s; %d blocks, allocations by calico-ipam %d, by block-ipam %d",
		m[0], len(s.Blocks), byPlugin[calicoIPAM], byPlugin[blockIPAM])
	if err := s.Check(ipamcheck.Options{}); err != nil {
		w.t.Fatalf("datastore inconsistent after the scenario:\n%v", err)
	}
	held := map[netip.Addr]string{}
	for _, a := range s.Allocations {
		held[a.Addr] = a.Handle
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, pd := range w.pods {
		for _, a := range pd.addrs {
			n++
			if held[a] != network+"."+pd.cid {
				w.t.Errorf("pod %s (%s, node %s) has %s, which etcd gives to %q", pd.cid, pd.by, pd.node, a, held[a])
			}
		}
	}
	if n != len(s.Allocations) {
		w.t.Errorf("%d pod addresses, %d allocations", n, len(s.Allocations))
	}
	if w.t.Failed() {
		w.t.FailNow()
	}
}

// snapshot reads the IPAM state.
func (w *world) snapshot() *ipamcheck.Snapshot {
	w.t.Helper()
	return ipamcheck.MustRead(w.t, w.cli)
}

// blockOf returns the block holding a (the most specific), invalid when none.
func (w *world) blockOf(a netip.Addr) (netip.Prefix, *calico.Block) {
	s := w.snapshot()
	var best netip.Prefix
	for c := range s.Blocks {
		if c.Contains(a) && (!best.IsValid() || c.Bits() > best.Bits()) {
			best = c
		}
	}
	return best, s.Blocks[best]
}

// ownersOf returns the set of block owners ("" for none) holding the pods' addresses.
func (w *world) ownersOf(pods ...*pod) []string {
	var out []string
	for _, pd := range pods {
		for _, a := range pd.addrs {
			_, b := w.blockOf(a)
			o := ""
			if b != nil {
				o = calico.OwnerOf(b, false).Node
			}
			if !slices.Contains(out, o) {
				out = append(out, o)
			}
		}
	}
	slices.Sort(out)
	return out
}
