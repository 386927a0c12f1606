package ipamd

import (
	"context"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/cni"
	"github.com/vpp-route-agent/vpp-route-agent/internal/etcdtest"
	"github.com/vpp-route-agent/vpp-route-agent/internal/ipamcall"
	"github.com/vpp-route-agent/vpp-route-agent/internal/netaddr"
)

// watchHold holds back what etcd's watch streams deliver to a client while held: each message
// received after hold is handed on only after release. Watches are the only streams a client opens.
type watchHold struct {
	mu sync.Mutex
	// held is closed by release (nil: not held).
	held chan struct{}
}

func (h *watchHold) hold() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.held == nil {
		h.held = make(chan struct{})
	}
}

func (h *watchHold) release() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.held != nil {
		close(h.held)
		h.held = nil
	}
}

// intercept is a gRPC stream interceptor that applies the hold to every message received.
func (h *watchHold) intercept(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	s, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil {
		return nil, err
	}
	return &heldStream{ClientStream: s, h: h}, nil
}

type heldStream struct {
	grpc.ClientStream
	h *watchHold
}

func (s *heldStream) RecvMsg(m any) error {
	// Received first, held after: a message etcd sends after hold() returned is held for sure.
	err := s.ClientStream.RecvMsg(m)
	s.h.mu.Lock()
	held := s.h.held
	s.h.mu.Unlock()
	if held != nil {
		select {
		case <-held:
		case <-s.Context().Done():
		}
	}
	return err
}

// startLagging runs a daemon for node1 whose etcd client's watches the returned hold holds back (its
// reads and writes are not held); setup writes to etcd first, through the test's client.
func startLagging(t *testing.T, setup func(c *clientv3.Client), pools ...calico.IPPool) (*testServer, *watchHold) {
	t.Helper()
	es, c := etcdtest.Start(t)
	if setup != nil {
		setup(c)
	}
	h := &watchHold{}
	dc, err := clientv3.New(clientv3.Config{Endpoints: []string{es.Endpoint()}, DialTimeout: 2 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithStreamInterceptor(h.intercept)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dc.Close() })
	srv := startServerOn(t, Config{Client: dc}, c, nil, pools...)
	// Cleanups run last first: the watches are let go before the daemon stops.
	t.Cleanup(h.release)
	if !srv.Synced() {
		t.Fatal("the daemon did not read its node state")
	}
	return srv, h
}

func mustPut(t *testing.T, c *clientv3.Client, key string, value []byte) {
	t.Helper()
	if _, err := c.Put(t.Context(), key, string(value)); err != nil {
		t.Fatal(err)
	}
}

func putIPAMConfig(t *testing.T, c *clientv3.Client, cfg calico.IPAMConfig) {
	t.Helper()
	v, err := calico.EncodeIPAMConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mustPut(t, c, calico.IPAMConfigKey, v)
}

