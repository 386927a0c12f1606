package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/cni"
	"github.com/vpp-route-agent/vpp-route-agent/internal/calicotest"
	"github.com/vpp-route-agent/vpp-route-agent/internal/etcdconfig"
	"github.com/vpp-route-agent/vpp-route-agent/internal/etcdtest"
	"github.com/vpp-route-agent/vpp-route-agent/internal/ipamcall"
	"github.com/vpp-route-agent/vpp-route-agent/internal/logging"
	"net/netip"
)

func env(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

// TestBadSettingsRefused: every bad flag or environment value fails before any connection, naming
// the setting, and a password in an endpoint URL is never echoed.
func TestBadSettingsRefused(t *testing.T) {
	pki := etcdtest.NewPKI(t, t.TempDir())
	base := []string{"--socket", "/run/x.sock"}
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"--nodename", "a/b"}, nil, "contains '/'"},
		{[]string{"--nodename", "node\x07"}, nil, "control"},
		{nil, map[string]string{"NODENAME": "x y"}, "--nodename"},
		{[]string{"--metrics-address", "127.0.0.1:70000"}, nil, "--metrics-address"},
		{[]string{"--metrics-address", "example.com:9483"}, nil, "not an IP address"},
		{[]string{"--etcd-endpoints", "http://127.0.0.1:99999"}, nil, "not in 1-65535"},
		{[]string{"--etcd-endpoints", "http://127.0.0.1:2379", "--etcd-ca-cert-file", pki.CA}, nil, "--etcd-ca-cert-file is set but --etcd-endpoints are http://"},
		{[]string{"--etcd-endpoints", "https://ipam:hunter2@127.0.0.1:2379"}, nil, "carries credentials"},
		{[]string{"--etcd-username", "ipam"}, nil, "no password"},
		{[]string{"--socket", "run/x.sock"}, nil, "--socket"},
		{[]string{"--socket", "/run/" + strings.Repeat("x", 103)}, nil, "longer than a unix socket path may be (107)"},
		// --socket-group could not work under the shipped unit (no chown) and DaemonSet (no CAP_CHOWN):
		// removed, and refused rather than ignored.
		{[]string{"--socket-group", "0"}, nil, "--socket-group (BLOCK_IPAM_SOCKET_GROUP) was removed"},
		{nil, map[string]string{"BLOCK_IPAM_SOCKET_GROUP": "root"}, "--socket-group (BLOCK_IPAM_SOCKET_GROUP) was removed"},
		{[]string{"--max-connections", "0"}, nil, "--max-connections"},
		{[]string{"--log-level", "loud"}, nil, "--log-level"},
		{[]string{"extra"}, nil, "unexpected arguments"},
		{[]string{"--liveness-ttl", "1s"}, nil, "--liveness-ttl 1s: a whole number of seconds, at least 2s"},
		{[]string{"--release-dead-nodes-after", "30s"}, nil, "--release-dead-nodes-after 30s: 0 (off), or at least twice --liveness-ttl (30s)"},
		{nil, map[string]string{"BLOCK_IPAM_RELEASE_DEAD_NODES_AFTER": "soon"}, "BLOCK_IPAM_RELEASE_DEAD_NODES_AFTER"},
		{[]string{"--liveness-ttl", "2500ms"}, nil, "--liveness-ttl"},
		{nil, map[string]string{"BLOCK_IPAM_LIVENESS_TTL": "0s"}, "--liveness-ttl"},
		{[]string{"--capacity-interval", "10ms"}, nil, "--capacity-interval"},
	} {
		args := append(append([]string{}, base...), tc.args...)
		var stderr bytes.Buffer
		e := map[string]string{"NODENAME": "node1"}
		for k, v := range tc.env {
			e[k] = v
		}
		_, err := parseFlags(args, &stderr, env(e))
		if err == nil || !errors.As(err, new(usageError)) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v %v: %v, want a usage error with %q", tc.args, tc.env, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error()+stderr.String(), "hunter2") {
			t.Errorf("the password is echoed: %v", err)
		}
	}
	// The environment: Calico's names, then BLOCK_IPAM_<FLAG>.
	cfg, err := parseFlags(nil, io.Discard, env(map[string]string{"NODENAME": "n7", "ETCD_ENDPOINTS": "http://127.0.0.1:1",
		"BLOCK_IPAM_SOCKET": "/run/y.sock", "BLOCK_IPAM_METRICS_ADDRESS": ""}))
	if err != nil || cfg.node != "n7" || cfg.socket != "/run/y.sock" || cfg.etcd.Endpoints[0] != "http://127.0.0.1:1" || cfg.metricsAddress != defaultMetricsAddress {
		t.Errorf("environment: %+v %v", cfg, err)
	}
}

