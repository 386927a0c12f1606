package cni_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/cni"
	"github.com/vpp-route-agent/vpp-route-agent/internal/etcdtest"
	"github.com/vpp-route-agent/vpp-route-agent/internal/ipamcheck"
	"github.com/vpp-route-agent/vpp-route-agent/internal/ipamdtest"
)

// pluginDir holds the block-ipam binary built once for the whole test binary.
var pluginDir string

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	if sock := os.Getenv(attackSockEnv); sock != "" {
		return runAttacker(sock) // this binary started as TestSocketAttackWithinMemoryLimit's attacker
	}
	dir, err := os.MkdirTemp("", "block-ipam-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	if err := buildPlugin(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	pluginDir = dir
	return m.Run()
}

// buildFlags are those of the Makefile's release build; the benchmark builds host-local with them too.
var buildFlags = []string{"-trimpath", "-ldflags=-s -w"}

// buildPlugin builds cmd/block-ipam and cmd/block-ipamd into dir as a runtime would install them (no
// race detector: the plugin is a short single-threaded process, and tests run it by the hundred; the
// daemon runs in the test process with it wherever a test does not need a process to kill).
func buildPlugin(dir string) error {
	args := append(append([]string{"build"}, buildFlags...), "-o", dir+"/",
		"github.com/vpp-route-agent/vpp-route-agent/cmd/block-ipam", "github.com/vpp-route-agent/vpp-route-agent/cmd/block-ipamd")
	cmd := exec.Command("go", args...)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build block-ipam: %v\n%s", err, out)
	}
	for _, name := range []string{"block-ipam", "block-ipamd"} {
		if err := rewrite(filepath.Join(dir, name)); err != nil {
			return err
		}
	}
	return nil
}

// rewrite writes a binary anew through write(2), as a node gets it (`block-ipam install`, an image
// layer, a package). The linker writes its output through a shared mapping, and a process executed
// from those page-cache pages costs more CPU to start: on the 2-core test machine, 1.79-1.81 against
// 1.56-1.57 ms for block-ipam's VERSION (three builds and their copies, 300 runs each), and 0.17 ms
// more for host-local's. The benchmark rewrites both plugins.
func rewrite(path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, st.Mode().Perm()); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// env is one test's world: an embedded etcd, a client of it, one block-ipam daemon per node (started
// on first use, in this process), and a libcni runtime.
type env struct {
	t    *testing.T
	srv  *etcdtest.Server
	cli  *clientv3.Client
	cni  *libcni.CNIConfig
	tmp  string
	opts ipamcheck.Options
	// sockDir holds the daemons' sockets (short: a unix socket path has at most 107 bytes).
	sockDir string

	mu      sync.Mutex // guards daemons and calls
	daemons map[string]*ipamdtest.Daemon
	// calls are the requests every daemon answered, in order, with the daemon's figures.
	calls []daemonCall
}

// daemonCall is one request a daemon answered, and its reply.
type daemonCall struct {
	node, verb, container string
	reply                 cni.Reply
}

// served returns the calls of the given verbs the daemons answered so far, in order.
func (e *env) served(verbs ...string) []daemonCall {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []daemonCall
	for _, c := range e.calls {
		if slices.Contains(verbs, c.verb) {
			out = append(out, c)
		}
	}
	return out
}

// newEnv starts etcd and, when the test ends, stops the daemons and checks every IPAM invariant of
// what is left in etcd.
func newEnv(t *testing.T) *env {
	t.Helper()
	srv, cli := etcdtest.Start(t)
	e := &env{t: t, srv: srv, cli: cli, tmp: t.TempDir(), daemons: map[string]*ipamdtest.Daemon{}, sockDir: ipamdtest.SocketDir(t)}
	e.cni = newRuntime(filepath.Join(e.tmp, "cache"))
	// Cleanups run last first: the daemons (registered later) stop before this check.
	t.Cleanup(e.checkInvariants)
	return e
}

// socket returns the socket of node's daemon, starting the daemon on first use.
func (e *env) socket(node string) string {
	e.t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	if d := e.daemons[node]; d != nil {
		return d.Socket
	}
	d := e.startDaemon(node, node, nil)
	e.daemons[node] = d
	return d.Socket
}

// startDaemon starts a daemon for node on the socket <name>.sock, with an optional pause hook, until
// the test ends.
func (e *env) startDaemon(name, node string, pause func(context.Context)) *ipamdtest.Daemon {
	e.t.Helper()
	return e.startDaemonWith(name, node, []string{e.srv.Endpoint()}, pause)
}

