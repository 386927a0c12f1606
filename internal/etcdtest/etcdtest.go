// Package etcdtest runs a real etcd server in-process for tests and the lab, on loopback ports and a
// temporary data directory, with stop and restart on the same ports and data.
package etcdtest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Server is one embedded etcd member. Its client URL stays the same across Stop and Start.
type Server struct {
	dir        string
	name       string
	cluster    string // initial cluster: name=peerURL,... ("" for a single member)
	token      string
	clientURL  url.URL
	peerURL    url.URL
	mu         sync.Mutex // guards etcd
	etcd       *embed.Etcd
	ownsDir    bool
	startLimit time.Duration
	quota      int64
}

// Options tune the server; the zero value is fine for tests.
type Options struct {
	// Dir is the data directory; "" makes a temporary one that Close removes.
	Dir string
	// ClientPort and PeerPort on 127.0.0.1; 0 picks free ports.
	ClientPort, PeerPort int
	// QuotaBackendBytes is etcd's --quota-backend-bytes (0: etcd's default); past it etcd raises the
	// NOSPACE alarm and refuses writes.
	QuotaBackendBytes int64
}

// New starts an etcd server and waits until it serves clients.
func New(opts Options) (*Server, error) {
	s := &Server{dir: opts.Dir, startLimit: 30 * time.Second, quota: opts.QuotaBackendBytes}
	if s.dir == "" {
		d, err := os.MkdirTemp("", "etcdtest-")
		if err != nil {
			return nil, err
		}
		s.dir, s.ownsDir = d, true
	}
	cp, pp := opts.ClientPort, opts.PeerPort
	var err error
	if cp == 0 {
		if cp, err = FreePort(); err != nil {
			return nil, err
		}
	}
	if pp == 0 {
		if pp, err = FreePort(); err != nil {
			return nil, err
		}
	}
	s.clientURL = url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", cp)}
	s.peerURL = url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", pp)}
	if err := s.Start(); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// Start starts a stopped server on the same ports and data directory.
func (s *Server) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.etcd != nil {
		return nil
	}
	cfg := embed.NewConfig()
	cfg.Name = s.name
	if cfg.Name == "" {
		cfg.Name = "etcdtest"
	}
	cfg.Dir = s.dir
	cfg.ListenClientUrls = []url.URL{s.clientURL}
	cfg.AdvertiseClientUrls = []url.URL{s.clientURL}
	cfg.ListenPeerUrls = []url.URL{s.peerURL}
	cfg.AdvertisePeerUrls = []url.URL{s.peerURL}
	cfg.InitialCluster = cfg.Name + "=" + s.peerURL.String()
	if s.cluster != "" {
		cfg.InitialCluster = s.cluster
		cfg.InitialClusterToken = s.token
		// Short elections keep the fault tests fast; generous enough for a loaded 2-core machine.
		cfg.TickMs = 50
		cfg.ElectionMs = 750
	}
	cfg.UnsafeNoFsync = true
	cfg.QuotaBackendBytes = s.quota
	cfg.LogLevel = "error"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return fmt.Errorf("start embedded etcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return fmt.Errorf("embedded etcd failed: %w", err)
	case <-time.After(s.startLimit):
		e.Close()
		return fmt.Errorf("embedded etcd not ready after %s", s.startLimit)
	}
	s.etcd = e
	return nil
}

// Stop stops the server, keeping its data; clients see it as unreachable until Start.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.etcd != nil {
		s.etcd.Close()
		s.etcd = nil
	}
}

// Close stops the server and removes a temporary data directory.
func (s *Server) Close() {
	s.Stop()
	if s.ownsDir {
		os.RemoveAll(s.dir)
	}
}

// Endpoint returns the client URL, e.g. "http://127.0.0.1:23790".
func (s *Server) Endpoint() string { return s.clientURL.String() }

// Client returns a new client of the server with short timeouts; the caller closes it.
func (s *Server) Client() (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{
		Endpoints:   []string{s.Endpoint()},
		DialTimeout: 2 * time.Second,
		Logger:      zap.NewNop(),
	})
}

// Compact compacts the key space up to the current revision and returns that revision.
func (s *Server) Compact(ctx context.Context) (int64, error) {
	c, err := s.Client()
	if err != nil {
		return 0, err
	}
	defer c.Close()
	resp, err := c.Get(ctx, "compact-probe")
	if err != nil {
		return 0, err
	}
	rev := resp.Header.Revision
	if _, err := c.Compact(ctx, rev, clientv3.WithCompactPhysical()); err != nil && !errors.Is(err, rpctypes.ErrCompacted) {
		return 0, err // compacting again at an already compacted revision is not an error here
	}
	return rev, nil
}

// Start is the test helper: a server that is closed when the test ends, and a client for it.
func Start(t testing.TB) (*Server, *clientv3.Client) {
	t.Helper()
	return StartWith(t, Options{})
}

// StartWith is Start with options.
func StartWith(t testing.TB, opts Options) (*Server, *clientv3.Client) {
	t.Helper()
	s, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	c, err := s.Client()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return s, c
}

// Fill writes large values until etcd refuses a write for want of space (its NOSPACE alarm; the
// server needs a small Options.QuotaBackendBytes).
func Fill(ctx context.Context, c *clientv3.Client) error {
	value := strings.Repeat("x", 256<<10)
	for i := 0; ; i++ {
		if _, err := c.Put(ctx, fmt.Sprintf("/fill/%d", i), value); err != nil {
			if errors.Is(err, rpctypes.ErrNoSpace) {
				return nil
			}
			return fmt.Errorf("fill: %w", err)
		}
		if i > 10000 {
			return errors.New("fill: no NOSPACE after 10000 writes")
		}
	}
}

// FreePort returns a loopback TCP port that was free a moment ago, for servers that need a port before
// they start (etcd's URLs, a restart on the same port). It picks below the kernel's ephemeral range, so
// the port cannot be taken in the meantime by some test's outgoing connection, which is what a port
// from "127.0.0.1:0" can be (seen in CI: "bind: address already in use" on the first start).
func FreePort() (int, error) {
	lo, hi := 20000, ephemeralLow()-1
	for range 64 {
		if hi <= lo {
			break
		}
		port := lo + rand.IntN(hi-lo+1)
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue // in use; pick another
		}
		l.Close()
		return port, nil
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// ephemeralLow is the first port of the kernel's ephemeral range (32768 when it cannot be read).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 32768
	}
	n, err := strconv.Atoi(f[0])
	if err != nil {
		return 32768
	}
	return n
}
