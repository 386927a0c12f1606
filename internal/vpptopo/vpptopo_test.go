package vpptopo

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"
)

func TestParsePing(t *testing.T) {
	for _, tc := range []struct {
		out  string
		want PingResult
		ok   bool
	}{
		{"116 bytes from 10.244.2.1: icmp_seq=2 ttl=64 time=2.2624 ms\n116 bytes from 10.244.2.1: icmp_seq=3 ttl=64 time=4.8526 ms\n\nStatistics: 3 sent, 2 received, 33% packet loss\n",
			PingResult{Sent: 3, Received: 2}, true},
		{"\nStatistics: 2 sent, 0 received, 100% packet loss\n", PingResult{Sent: 2}, true},
		{"76 bytes from fd00:244:0:2::1: icmp_seq=1 ttl=64 time=.2907 ms\n\nStatistics: 1 sent, 1 received, 0% packet loss\n", PingResult{Sent: 1, Received: 1}, true},
		{"ping: unknown input `ping 10.0.0.1'\n", PingResult{}, false}, // a VPP without the ping plugin
		{"", PingResult{}, false},
	} {
		got, err := ParsePing(tc.out)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParsePing(%q) = %v, %v; want %v, ok %v", tc.out, got, err, tc.want, tc.ok)
		}
	}
}

// TestParseEchoes: the replies' sequence numbers come out sorted and once each, and the longest run of
// unanswered echoes counts the ones lost at the start and at the end.
func TestParseEchoes(t *testing.T) {
	reply := func(seq int) string {
		return fmt.Sprintf("116 bytes from 10.244.2.1: icmp_seq=%d ttl=64 time=2.2624 ms\n", seq)
	}
	for _, tc := range []struct {
		name     string
		out      string
		answered []int
		longest  int
		from3    int
	}{
		{"a gap in the middle", reply(1) + reply(2) + reply(6) + reply(7) + "\nStatistics: 7 sent, 4 received, 42% packet loss\n", []int{1, 2, 6, 7}, 3, 2},
		{"lost at the start", reply(4) + reply(5) + "\nStatistics: 5 sent, 2 received, 60% packet loss\n", []int{4, 5}, 3, 2},
		{"lost at the end, a reply twice", reply(2) + reply(1) + reply(1) + "\nStatistics: 6 sent, 2 received, 66% packet loss\n", []int{1, 2}, 4, 0},
		{"none answered", "\nStatistics: 4 sent, 0 received, 100% packet loss\n", nil, 4, 0},
		{"all answered", reply(1) + reply(2) + "\nStatistics: 2 sent, 2 received, 0% packet loss\n", []int{1, 2}, 0, 0},
	} {
		e, err := ParseEchoes(tc.out, 10*time.Millisecond)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if !slices.Equal(e.Answered, tc.answered) || e.LongestLoss() != tc.longest || e.AnsweredFrom(3) != tc.from3 ||
			e.Outage() != time.Duration(tc.longest)*10*time.Millisecond {
			t.Errorf("%s: answered %v, longest loss %d, answered from 3 %d; want %v, %d, %d", tc.name, e.Answered, e.LongestLoss(), e.AnsweredFrom(3), tc.answered, tc.longest, tc.from3)
		}
	}
	if _, err := ParseEchoes("ping: unknown input", time.Millisecond); err == nil {
		t.Error("ParseEchoes of output without statistics: no error")
	}
}

// TestAddressPlan: every node's uplink addresses lie in its gateway's subnet (routed) and are distinct,
// a dual-homed node's two uplinks are on the two fabrics' subnets, pods lie in their node's blocks, and
// the blocks do not overlap.
func TestAddressPlan(t *testing.T) {
	for _, kind := range []Kind{Fabric, Routed, DualHomed} {
		seen := map[string]bool{}
		for i := 1; i <= MaxNodes; i++ {
			n := newNode(kind, i, MaxPods)
			names := []string{n.Block4.String(), n.Block6.String()}
			for _, u := range n.Uplinks {
				names = append(names, u.Addr4.Addr().String(), u.Addr6.Addr().String())
			}
			for j := range n.Pods4 {
				names = append(names, n.Pods4[j].String(), n.Pods6[j].String())
			}
			for _, s := range names {
				if seen[s] {
					t.Errorf("%v node %d: %s used twice", kind, i, s)
				}
				seen[s] = true
			}
			if want := switches(kind); len(n.Uplinks) != want || n.Addr4 != n.Uplinks[0].Addr4 || n.Addr6 != n.Uplinks[0].Addr6 {
				t.Errorf("%v node %d: uplinks %+v (want %d), Addr4 %s, Addr6 %s", kind, i, n.Uplinks, want, n.Addr4, n.Addr6)
			}
			if len(n.Pods4) != MaxPods || len(n.Pods6) != MaxPods || n.Pods4[0] != n.Pod4 || n.Pods6[0] != n.Pod6 {
				t.Errorf("%v node %d: pods %v %v, first %s %s", kind, i, n.Pods4, n.Pods6, n.Pod4, n.Pod6)
			}
			for j := range n.Pods4 {
				p4, p6 := n.Pods4[j], n.Pods6[j]
				if !n.Block4.Contains(p4) || !n.Block6.Contains(p6) || p4 == n.Block4.Addr() || p6 == n.Block6.Addr() {
					t.Errorf("%v node %d: pods %s %s outside their blocks %s %s", kind, i, p4, p6, n.Block4, n.Block6)
				}
			}
			if kind == Routed && (!n.Addr4.Masked().Contains(n.Gateway4) || !n.Addr6.Masked().Contains(n.Gateway6)) {
				t.Errorf("node %d: gateways %s %s outside %s %s", i, n.Gateway4, n.Gateway6, n.Addr4, n.Addr6)
			}
			if kind != Routed && n.Gateway4.IsValid() {
				t.Errorf("%v node %d has a gateway", kind, i)
			}
			if kind == DualHomed {
				a, b := n.Uplinks[0], n.Uplinks[1]
				if a.Addr4.Masked() != netip.MustParsePrefix("192.168.61.0/24") || b.Addr4.Masked() != netip.MustParsePrefix("192.168.62.0/24") ||
					a.Addr6.Masked() != netip.MustParsePrefix("fd00:61::/64") || b.Addr6.Masked() != netip.MustParsePrefix("fd00:62::/64") ||
					a.Interface != UplinkInterface || b.Interface != SecondUplinkInterface {
					t.Errorf("dual-homed node %d: uplinks %+v", i, n.Uplinks)
				}
			}
		}
	}
	if a, b := newNode(Routed, 1, 1), newNode(Routed, 2, 1); a.Addr4.Masked() == b.Addr4.Masked() || a.Addr6.Masked() == b.Addr6.Masked() {
		t.Errorf("routed nodes 1 and 2 share a subnet: %s %s", a.Addr4, b.Addr4)
	}
}