// startDaemonWith is startDaemon with the etcd endpoints of the daemon's client.
func (e *env) startDaemonWith(name, node string, endpoints []string, pause func(context.Context)) *ipamdtest.Daemon {
	e.t.Helper()
	observe := func(req *cni.Request, r *cni.Reply) {
		e.mu.Lock()
		e.calls = append(e.calls, daemonCall{node: node, verb: req.Verb, container: req.ContainerID, reply: *r})
		e.mu.Unlock()
	}
	return ipamdtest.Start(e.t, ipamdtest.Options{Node: node, Endpoints: endpoints, Socket: filepath.Join(e.sockDir, name+".sock"), Pause: pause, Observe: observe})
}

// restartDaemon stops node's daemon; the next socket(node) starts a new one with empty caches.
func (e *env) restartDaemon(node string) {
	e.mu.Lock()
	d := e.daemons[node]
	delete(e.daemons, node)
	e.mu.Unlock()
	if d != nil {
		d.Stop()
	}
}

// checkInvariants fails the test when the datastore breaks any invariant (see ipamcheck), and checks
// that the route agent's reading of every block (decode, validate, owner, borrowed addresses) agrees
// with what the allocations say.
func (e *env) checkInvariants() {
	e.t.Helper()
	if e.t.Failed() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, kvs, err := ipamcheck.Read(ctx, e.cli)
	if err != nil {
		e.t.Errorf("invariants: %v", err)
		return
	}
	if err := s.Check(e.opts); err != nil {
		e.t.Errorf("invariants broken:\n%v", err)
	}
	checkAgentView(e.t, kvs, s)
}

// checkAgentView reads every block as the route agent does: calico.DecodeBlock, Validate, OwnerOf,
// BorrowedAddrs; the borrowed /32s must be exactly the allocations whose node differs from the owner.
func checkAgentView(t *testing.T, kvs map[string][]byte, s *ipamcheck.Snapshot) {
	t.Helper()
	want := map[netip.Addr]string{}
	for _, a := range s.Allocations {
		if a.Node != "" && a.Node != a.Owner {
			want[a.Addr] = a.Node
		}
	}
	got := map[netip.Addr]string{}
	for key, val := range kvs {
		k, err := calico.ParseKey(key)
		if err != nil || k.Kind != calico.KindBlock {
			continue
		}
		b, err := calico.DecodeBlock(val)
		if err != nil {
			t.Errorf("agent cannot decode %s: %v", key, err)
			continue
		}
		if err := b.Validate(); err != nil {
			t.Errorf("agent rejects %s: %v", key, err)
		}
		o := calico.OwnerOf(b, false)
		if b.Affinity != nil && !o.IsNode() && strings.HasPrefix(*b.Affinity, "host:") {
			t.Errorf("block %s: affinity %q gives no owner", key, *b.Affinity)
		}
		for _, br := range calico.BorrowedAddrs(b, o) {
			got[br.Addr] = br.Node
		}
	}
	if len(got) != len(want) {
		t.Errorf("agent sees borrowed %v, allocations say %v", got, want)
	}
	for a, n := range want {
		if got[a] != n {
			t.Errorf("borrowed %s: agent routes it to %q, allocation says %q", a, got[a], n)
		}
	}
}

// newRuntime returns a libcni runtime with its own result cache. Its exec is set here: libcni's lazy
// default is not safe for concurrent calls.
func newRuntime(cacheDir string) *libcni.CNIConfig {
	exec := &invoke.DefaultExec{RawExec: &invoke.RawExec{Stderr: os.Stderr}, PluginDecoder: version.PluginDecoder{}}
	return libcni.NewCNIConfigWithCacheDir([]string{pluginDir}, cacheDir, exec)
}

// netOpts builds a network configuration list for block-ipam as the only plugin.
type netOpts struct {
	name       string
	cniVersion string
	ipam       map[string]any
	top        map[string]any // extra top-level plugin keys
	caps       map[string]bool
}

// ipam returns the ipam section every test starts from: the socket of node's daemon, warnings only,
// and Calico's etcd_endpoints and nodename as a calico-ipam configuration carries them (the shim
// ignores the former and the daemon checks the latter).
func (e *env) ipam(node string, extra map[string]any) map[string]any {
	m := map[string]any{
		"type":           "block-ipam",
		"socket":         e.socket(node),
		"etcd_endpoints": e.srv.Endpoint(),
		"nodename":       node,
		"log_level":      "warn",
		"timeout":        "20s",
	}
	for k, v := range extra {
		if v == nil {
			delete(m, k)
			continue
		}
		m[k] = v
	}
	return m
}

func (e *env) list(o netOpts) *libcni.NetworkConfigList {
	e.t.Helper()
	if o.name == "" {
		o.name = "net1"
	}
	if o.cniVersion == "" {
		o.cniVersion = "1.1.0"
	}
	plugin := map[string]any{"type": "block-ipam", "ipam": o.ipam}
	for k, v := range o.top {
		plugin[k] = v
	}
	if o.caps != nil {
		plugin["capabilities"] = o.caps
	}
	data, err := json.Marshal(map[string]any{"cniVersion": o.cniVersion, "name": o.name, "plugins": []any{plugin}})
	if err != nil {
		e.t.Fatal(err)
	}
	list, err := libcni.NetworkConfFromBytes(data)
	if err != nil {
		e.t.Fatalf("conflist: %v\n%s", err, data)
	}
	return list
}

