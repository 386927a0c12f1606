// Package ipamdtest runs block-ipam's node daemon (package cni/ipamd) inside a test process, on a unix
// socket and a client of the given etcd endpoints, so that tests drive it through the real plugin.
package ipamdtest

import (
	"context"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/vpp-route-agent/vpp-route-agent/cni"
	"github.com/vpp-route-agent/vpp-route-agent/cni/ipamd"
)

// Options say how to run a daemon.
type Options struct {
	Node      string
	Endpoints []string
	// Socket is the socket's path (at most 107 bytes: keep its directory short).
	Socket string
	// Pause is ipamd.Config.Pause (optional).
	Pause func(context.Context)
	// Log receives the daemon's warnings and errors (nil: discarded).
	Log io.Writer
	// Observe is ipamd.Config.Observe (optional): each request with its reply, figures included.
	Observe func(*cni.Request, *cni.Reply)
}

// Daemon is a running daemon.
type Daemon struct {
	*ipamd.Server
	Socket string
	stop   func()
	once   sync.Once
}

// Start starts a daemon; it stops when the test ends, or earlier with Stop.
func Start(tb testing.TB, o Options) *Daemon {
	tb.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: o.Endpoints, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		tb.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	if o.Log != nil {
		log = slog.New(slog.NewTextHandler(o.Log, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	srv, err := ipamd.New(ipamd.Config{Node: o.Node, Client: cli, Endpoints: strings.Join(o.Endpoints, ","), Pause: o.Pause, Logger: log, Observe: o.Observe})
	if err != nil {
		cli.Close()
		tb.Fatal(err)
	}
	l, err := ipamd.Listen(o.Socket)
	if err != nil {
		cli.Close()
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); srv.Run(ctx) }()
	go func() { defer wg.Done(); srv.Serve(ctx, l) }()
	d := &Daemon{Server: srv, Socket: o.Socket, stop: func() {
		cancel()
		wg.Wait()
		cli.Close()
	}}
	tb.Cleanup(d.Stop)
	// Tests count etcd round trips: start from a daemon whose followers have read the node state
	// (steady state), unless etcd does not answer.
	for end := time.Now().Add(2 * time.Second); !srv.Synced() && time.Now().Before(end); {
		time.Sleep(5 * time.Millisecond)
	}
	return d
}

// Stop stops the daemon and waits for it; its socket is gone afterwards.
func (d *Daemon) Stop() { d.once.Do(d.stop) }

// SocketDir returns a new short directory for sockets, removed when the test ends.
func SocketDir(tb testing.TB) string {
	tb.Helper()
	dir, err := os.MkdirTemp("", "bi")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}