// TestRefusalDecidedAgainOnFreshState: a refusal the daemon's watch-fed state would give, after a
// change in etcd its watches have not delivered yet, is not answered: the ADD (and STATUS, which
// takes ADD's decision) reads what the refusal depended on and decides again. A refusal that holds
// on fresh data is answered, after one read.
func TestRefusalDecidedAgainOnFreshState(t *testing.T) {
	small := calico.IPPool{Name: "small", CIDR: netip.MustParsePrefix("10.9.0.0/30"), BlockSize: 30}
	for _, tc := range []struct {
		name  string
		pools []calico.IPPool
		// setup runs before the daemon starts, change while its watches are held.
		setup, change func(t *testing.T, c *clientv3.Client)
		req           func(*cni.Request)
		// want: the address the ADD gets ("": refused with wantMsg).
		want, wantMsg string
	}{{
		name: "auto_allocate_blocks turned on",
		setup: func(t *testing.T, c *clientv3.Client) {
			putIPAMConfig(t, c, calico.IPAMConfig{AutoAllocateBlocks: false})
		},
		change: func(t *testing.T, c *clientv3.Client) { putIPAMConfig(t, c, calico.DefaultIPAMConfig()) },
		want:   "10.244.",
	}, {
		name: "strict affinity turned off",
		// The pool's only block is node2's: node1 can only borrow.
		pools: []calico.IPPool{small},
		setup: func(t *testing.T, c *clientv3.Client) {
			putIPAMConfig(t, c, calico.IPAMConfig{StrictAffinity: true, AutoAllocateBlocks: true})
			b, _ := calico.EncodeBlock(calico.NewBlock(small.CIDR, "host:node2", 1))
			mustPut(t, c, calico.BlockKey(small.CIDR), b)
			a, _ := calico.EncodeAffinity(calico.AffinityValue{State: calico.AffinityConfirmed})
			mustPut(t, c, calico.HostAffinityKey("node2", small.CIDR), a)
		},
		change: func(t *testing.T, c *clientv3.Client) { putIPAMConfig(t, c, calico.DefaultIPAMConfig()) },
		want:   "10.9.0.",
	}, {
		name: "the named pool created",
		req:  func(r *cni.Request) { r.Pools[netaddr.V4] = []cni.PoolRef{{Name: "q"}} },
		change: func(t *testing.T, c *clientv3.Client) {
			v, _ := calico.EncodeIPPool(calico.IPPool{CIDR: netip.MustParsePrefix("10.77.0.0/16"), BlockSize: 26})
			mustPut(t, c, calico.IPPoolKey("q"), v)
		},
		want: "10.77.",
	}, {
		name: "a pool for workloads created",
		// The only pool does not allow workloads.
		pools: []calico.IPPool{{Name: "tunnel", CIDR: netip.MustParsePrefix("10.78.0.0/16"), BlockSize: 26, AllowedUses: []string{"Tunnel"}}},
		change: func(t *testing.T, c *clientv3.Client) {
			v, _ := calico.EncodeIPPool(calico.IPPool{CIDR: netip.MustParsePrefix("10.79.0.0/16"), BlockSize: 26})
			mustPut(t, c, calico.IPPoolKey("p2"), v)
		},
		want: "10.79.",
	}, {
		name: "still off: refused",
		setup: func(t *testing.T, c *clientv3.Client) {
			putIPAMConfig(t, c, calico.IPAMConfig{AutoAllocateBlocks: false})
		},
		change:  func(t *testing.T, c *clientv3.Client) {},
		wantMsg: "auto_allocate_blocks is off",
	}} {
		start := func(t *testing.T) (*testServer, *cni.Request) {
			srv, h := startLagging(t, func(c *clientv3.Client) {
				if tc.setup != nil {
					tc.setup(t, c)
				}
			}, tc.pools...)
			h.hold()
			tc.change(t, srv.cli)
			req := addRequest("c1", 5*time.Second)
			if tc.req != nil {
				tc.req(req)
			}
			return srv, req
		}
		if tc.want != "" {
			t.Run(tc.name+"/STATUS", func(t *testing.T) {
				srv, req := start(t)
				req.Verb, req.ContainerID, req.IfName = "STATUS", "", ""
				r, err := ipamcall.Call(context.Background(), srv.sock, req)
				if err != nil || r.Code != 0 {
					t.Fatalf("STATUS: %+v %v, want ready", r, err)
				}
			})
		}
		t.Run(tc.name, func(t *testing.T) {
			srv, req := start(t)
			r, err := ipamcall.Call(context.Background(), srv.sock, req)
			if err != nil {
				t.Fatal(err)
			}
			if tc.want == "" {
				if r.Code != ErrPoolExhausted || !strings.Contains(r.Msg, tc.wantMsg) {
					t.Fatalf("ADD: code %d %q, want %d %q", r.Code, r.Msg, ErrPoolExhausted, tc.wantMsg)
				}
				// The refusal read the datastore once (with the handle), and once only.
				if r.RoundTrips != 1 {
					t.Errorf("the refusal took %d etcd round trips, want 1", r.RoundTrips)
				}
				return
			}
			if r.Code != 0 || len(r.Allocations) != 1 {
				t.Fatalf("ADD refused on a state its watches had not brought up to date: code %d %q", r.Code, r.Msg)
			}
			if a := r.Allocations[0].Addr.String(); !strings.HasPrefix(a, tc.want) {
				t.Fatalf("ADD got %s, want an address in %s*", a, tc.want)
			}
		})
	}
}

// TestReservationCreatedWhileWatchHeld: an IPReservation created in etcd while the daemon's watches
// are held back is not handed out: the ADD's write is conditional on no reservation having changed
// since the state knew them, its failure branch reads them, and the retry passes over them.
func TestReservationCreatedWhileWatchHeld(t *testing.T) {
	pool := calico.IPPool{Name: "p", CIDR: netip.MustParsePrefix("10.61.0.0/26"), BlockSize: 26}
	srv, h := startLagging(t, nil, pool)
	r, err := ipamcall.Call(context.Background(), srv.sock, addRequest("c1", 5*time.Second))
	if err != nil || r.Code != 0 || r.Allocations[0].Addr != netip.MustParseAddr("10.61.0.0") {
		t.Fatalf("first ADD: %+v %v, want 10.61.0.0", r, err)
	}
	h.hold()
	reserved := netip.MustParsePrefix("10.61.0.0/28")
	mustPut(t, srv.cli, calico.IPReservationKey("late"),
		[]byte(`{"kind":"IPReservation","apiVersion":"projectcalico.org/v3","metadata":{"name":"late"},"spec":{"reservedCIDRs":["`+reserved.String()+`"]}}`))
	r, err = ipamcall.Call(context.Background(), srv.sock, addRequest("c2", 5*time.Second))
	if err != nil || r.Code != 0 || len(r.Allocations) != 1 {
		t.Fatalf("second ADD: %+v %v", r, err)
	}
	if a := r.Allocations[0].Addr; reserved.Contains(a) {
		t.Fatalf("ADD handed out %s, reserved by an IPReservation created before it", a)
	}
	if r.Attempts != 2 {
		t.Errorf("ADD took %d attempts, want 2 (a lost write, then one on what its failure branch read)", r.Attempts)
	}
	// A deletion of the reservation, not yet delivered either, costs nothing: the next ADD is one
	// round trip (and still passes over the reservation the state knows).
	if _, err := srv.cli.Delete(t.Context(), calico.IPReservationKey("late")); err != nil {
		t.Fatal(err)
	}
	r, err = ipamcall.Call(context.Background(), srv.sock, addRequest("c3", 5*time.Second))
	if err != nil || r.Code != 0 || r.RoundTrips != 1 {
		t.Fatalf("third ADD: %+v %v, want one round trip", r, err)
	}
}