// rt is a runtime configuration for container cid, interface ifname, in a netns that does not exist.
func rt(cid, ifname string, args ...[2]string) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{ContainerID: cid, IfName: ifname, NetNS: "/var/run/netns/test-" + cid, Args: args}
}

func (e *env) add(list *libcni.NetworkConfigList, r *libcni.RuntimeConf) (*current.Result, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := e.cni.AddNetworkList(ctx, list, r)
	if err != nil {
		return nil, err
	}
	return current.NewResultFromResult(res)
}

func (e *env) mustAdd(list *libcni.NetworkConfigList, r *libcni.RuntimeConf) *current.Result {
	e.t.Helper()
	res, err := e.add(list, r)
	if err != nil {
		e.t.Fatalf("ADD %s/%s: %v", r.ContainerID, r.IfName, err)
	}
	return res
}

func (e *env) del(list *libcni.NetworkConfigList, r *libcni.RuntimeConf) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	return e.cni.DelNetworkList(ctx, list, r)
}

func (e *env) mustDel(list *libcni.NetworkConfigList, r *libcni.RuntimeConf) {
	e.t.Helper()
	if err := e.del(list, r); err != nil {
		e.t.Fatalf("DEL %s/%s: %v", r.ContainerID, r.IfName, err)
	}
}

// addrs returns the result's addresses as prefixes.
func addrs(r *current.Result) []netip.Prefix {
	var out []netip.Prefix
	for _, ip := range r.IPs {
		a, _ := netip.AddrFromSlice(ip.Address.IP)
		ones, _ := ip.Address.Mask.Size()
		out = append(out, netip.PrefixFrom(a.Unmap(), ones))
	}
	return out
}

// codeOf returns the CNI error code of err (0 when it is not a CNI error).
func codeOf(err error) uint {
	var te *types.Error
	if errors.As(err, &te) {
		return te.Code
	}
	return 0
}

func wantCode(t *testing.T, err error, code uint, substr string) {
	t.Helper()
	if err == nil {
		t.Fatalf("succeeded, want CNI error %d", code)
	}
	if codeOf(err) != code {
		t.Fatalf("error %v (code %d), want code %d", err, codeOf(err), code)
	}
	if substr != "" && !strings.Contains(err.Error(), substr) {
		t.Fatalf("error %q does not mention %q", err, substr)
	}
}

// putPool stores a Calico IPPool.
func (e *env) putPool(name, cidr string, blockSize int, mutate ...func(*calico.IPPool)) {
	e.t.Helper()
	p := calico.IPPool{Name: name, CIDR: netip.MustParsePrefix(cidr), BlockSize: blockSize}
	for _, m := range mutate {
		m(&p)
	}
	data, err := calico.EncodeIPPool(p)
	if err != nil {
		e.t.Fatal(err)
	}
	e.put(calico.IPPoolKey(name), data)
}

// putIPAMConfig stores Calico's IPAM configuration.
func (e *env) putIPAMConfig(c calico.IPAMConfig) {
	e.t.Helper()
	data, err := calico.EncodeIPAMConfig(c)
	if err != nil {
		e.t.Fatal(err)
	}
	e.put(calico.IPAMConfigKey, data)
}

func (e *env) put(key string, val []byte) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := e.cli.Put(ctx, key, string(val)); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) snapshot() *ipamcheck.Snapshot {
	e.t.Helper()
	return ipamcheck.MustRead(e.t, e.cli)
}

func (e *env) block(cidr string) *calico.Block {
	e.t.Helper()
	b := e.snapshot().Blocks[netip.MustParsePrefix(cidr)]
	if b == nil {
		e.t.Fatalf("block %s does not exist", cidr)
	}
	return b
}

// execPlugin runs the plugin binary directly, as a runtime does, and returns stdout, stderr and the
// error of the process.
func execPlugin(ctx context.Context, envv []string, stdin []byte) ([]byte, []byte, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(pluginDir, "block-ipam"))
	cmd.Env = envv
	cmd.Stdin = bytes.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	return out.Bytes(), errb.Bytes(), err
}

// pluginConf returns the stdin a runtime would give the plugin for this list (the only plugin's
// config with name and cniVersion injected).
func pluginConf(t testing.TB, list *libcni.NetworkConfigList) []byte {
	t.Helper()
	conf, err := libcni.InjectConf(list.Plugins[0], map[string]any{"name": list.Name, "cniVersion": list.CNIVersion})
	if err != nil {
		t.Fatal(err)
	}
	return conf.Bytes
}
