package e2e

import (
	"testing"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/internal/calicotest"
)

// BenchmarkColdStartIPIP1k measures, at the agent level, what tunnels cost: 1,000 remote nodes with one
// block each, the daemon cold-started against an empty VPP twice per iteration, the pool flat (1,000
// routes), then IPIP Always (1,000 p2p tunnels, each created, unnumbered, its MTU set and brought up,
// and 1,000 routes through them). It reports both times, the IPIP one as peers (routes plus tunnels)
// per second, and the difference of the two peak RSS per peer: the memory a tunnelled peer costs the
// agent. With VPP_TEST_BACKEND=real the VPP is a real one (VPP_PKG; ipip is in VPP's core).
//
//	go test -run '^$' -bench ColdStartIPIP1k -benchtime 3x ./test/e2e/
func BenchmarkColdStartIPIP1k(b *testing.B) {
	const n = 1000
	c := benchCluster(b, n, n)
	setMode := func(m calico.EncapMode) {
		b.Helper()
		p := calico.IPPool{Name: "default-ipv4-ippool", CIDR: pool, BlockSize: 26, IPIPMode: m}
		if err := calicotest.PutPool(c.ctx(), c.cli, p); err != nil {
			b.Fatal(err)
		}
	}
	var flatS, ipipS, flatRSS, ipipRSS float64
	for b.Loop() {
		setMode(calico.EncapNever)
		d, _, rss := coldStart(b, c, agentBin, n)
		flatS, flatRSS = flatS+d.Seconds(), flatRSS+rss
		setMode(calico.EncapAlways)
		d, _, rss = coldStart(b, c, agentBin, n)
		ipipS, ipipRSS = ipipS+d.Seconds(), ipipRSS+rss
	}
	N := float64(b.N)
	flatS, ipipS, flatRSS, ipipRSS = flatS/N, ipipS/N, flatRSS/N, ipipRSS/N
	b.ReportMetric(flatS, "flat-coldstart-s")
	b.ReportMetric(ipipS, "ipip-coldstart-s")
	b.ReportMetric(n/ipipS, "ipip-peers/s")
	b.ReportMetric((ipipS-flatS)/n*1e3, "tunnel-ms/peer")
	b.ReportMetric((ipipRSS-flatRSS)*1024/n, "tunnel-KB/peer")
	b.Logf("%d peers, one block each: exec -> every route in the FIB %.3fs flat, %.3fs with IPIP (%.0f peers/s: a tunnel and a route each; %.2f ms more per peer); peak RSS %.1f MB flat, %.1f MB IPIP (%.1f KB more per peer)",
		n, flatS, ipipS, n/ipipS, (ipipS-flatS)/n*1e3, flatRSS, ipipRSS, (ipipRSS-flatRSS)*1024/n)
}
