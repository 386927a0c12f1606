package main

import (
	"bytes"
	"context"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/internal/calicotest"
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

	sim, err := vppsim.New(vppsim.Config{})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "vpp.sock")
	if err := sim.Listen(sock); err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	srv, cli := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := calicotest.PutBlocks(ctx, cli, 50, func(int) string { return "other" }); err != nil {
		t.Fatal(err)
	}
	if err := calicotest.PutPeer(ctx, cli, "/vpp-calico/hosts/", "other", netip.MustParseAddr("192.0.2.2")); err != nil {
		t.Fatal(err)
	}
	if err := calicotest.PutPool(ctx, cli, calico.IPPool{Name: "p", CIDR: netip.MustParsePrefix("10.0.0.0/8"), BlockSize: 26}); err != nil {
		t.Fatal(err)
	}

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