// TestWrongCAFailsAtOnce: a CA that does not verify etcd's certificate stops the daemon at start with
// a certificate error naming the flag, well before any request deadline.
func TestWrongCAFailsAtOnce(t *testing.T) {
	dir := t.TempDir()
	pki := etcdtest.NewPKI(t, dir)
	ep := etcdtest.StartTLS(t, pki, dir)
	start := time.Now()
	err := run(t.Context(), []string{"--nodename", "n1", "--socket", filepath.Join(dir, "s.sock"), "--metrics-address", "",
		"--etcd-endpoints", ep, "--etcd-ca-cert-file", pki.OtherCA, "--etcd-cert-file", pki.ClientCert, "--etcd-key-file", pki.ClientKey},
		io.Discard, env(nil))
	if !errors.Is(err, etcdconfig.ErrCertificate) || !strings.Contains(err.Error(), "--etcd-ca-cert-file") {
		t.Fatalf("wrong CA: %v", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("took %s", d)
	}
}

var metricsAddrRe = regexp.MustCompile(`serving metrics and health.*address=(\S+)`)

// TestDaemonOverMutualTLS: the daemon reaches etcd over mutual TLS, serves an ADD on its 0600 socket,
// exposes its metrics and health on loopback, and removes its socket when stopped.
func TestDaemonOverMutualTLS(t *testing.T) {
	dir := t.TempDir()
	pki := etcdtest.NewPKI(t, dir)
	ep := etcdtest.StartTLS(t, pki, dir)
	ec := etcdconfig.Config{Endpoints: []string{ep}, CACertFile: pki.CA, CertFile: pki.ClientCert, KeyFile: pki.ClientKey,
		DialTimeout: 5 * time.Second, RequestTimeout: 5 * time.Second}
	cli, err := ec.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if err := calicotest.PutPool(t.Context(), cli, calico.IPPool{Name: "p", CIDR: netip.MustParsePrefix("10.244.0.0/16"), BlockSize: 26}); err != nil {
		t.Fatal(err)
	}
	sockDir, _ := os.MkdirTemp("", "bi")
	defer os.RemoveAll(sockDir)
	sock := filepath.Join(sockDir, "block-ipam.sock")
	ctx, cancel := context.WithCancel(context.Background())
	var logs logging.Buffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--nodename", "n1", "--socket", sock, "--metrics-address", "127.0.0.1:0",
			"--etcd-endpoints", ep, "--etcd-ca-cert-file", pki.CA, "--etcd-cert-file", pki.ClientCert, "--etcd-key-file", pki.ClientKey},
			&logs, env(nil))
	}()
	var reply *cni.Reply
	deadline := time.Now().Add(20 * time.Second)
	for {
		cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
		reply, err = ipamcall.Call(cctx, sock, &cni.Request{Verb: "ADD", ContainerID: "c1", IfName: "eth0", Network: "net1", Assign: [2]bool{true, false}})
		ccancel()
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil || reply.Err() != nil || len(reply.Allocations) != 1 || reply.Node != "n1" {
		t.Fatalf("ADD: %+v %v\n%s", reply, err, logs.String())
	}
	if st, _ := os.Stat(sock); st.Mode().Perm() != 0o600 {
		t.Errorf("socket mode %v", st.Mode().Perm())
	}
	m := metricsAddrRe.FindStringSubmatch(logs.String())
	if m == nil || !strings.HasPrefix(m[1], "127.0.0.1:") {
		t.Fatalf("no loopback metrics address logged:\n%s", logs.String())
	}
	for path, want := range map[string]string{"/metrics": `block_ipam_requests_total{result="ok",verb="ADD"} 1`, "/readyz": "ok", "/healthz": "ok"} {
		resp, err := http.Get("http://" + m[1] + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(body), want) {
			t.Errorf("%s: %d, want %q in\n%s", path, resp.StatusCode, want, body)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("stop: %v", err)
	}
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Errorf("socket left after stop: %v", err)
	}
}

