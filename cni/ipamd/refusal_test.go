package ipamd

import (
	"net/netip"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/cni"
	"github.com/vpp-route-agent/vpp-route-agent/internal/metricstest"
)

// TestClaimsRefusedByReason: an ADD the node can get no block for is answered 100 and counted under
// its reason, and only there: a pool of one /30 block filled by node1 (nothing to claim, nothing to
// borrow; strict affinity forbidding borrowing), a block limit of 1 in a large pool, and automatic
// block allocation off.
func TestClaimsRefusedByReason(t *testing.T) {
	tiny := calico.IPPool{Name: "tiny", CIDR: netip.MustParsePrefix("10.9.0.0/30"), BlockSize: 30}
	large := calico.IPPool{Name: "large", CIDR: netip.MustParsePrefix("10.10.0.0/16"), BlockSize: 30}
	for _, c := range []struct {
		reason string
		pool   calico.IPPool
		config calico.IPAMConfig
		fill   int
	}{
		{refusedPoolExhausted, tiny, calico.IPAMConfig{AutoAllocateBlocks: true}, 4},
		{refusedStrictAffinity, tiny, calico.IPAMConfig{AutoAllocateBlocks: true, StrictAffinity: true}, 4},
		{refusedBlockLimit, large, calico.IPAMConfig{AutoAllocateBlocks: true, MaxBlocksPerHost: 1}, 4},
		{refusedAutoAllocateOff, large, calico.IPAMConfig{}, 0},
	} {
		t.Run(c.reason, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			srv := startServer(t, Config{Registerer: reg}, nil, c.pool)
			v, err := calico.EncodeIPAMConfig(c.config)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := srv.cli.Put(t.Context(), calico.IPAMConfigKey, string(v)); err != nil {
				t.Fatal(err)
			}
			add := func(cid string) *cni.Reply {
				reply, _ := plugin(srv, addRequest(cid, 10*time.Second))
				return reply
			}
			for i := range c.fill {
				if r := add(string(rune('a' + i))); r.Err() != nil {
					t.Fatalf("ADD %d: %v", i, r.Err())
				}
			}
			r := add("refused")
			if r.Code != cni.ErrPoolExhausted {
				t.Fatalf("ADD beyond the capacity: code %d (%s), want %d", r.Code, r.Msg, cni.ErrPoolExhausted)
			}
			for _, reason := range refusalReasons {
				want := 0.0
				if reason == c.reason {
					want = 1
				}
				if got := metricstest.Value(t, reg, "block_ipam_claims_refused_total", "reason", reason); got != want {
					t.Errorf("block_ipam_claims_refused_total{reason=%q} = %v, want %v (%s)", reason, got, want, r.Msg)
				}
			}
		})
	}
}
