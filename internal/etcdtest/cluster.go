package etcdtest

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// Cluster is a real etcd cluster of several embedded members, each behind a Proxy, so that a test can
// kill, restart or freeze single members. Clients connect through the proxies.
type Cluster struct {
	Members []*Server
	Proxies []*Proxy
}

// NewCluster starts an n-member cluster on loopback and waits until every member serves clients.
func NewCluster(n int) (*Cluster, error) {
	c := &Cluster{}
	var peers []string
	for i := range n {
		cp, err := FreePort()
		if err != nil {
			return nil, err
		}
		pp, err := FreePort()
		if err != nil {
			return nil, err
		}
		dir, err := os.MkdirTemp("", "etcdtest-")
		if err != nil {
			return nil, err
		}
		s := &Server{dir: dir, ownsDir: true, startLimit: 30 * time.Second, name: fmt.Sprintf("m%d", i),
			clientURL: url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", cp)},
			peerURL:   url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", pp)}}
		peers = append(peers, s.name+"="+s.peerURL.String())
		c.Members = append(c.Members, s)
	}
	token := fmt.Sprintf("etcdtest-%d", time.Now().UnixNano())
	for _, s := range c.Members {
		s.cluster, s.token = strings.Join(peers, ","), token
	}
	// A member is ready only once the cluster has a leader: start them together.
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, s := range c.Members {
		wg.Go(func() { errs[i] = s.Start() })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		c.Close()
		return nil, err
	}
	for _, s := range c.Members {
		p, err := NewProxy(s.clientURL.Host)
		if err != nil {
			c.Close()
			return nil, err
		}
		c.Proxies = append(c.Proxies, p)
	}
	return c, nil
}

// StartCluster is the test helper: an n-member cluster closed when the test ends.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	c, err := NewCluster(n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// Endpoints returns the client URLs of the members' proxies.
func (c *Cluster) Endpoints() []string {
	out := make([]string, len(c.Proxies))
	for i, p := range c.Proxies {
		out[i] = p.Endpoint()
	}
	return out
}

// DirectEndpoints returns the members' own client URLs, which no proxy fault affects.
func (c *Cluster) DirectEndpoints() []string {
	out := make([]string, len(c.Members))
	for i, s := range c.Members {
		out[i] = s.Endpoint()
	}
	return out
}

// Leader returns the index of the member that is leader, or -1 when none is known.
func (c *Cluster) Leader() int {
	for i, s := range c.Members {
		s.mu.Lock()
		e := s.etcd
		s.mu.Unlock()
		if e != nil && e.Server.Leader() == e.Server.MemberID() {
			return i
		}
	}
	return -1
}

// WaitLeader waits until a running member is leader and returns its index.
func (c *Cluster) WaitLeader(ctx context.Context) (int, error) {
	for {
		if i := c.Leader(); i >= 0 {
			return i, nil
		}
		select {
		case <-ctx.Done():
			return -1, fmt.Errorf("no etcd leader: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Kill stops member i the way a crash looks to clients: its client connections (through the proxy)
// are cut first, so the server does not wait for open watch streams to end. It keeps its data; Start
// brings it back (then Unblock its proxy: Restart does both).
func (c *Cluster) Kill(i int) {
	c.Proxies[i].Block()
	c.Members[i].Stop()
}

// Restart starts a killed member again and lets clients reach it.
func (c *Cluster) Restart(i int) error {
	err := c.Members[i].Start()
	c.Proxies[i].Unblock()
	return err
}

// Close stops every proxy and member and removes their data. Followers go first: a leader stopping
// with followers up first tries to hand its leadership over, which a follower that is stopping too
// never takes (the attempt lasts the request timeout).
func (c *Cluster) Close() {
	for _, p := range c.Proxies {
		p.Close()
	}
	leader := c.Leader()
	var wg sync.WaitGroup
	for i, s := range c.Members {
		if i != leader {
			wg.Go(s.Close)
		}
	}
	wg.Wait()
	if leader >= 0 {
		c.Members[leader].Close()
	}
}
