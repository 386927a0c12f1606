package ipamd

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/internal/ipamcall"
	"github.com/vpp-route-agent/vpp-route-agent/internal/metricstest"
)

// TestBlockOutsidePoolsDoesNotStopClaims: a stray 0.0.0.0/0 block (affinity null, no allocations) lies
// outside every pool; Calico's claim walk ignores it, and so do block-ipam's claims: a fresh node
// claims blocks of its pool under strict affinity (where it used to answer "pool exhausted", and
// without strict affinity borrowed single addresses). The block is counted once, however many claims
// list it.
func TestBlockOutsidePoolsDoesNotStopClaims(t *testing.T) {
	for _, strict := range []bool{true, false} {
		name := "strict affinity"
		if !strict {
			name = "borrowing allowed"
		}
		t.Run(name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			pool := calico.IPPool{Name: "p", CIDR: netip.MustParsePrefix("10.244.0.0/16"), BlockSize: 30}
			srv := startServer(t, Config{Registerer: reg}, nil, pool)
			cfg, _ := calico.EncodeIPAMConfig(calico.IPAMConfig{StrictAffinity: strict, AutoAllocateBlocks: true})
			stray := calico.BlockKey(netip.MustParsePrefix("0.0.0.0/0"))
			for k, v := range map[string]string{
				calico.IPAMConfigKey: string(cfg),
				stray:                `{"cidr":"0.0.0.0/0","affinity":null,"allocations":[],"unallocated":[],"attributes":[]}`,
			} {
				if _, err := srv.cli.Put(t.Context(), k, v); err != nil {
					t.Fatal(err)
				}
			}
			// Two blocks' worth of addresses: two claims, each listing the stray block.
			for i := range 8 {
				ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
				reply, err := ipamcall.Call(ctx, srv.sock, addRequest(string(rune('a'+i)), 10*time.Second))
				cancel()
				if err != nil {
					t.Fatal(err)
				}
				if reply.Err() != nil {
					t.Fatalf("ADD %d: %v", i, reply.Err())
				}
				if a := reply.Allocations[0]; a.Block.Bits() != 30 || !pool.Contains(a.Block) {
					t.Fatalf("ADD %d got %v from block %v, want an address of a claimed /30 block of the pool", i, a.Addr, a.Block)
				}
			}
			if n := metricstest.Value(t, reg, "block_ipam_block_claims_total"); n != 2 {
				t.Errorf("claims: %v, want 2", n)
			}
			if n := metricstest.Value(t, reg, "block_ipam_blocks_outside_pools_total"); n != 1 {
				t.Errorf("blocks outside the pools counted %v times, want once", n)
			}
			if resp, err := srv.cli.Get(t.Context(), stray); err != nil || resp.Count != 1 {
				t.Errorf("the stray block was touched: %v %v", resp, err)
			}
		})
	}
}
