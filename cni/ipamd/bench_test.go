package ipamd

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"testing"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/cni"
)

// BenchmarkServe measures one request's time in the daemon, through its socket, on an embedded etcd:
// ADDs or DELs of distinct containers on a node whose blocks have room (the steady state: one etcd
// round trip each). The shim's process start, which libcni adds, is not in it (see cni's
// BenchmarkAddDel). Profile with -cpuprofile.
func BenchmarkServe(b *testing.B) {
	for _, verb := range []string{"ADD", "DEL"} {
		b.Run(verb, func(b *testing.B) {
			_, sock, _ := startServer(b, Config{})
			call := func(req *cni.Request) {
				r, err := cni.Call(context.Background(), sock, req)
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

// benchState is node1's state with four /26 blocks of one pool holding 60, 60, 60 and 30 addresses.
func benchState(b *testing.B) *nodeState {
	s := newNodeState("node1", slog.New(slog.DiscardHandler))
	pool, _ := calico.EncodeIPPool(calico.IPPool{CIDR: netip.MustParsePrefix("10.244.0.0/16"), BlockSize: 26})
	s.replace(srcPools, []kv{{Key: calico.IPPoolKey("p"), Value: pool, ModRevision: 3}}, 10)
	blocks := []string{"10.244.0.0/26", "10.244.0.64/26", "10.244.0.128/26", "10.244.0.192/26"}
	var affs []kv
	for _, c := range blocks {
		aff, _ := calico.EncodeAffinity(calico.AffinityValue{State: calico.AffinityConfirmed})
		affs = append(affs, kv{Key: calico.HostAffinityKey("node1", netip.MustParsePrefix(c)), Value: aff, ModRevision: 4})
	}
	for _, src := range []source{srcConfig, srcReservations, srcNode, srcAffinity} {
		var kvs []kv
		if src == srcAffinity {
			kvs = affs
		}
		s.replace(src, kvs, 10)
	}
	for i, c := range blocks {
		cidr := netip.MustParsePrefix(c)
		bl := calico.NewBlock(cidr, "host:node1", 1)
		n := 60
		if i == 3 {
			n = 30
		}
		for j := range n {
			h := "net1.other" + c + string(rune('a'+j))
			bl.AutoAssign(1, calico.AllocationAttribute{HandleID: &h, Secondary: map[string]string{"node": "node1", "pod": "p", "namespace": "default", "timestamp": "2024-05-02 10:11:12.483920113 +0000 UTC", "ifname": "eth0", "network": "net1"}}, nil)
		}
		data, _ := calico.EncodeBlock(bl)
		s.setBlock(cidr, &kv{Key: calico.BlockKey(cidr), Value: data, ModRevision: 5}, 10)
	}
	return s
}

// BenchmarkDecisionAdd and BenchmarkDecisionDel: one steady-state decision and its write plan (the
// changed block encoded), on the state loop between the request and its etcd round trip.
func BenchmarkDecisionAdd(b *testing.B) {
	s := benchState(b)
	c := testCall(s)
	attr := attribute(c.conf, "net1.c1", "eth0")
	b.ReportAllocs()
	for b.Loop() {
		v := c.newView("net1.c1")
		got, _, err := v.add("net1.c1", "eth0", attr)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := v.writes(handleWith(v.handle, got)); err != nil {
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
		v := c.newView(h)
		if _, _, err := v.del(h, func(*calico.AllocationAttribute) bool { return true }); err != nil {
			b.Fatal(err)
		}
		if _, err := v.writes(nil); err != nil {
			b.Fatal(err)
		}
	}
}