// TestBusyMetricsAddressFailsBeforeEtcd: a metrics address that cannot be bound stops the daemon,
// naming the flag, before it opens any connection to etcd.
func TestBusyMetricsAddressFailsBeforeEtcd(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	etcd, err := net.Listen("tcp", "127.0.0.1:0") // stands for etcd: counts the connections it is offered
	if err != nil {
		t.Fatal(err)
	}
	defer etcd.Close()
	var accepted atomic.Int64
	go func() {
		for {
			c, err := etcd.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			c.Close()
		}
	}()
	dir := t.TempDir()
	err = run(t.Context(), []string{"--nodename", "n1", "--socket", filepath.Join(dir, "s.sock"),
		"--metrics-address", busy.Addr().String(), "--etcd-endpoints", "http://" + etcd.Addr().String()},
		io.Discard, env(nil))
	if err == nil || !strings.Contains(err.Error(), "--metrics-address") {
		t.Fatalf("busy metrics address: %v, want an error naming --metrics-address", err)
	}
	if n := accepted.Load(); n != 0 {
		t.Errorf("%d connections to etcd before the metrics address was refused", n)
	}
	if _, err := os.Stat(filepath.Join(dir, "s.sock")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket left behind: %v", err)
	}
}

// TestHTTPSAgainstPlaintextFailsAtOnce: an https:// endpoint where etcd speaks plaintext stops the
// daemon at start with an error naming TLS, not request deadlines forever.
func TestHTTPSAgainstPlaintextFailsAtOnce(t *testing.T) {
	dir := t.TempDir()
	pki := etcdtest.NewPKI(t, dir)
	srv, _ := etcdtest.Start(t)
	ep := strings.Replace(srv.Endpoint(), "http://", "https://", 1)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	err := run(ctx, []string{"--nodename", "n1", "--socket", filepath.Join(dir, "s.sock"), "--metrics-address", "",
		"--etcd-endpoints", ep, "--etcd-ca-cert-file", pki.CA}, io.Discard, env(nil))
	if !errors.Is(err, etcdconfig.ErrNotTLS) || !strings.Contains(err.Error(), "TLS") {
		t.Fatalf("https:// against plaintext etcd: %v", err)
	}
}

// daemonRun is one block-ipamd run in the test process.
type daemonRun struct {
	cancel  context.CancelFunc
	done    chan struct{} // closed when run has returned err
	err     error
	logs    *logging.Buffer
	metrics string
}

// wait returns run's error once it has returned.
func (d *daemonRun) wait() error {
	<-d.done
	return d.err
}

// startDaemon runs block-ipamd on sock against etcd at ep and waits for its metrics address.
func startDaemon(t *testing.T, ep, sock string) *daemonRun {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	d := &daemonRun{cancel: cancel, done: make(chan struct{}), logs: &logging.Buffer{}}
	go func() {
		defer close(d.done)
		d.err = run(ctx, []string{"--nodename", "n1", "--socket", sock, "--metrics-address", "127.0.0.1:0", "--etcd-endpoints", ep}, d.logs, env(nil))
	}()
	t.Cleanup(func() {
		cancel()
		d.wait()
	})
	for end := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if m := metricsAddrRe.FindStringSubmatch(d.logs.String()); m != nil {
			d.metrics = m[1]
			return d
		}
		if time.Now().After(end) {
			t.Fatalf("no metrics address logged:\n%s", d.logs.String())
		}
	}
}

