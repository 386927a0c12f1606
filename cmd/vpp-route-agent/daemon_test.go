package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/internal/calicotest"
	"github.com/vpp-route-agent/vpp-route-agent/internal/etcdconfig"
	"github.com/vpp-route-agent/vpp-route-agent/internal/etcdtest"
	"github.com/vpp-route-agent/vpp-route-agent/test/vppsim"
)

// TestDaemonNotifiesSystemdAfterFirstResync runs the daemon in-process with NOTIFY_SOCKET set, and
// checks that READY=1 arrives only once the routes are in the FIB, then STOPPING=1 on cancel.
func TestDaemonNotifiesSystemdAfterFirstResync(t *testing.T) {
	dir, err := os.MkdirTemp("", "dn")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	notify, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: filepath.Join(dir, "notify"), Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer notify.Close()
	t.Setenv("NOTIFY_SOCKET", filepath.Join(dir, "notify"))

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sim, sock, srv := daemonWorld(ctx, t, dir, 50)

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- run(runCtx, []string{"--nodename", "me", "--etcd-endpoints", srv.Endpoint(), "--vpp-api-socket", sock,
			"--uplink-interface", vppsim.DefaultInterface, "--uplink-address", "192.0.2.1/24", "--metrics-address", "",
			"--log-level", "error"}, &bytes.Buffer{}, &bytes.Buffer{}, env(nil))
	}()
	buf := make([]byte, 256)
	notify.SetReadDeadline(time.Now().Add(20 * time.Second))
	n, err := notify.Read(buf)
	if err != nil {
		t.Fatalf("no notification: %v", err)
	}
	if !strings.HasPrefix(string(buf[:n]), "READY=1") {
		t.Fatalf("first notification %q, want READY=1", buf[:n])
	}
	if got := len(sim.APIRoutes(0)); got < 50 {
		t.Errorf("READY=1 sent with %d of 50 routes in the FIB", got)
	}
	stop()
	notify.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err = notify.Read(buf); err != nil || string(buf[:n]) != "STOPPING=1" {
		t.Errorf("after cancel: %q, %v; want STOPPING=1", buf[:n], err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("daemon: %v", err)
		}
	case <-time.After(shutdownLimit + 5*time.Second):
		t.Fatal("daemon did not stop")
	}
	if got := len(sim.APIRoutes(0)); got < 50 {
		t.Errorf("routes withdrawn on a normal stop: %d left", got)
	}
}

// daemonWorld starts a VPP simulator listening in dir and an etcd holding a pool and n blocks of node
// "other", which is registered; both stop when the test ends.
func daemonWorld(ctx context.Context, t *testing.T, dir string, n int) (*vppsim.Sim, string, *etcdtest.Server) {
	t.Helper()
	sim, err := vppsim.New(vppsim.Config{})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "vpp.sock")
	if err := sim.Listen(sock); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	srv, cli := etcdtest.Start(t)
	if _, err := calicotest.PutBlocks(ctx, cli, n, func(int) string { return "other" }); err != nil {
		t.Fatal(err)
	}
	if err := calicotest.PutPeer(ctx, cli, "/vpp-calico/hosts/", "other", netip.MustParseAddr("192.0.2.2")); err != nil {
		t.Fatal(err)
	}
	if err := calicotest.PutPool(ctx, cli, calico.IPPool{Name: "p", CIDR: netip.MustParsePrefix("10.0.0.0/8"), BlockSize: 26}); err != nil {
		t.Fatal(err)
	}
	return sim, sock, srv
}

