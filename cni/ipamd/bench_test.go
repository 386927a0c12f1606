package ipamd

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/cni"
	"github.com/vpp-route-agent/vpp-route-agent/internal/ipamcall"
)

// BenchmarkServe measures one request's time in the daemon, through its socket, on an embedded etcd:
// ADDs or DELs of distinct containers on a node whose blocks have room (the steady state: one etcd
// round trip each). The shim's process start, which libcni adds, is not in it (see cni's
// BenchmarkAddDel). Profile with -cpuprofile.
func BenchmarkServe(b *testing.B) {
	for _, verb := range []string{"ADD", "DEL"} {
		b.Run(verb, func(b *testing.B) {
			sock := startServer(b, Config{}, nil).sock
			call := func(req *cni.Request) {
				r, err := ipamcall.Call(context.Background(), sock, req)
				if err != nil || r.Err() != nil {
					b.Fatal(err, r.Err())
				}
			}
			// Warm up: the node's first block.
			call(addRequest("warmup", 10*time.Second))
			del := func(cid string) {
				call(&cni.Request{Verb: "DEL", ContainerID: cid, IfName: "eth0", Network: "net1", Timeout: 10 * time.Second})
			}
			b.ResetTimer()
			for i := range b.N {
				// The other verb keeps the node's blocks as they were, untimed.
				cid := fmt.Sprintf("c%d", i)
				if verb == "ADD" {
					call(addRequest(cid, 10*time.Second))
					b.StopTimer()
					del(cid)
				} else {
					b.StopTimer()
					call(addRequest(cid, 10*time.Second))
					b.StartTimer()
					del(cid)
					b.StopTimer()
				}
				b.StartTimer()
			}
		})
	}
}

// BenchmarkServeConcurrent: 100 ADDs (or DELs) sent at once to the daemon, through its socket (the
// wall time of all of them; the shims' process starts are not in it). The other verb, untimed,
// leaves the node's blocks as they were. It reports the etcd round trips per burst.
func BenchmarkServeConcurrent(b *testing.B) {
	for _, verb := range []string{"ADD", "DEL"} {
		b.Run(verb, func(b *testing.B) {
			srv := startServer(b, Config{}, nil)
			var roundTrips atomic.Int64
			all := func(req func(i int) *cni.Request) {
				var wg sync.WaitGroup
				for i := range 100 {
					wg.Go(func() {
						r, err := ipamcall.Call(context.Background(), srv.sock, req(i))
						if err != nil || r.Err() != nil {
							b.Error(err, r.Err())
							return
						}
						roundTrips.Add(r.RoundTrips)
					})
				}
				wg.Wait()
			}
			add := func() { all(func(i int) *cni.Request { return addRequest(fmt.Sprintf("c%d", i), 10*time.Second) }) }
			del := func() {
				all(func(i int) *cni.Request {
					return &cni.Request{Verb: "DEL", ContainerID: fmt.Sprintf("c%d", i), IfName: "eth0", Network: "net1", Timeout: 10 * time.Second}
				})
			}
			timed := 0
			for range b.N {
				if verb == "ADD" {
					n := roundTrips.Load()
					add()
					timed += int(roundTrips.Load() - n)
					b.StopTimer()
					del()
				} else {
					b.StopTimer()
					add()
					b.StartTimer()
					n := roundTrips.Load()
					del()
					timed += int(roundTrips.Load() - n)
					b.StopTimer()
				}
				b.StartTimer()
			}
			b.ReportMetric(float64(timed)/float64(b.N), "etcd-round-trips/burst")
		})
	}
}

// benchState is node1's state with four /26 blocks of one pool holding 60, 60, 60 and 30 addresses.
func benchState(b *testing.B) *nodeState {
	return stateWith(b, 26, map[string]int{"10.244.0.0/26": 60, "10.244.0.64/26": 60, "10.244.0.128/26": 60, "10.244.0.192/26": 30},
		map[string]string{"node": "node1", "pod": "p", "namespace": "default", "timestamp": "2024-05-02 10:11:12.483920113 +0000 UTC", "ifname": "eth0", "network": "net1"})
}

// BenchmarkDecisionAdd and BenchmarkDecisionDel: one steady-state decision and its write plan (the
// changed block encoded), on the state loop between the request and its etcd round trip.
func BenchmarkDecisionAdd(b *testing.B) {
	s := benchState(b)
	c := testCall(s)
	attr := attribute(c.conf, "net1.c1", "eth0")
	b.ReportAllocs()
	for b.Loop() {
		v, err := decideOn(c, (*view).add, &request{handle: "net1.c1", ifname: "eth0", attr: attr})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := v.writes(); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecisionDel(b *testing.B) {
	s := benchState(b)
	c := testCall(s)
	h := "net1.other10.244.0.0/26a"
	b.ReportAllocs()
	for b.Loop() {
		v, err := decideOn(c, (*view).del, &request{handle: h, ifname: "eth0"})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := v.writes(); err != nil {
			b.Fatal(err)
		}
	}
}