// get returns the status and body of one of the daemon's HTTP paths.
func (d *daemonRun) get(t *testing.T, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + d.metrics + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// addOn asks the daemon at sock for an address for container cid, retrying while it starts.
func addOn(t *testing.T, sock, cid string) error {
	t.Helper()
	var err error
	for end := time.Now().Add(20 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		var reply *cni.Reply
		reply, err = ipamcall.Call(ctx, sock, &cni.Request{Verb: "ADD", ContainerID: cid, IfName: "eth0", Network: "net1", Assign: [2]bool{true, false}})
		cancel()
		if err == nil {
			if err = reply.Err(); err == nil {
				return nil
			}
		}
	}
	return err
}

// TestStoppingDaemonLeavesSuccessorsSocket: a daemon that stops while a plugin holds a connection, with
// a new daemon started on the same path meanwhile (a rolling or a systemd restart), leaves the new
// daemon's socket in place; and a daemon whose socket is gone says so on /readyz.
func TestStoppingDaemonLeavesSuccessorsSocket(t *testing.T) {
	_, cli := etcdtest.Start(t)
	if err := calicotest.PutPool(t.Context(), cli, calico.IPPool{Name: "p", CIDR: netip.MustParsePrefix("10.244.0.0/16"), BlockSize: 26}); err != nil {
		t.Fatal(err)
	}
	ep := cli.Endpoints()[0]
	sockDir, _ := os.MkdirTemp("", "bi")
	defer os.RemoveAll(sockDir)
	sock := filepath.Join(sockDir, "block-ipam.sock")

	old := startDaemon(t, ep, sock)
	if err := addOn(t, sock, "c1"); err != nil {
		t.Fatalf("ADD on the first daemon: %v", err)
	}
	// A plugin that has connected and not yet sent its request: the stopping daemon waits for it.
	held, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	// The daemon accepts in order: once an ADD connected after held is answered, held was accepted
	// (else the stop would drop it from the listen queue, and nothing would hold the daemon).
	if err := addOn(t, sock, "c0"); err != nil {
		t.Fatalf("ADD on the first daemon: %v", err)
	}
	old.cancel()
	// The old daemon no longer accepts; the new one starts on the same path meanwhile.
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		c, err := net.Dial("unix", sock)
		if err != nil {
			break
		}
		c.Close()
		if time.Now().After(end) {
			t.Fatal("the stopping daemon still accepts connections")
		}
	}
	select {
	case <-old.done:
		t.Fatalf("the old daemon stopped before its connection ended: %v", old.err)
	case <-time.After(100 * time.Millisecond):
	}
	succ := startDaemon(t, ep, sock)
	if err := addOn(t, sock, "c2"); err != nil {
		t.Fatalf("ADD on the new daemon: %v", err)
	}
	held.Close()
	if err := old.wait(); err != nil {
		t.Fatalf("the old daemon's stop: %v", err)
	}
	if err := addOn(t, sock, "c3"); err != nil {
		t.Fatalf("ADD on the new daemon after the old one stopped: %v\n%s", err, old.logs.String())
	}
	if code, body := succ.get(t, "/readyz"); code != 200 {
		t.Fatalf("/readyz of the new daemon: %d %s", code, body)
	}
	// Its socket gone, the daemon is not ready, and says why.
	if err := os.Remove(sock); err != nil {
		t.Fatal(err)
	}
	if code, body := succ.get(t, "/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, sock+" is gone") {
		t.Errorf("/readyz with the socket removed: %d %s", code, body)
	}
}