// TestDaemonServesOnLoopbackAndProbeAnswers: by default the HTTP server listens on loopback only; the
// probe subcommand (the DaemonSet's exec probes) reads /readyz from it, and /debug/routes answers
// from the published state.
func TestDaemonServesOnLoopbackAndProbeAnswers(t *testing.T) {
	cfg, err := parseDaemonFlags(base, &bytes.Buffer{}, &bytes.Buffer{}, env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if host, _, _ := net.SplitHostPort(cfg.metricsAddress); !netip.MustParseAddr(host).IsLoopback() {
		t.Errorf("default --metrics-address %s is not loopback", cfg.metricsAddress)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, sock, srv := daemonWorld(ctx, t, t.TempDir(), 5)
	port, err := etcdtest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- run(runCtx, []string{"--nodename", "me", "--etcd-endpoints", srv.Endpoint(), "--vpp-api-socket", sock,
			"--uplink-interface", vppsim.DefaultInterface, "--uplink-address", "192.0.2.1/24", "--metrics-address", addr,
			"--log-level", "error"}, &bytes.Buffer{}, &bytes.Buffer{}, env(nil))
	}()
	defer func() { stop(); <-done }()
	probeEnv := env(map[string]string{"VPP_ROUTE_AGENT_METRICS_ADDRESS": addr}) // as the DaemonSet's probes see it
	deadline := time.Now().Add(20 * time.Second)
	for {
		var out bytes.Buffer
		err := run(ctx, []string{"probe", "/readyz"}, &out, &bytes.Buffer{}, probeEnv)
		if err == nil && strings.TrimSpace(out.String()) == "ready" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("probe /readyz: %v %q", err, out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	var out bytes.Buffer
	if err := run(ctx, []string{"probe", "--metrics-address", addr, "/debug/routes"}, &out, &bytes.Buffer{}, env(nil)); err != nil {
		t.Fatal(err)
	}
	var d struct {
		Desired []json.RawMessage `json:"desired"`
		Held    []json.RawMessage `json:"held"`
	}
	if err := json.Unmarshal(out.Bytes(), &d); err != nil || len(d.Desired) != 5 || d.Held == nil {
		t.Errorf("/debug/routes: %v, %d desired, held %v:\n%s", err, len(d.Desired), d.Held, out.String())
	}
	if err := run(ctx, []string{"probe", "--metrics-address", addr, "/nonexistent"}, &bytes.Buffer{}, &bytes.Buffer{}, env(nil)); err == nil {
		t.Error("probe of a missing path succeeded")
	}
}

// TestDaemonFailsAtOnceOnCertificateErrors: an etcd whose certificate the CA file does not verify is a
// start-up error that names the flag, not a stream of request deadlines; the password is never logged.
func TestDaemonFailsAtOnceOnCertificateErrors(t *testing.T) {
	pki := etcdtest.NewPKI(t, t.TempDir())
	ln := pki.ServeTLS(t, "127.0.0.1:0", false)
	// The daemon logs to the process's stderr: capture it.
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	orig := os.Stderr
	os.Stderr = w
	logged := make(chan string)
	go func() { b, _ := io.ReadAll(r); logged <- string(b) }()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = run(ctx, append(slices.Clone(base), "--etcd-endpoints", "https://"+ln.Addr().String(), "--etcd-ca-cert-file", pki.OtherCA,
		"--etcd-dial-timeout", "10s", "--log-level", "debug", "--metrics-address", ""),
		&bytes.Buffer{}, &bytes.Buffer{}, env(map[string]string{"ETCD_USERNAME": "agent", "ETCD_PASSWORD": "s3cret-pw"}))
	os.Stderr = orig
	w.Close()
	log := <-logged
	if err == nil || !strings.Contains(err.Error(), "server certificate not trusted (check --etcd-ca-cert-file)") {
		t.Errorf("err = %v, want a certificate error naming --etcd-ca-cert-file", err)
	}
	if strings.Contains(log, "s3cret-pw") || (err != nil && strings.Contains(err.Error(), "s3cret-pw")) {
		t.Errorf("the password was logged:\n%s", log)
	}
	if !strings.Contains(log, "etcd_user=agent") {
		t.Errorf("start-up line does not name the etcd user:\n%s", log)
	}
}

// TestDaemonReportsLaterCertificateErrors: etcd is down at start (the daemon keeps trying), then comes
// up with a certificate the CA file does not verify: the daemon logs that at ERROR, as a certificate
// problem naming the flag, instead of only failing requests by deadline.
func TestDaemonReportsLaterCertificateErrors(t *testing.T) {
	pki := etcdtest.NewPKI(t, t.TempDir())
	port, err := etcdtest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	defer func(d time.Duration) { certCheckInterval = d }(certCheckInterval)
	certCheckInterval = 100 * time.Millisecond

	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	orig := os.Stderr
	os.Stderr = w
	defer func() { os.Stderr = orig }()
	lines := make(chan string, 100)
	go func() {
		buf := make([]byte, 64<<10)
		for {
			n, err := r.Read(buf)
			if n > 0 {
				lines <- string(buf[:n])
			}
			if err != nil {
				close(lines)
				return
			}
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, append(slices.Clone(base), "--etcd-endpoints", "https://"+addr, "--etcd-ca-cert-file", pki.OtherCA,
			"--metrics-address", "", "--vpp-api-socket", filepath.Join(t.TempDir(), "none.sock")), &bytes.Buffer{}, &bytes.Buffer{}, env(nil))
	}()
	defer func() { cancel(); <-done; w.Close() }()

	time.Sleep(300 * time.Millisecond) // the daemon runs on, etcd unreachable
	pki.ServeTLS(t, addr, false)
	deadline := time.After(20 * time.Second)
	var seen strings.Builder
	for {
		select {
		case l := <-lines:
			seen.WriteString(l)
			if strings.Contains(seen.String(), "level=ERROR") && strings.Contains(seen.String(), "check --etcd-ca-cert-file") {
				return
			}
		case <-deadline:
			t.Fatalf("no ERROR naming the certificate problem:\n%s", seen.String())
		}
	}
}

// TestDaemonFailsAtOnceOnPlaintextEtcd: an https:// endpoint where etcd speaks plaintext stops the
// daemon at start with an error naming TLS, not request deadlines forever.
func TestDaemonFailsAtOnceOnPlaintextEtcd(t *testing.T) {
	pki := etcdtest.NewPKI(t, t.TempDir())
	srv, _ := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err := run(ctx, append(slices.Clone(base), "--etcd-endpoints", strings.Replace(srv.Endpoint(), "http://", "https://", 1),
		"--etcd-ca-cert-file", pki.CA, "--metrics-address", ""), &bytes.Buffer{}, &bytes.Buffer{}, env(nil))
	if !errors.Is(err, etcdconfig.ErrNotTLS) || !strings.Contains(err.Error(), "TLS") {
		t.Fatalf("https:// against plaintext etcd: %v", err)
	}
}
