package calico

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func loadTestdataList(t testing.TB, name string) []testdataFile {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	var fs []testdataFile
	if err := json.Unmarshal(raw, &fs); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return fs
}

func problemFields(ps []FieldProblem) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.Field)
	}
	return out
}

// TestPoolEncap: every combination of modes decodes to felix's reading, and what Calico's validator
// would refuse is a problem of the named field that never fails the decode.
func TestPoolEncap(t *testing.T) {
	tests := []struct {
		name          string
		cidr, ipip    string // ipip, vxlan: JSON values, "" for absent
		vxlan         string
		wantIPIP      EncapMode
		wantVXLAN     EncapMode
		want          PoolEncap
		wantProblems  []string
		problemReason string
	}{
		{name: "absent", cidr: "10.0.0.0/16", wantIPIP: EncapNever, wantVXLAN: EncapNever},
		{name: "empty and null", cidr: "10.0.0.0/16", ipip: `""`, vxlan: `null`, wantIPIP: EncapNever, wantVXLAN: EncapNever},
		{name: "never", cidr: "10.0.0.0/16", ipip: `"Never"`, vxlan: `"Never"`, wantIPIP: EncapNever, wantVXLAN: EncapNever},
		{name: "ipip always", cidr: "10.0.0.0/16", ipip: `"Always"`, wantIPIP: EncapAlways, wantVXLAN: EncapNever,
			want: PoolEncap{Type: EncapIPIP}},
		{name: "ipip cross-subnet", cidr: "10.0.0.0/16", ipip: `"CrossSubnet"`, vxlan: `"Never"`, wantIPIP: EncapCrossSubnet, wantVXLAN: EncapNever,
			want: PoolEncap{Type: EncapIPIP, CrossSubnet: true}},
		{name: "vxlan always", cidr: "10.0.0.0/16", vxlan: `"Always"`, wantIPIP: EncapNever, wantVXLAN: EncapAlways,
			want: PoolEncap{Type: EncapVXLAN}},
		{name: "vxlan cross-subnet v6", cidr: "fd00::/48", vxlan: `"CrossSubnet"`, wantIPIP: EncapNever, wantVXLAN: EncapCrossSubnet,
			want: PoolEncap{Type: EncapVXLAN, CrossSubnet: true}},
		// felix's poolTypeForPool: VXLAN first.
		{name: "both: vxlan wins", cidr: "10.0.0.0/16", ipip: `"Always"`, vxlan: `"CrossSubnet"`, wantIPIP: EncapAlways, wantVXLAN: EncapCrossSubnet,
			want: PoolEncap{Type: EncapVXLAN, CrossSubnet: true}, wantProblems: []string{"spec.ipipMode"}, problemReason: "VXLAN wins"},
		// felix's getPoolInfo: cross-subnet when either mode is.
		{name: "both: cross-subnet from ipip", cidr: "10.0.0.0/16", ipip: `"CrossSubnet"`, vxlan: `"Always"`, wantIPIP: EncapCrossSubnet, wantVXLAN: EncapAlways,
			want: PoolEncap{Type: EncapVXLAN, CrossSubnet: true}, wantProblems: []string{"spec.ipipMode"}, problemReason: "VXLAN wins"},
		{name: "ipip on v6", cidr: "fd00::/48", ipip: `"Always"`, wantIPIP: EncapAlways, wantVXLAN: EncapNever,
			wantProblems: []string{"spec.ipipMode"}, problemReason: "IPv6"},
		{name: "ipip cross-subnet on a v6 vxlan pool", cidr: "fd00::/48", ipip: `"CrossSubnet"`, vxlan: `"Always"`, wantIPIP: EncapCrossSubnet, wantVXLAN: EncapAlways,
			want: PoolEncap{Type: EncapVXLAN}, wantProblems: []string{"spec.ipipMode"}, problemReason: "IPv6"},
		// Calico's validator is case-sensitive; libcalico-go reads anything else as Never.
		{name: "unknown ipip", cidr: "10.0.0.0/16", ipip: `"always"`, vxlan: `"Never"`, wantIPIP: "always", wantVXLAN: EncapNever,
			wantProblems: []string{"spec.ipipMode"}, problemReason: "unknown mode"},
		{name: "unknown vxlan beside ipip", cidr: "10.0.0.0/16", ipip: `"Always"`, vxlan: `"Sometimes"`, wantIPIP: EncapAlways, wantVXLAN: "Sometimes",
			want: PoolEncap{Type: EncapIPIP}, wantProblems: []string{"spec.vxlanMode"}, problemReason: "unknown mode"},
		{name: "mode of the wrong type", cidr: "10.0.0.0/16", vxlan: `5`, wantIPIP: EncapNever, wantVXLAN: "5",
			wantProblems: []string{"spec.vxlanMode"}, problemReason: "unknown mode"},
		{name: "disabled pool keeps its encapsulation", cidr: "10.0.0.0/16", ipip: `"Always"`, wantIPIP: EncapAlways, wantVXLAN: EncapNever,
			want: PoolEncap{Type: EncapIPIP}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			spec := fmt.Sprintf(`"cidr":%q`, tc.cidr)
			if tc.ipip != "" {
				spec += `,"ipipMode":` + tc.ipip
			}
			if tc.vxlan != "" {
				spec += `,"vxlanMode":` + tc.vxlan
			}
			if strings.HasPrefix(tc.name, "disabled") {
				spec += `,"disabled":true`
			}
			p, err := DecodeIPPool([]byte(`{"kind":"IPPool","metadata":{"name":"p"},"spec":{` + spec + `}}`))
			if err != nil {
				t.Fatalf("DecodeIPPool: %v (a bad mode must not fail the pool)", err)
			}
			if p.IPIPMode != tc.wantIPIP || p.VXLANMode != tc.wantVXLAN {
				t.Errorf("modes = %q, %q; want %q, %q", p.IPIPMode, p.VXLANMode, tc.wantIPIP, tc.wantVXLAN)
			}
			if got := p.Encap(); got != tc.want {
				t.Errorf("Encap() = %+v, want %+v", got, tc.want)
			}
			probs := p.EncapProblems()
			if !slices.Equal(problemFields(probs), tc.wantProblems) {
				t.Errorf("EncapProblems() = %v, want fields %v", probs, tc.wantProblems)
			}
			for _, pr := range probs {
				if !strings.Contains(pr.Error(), tc.problemReason) || !strings.Contains(pr.Error(), `IPPool "p"`) {
					t.Errorf("problem %q does not name the pool or say %q", pr.Error(), tc.problemReason)
				}
			}
		})
	}
}

// TestEncodeIPPoolModes: EncodeIPPool writes the pool's modes (Never for the zero value), and they
// decode back.
func TestEncodeIPPoolModes(t *testing.T) {
	for _, modes := range [][2]EncapMode{{"", ""}, {EncapAlways, EncapNever}, {EncapNever, EncapCrossSubnet}, {EncapCrossSubnet, EncapAlways}} {
		p := IPPool{Name: "p", CIDR: mustPrefix("10.0.0.0/16"), BlockSize: 26, IPIPMode: modes[0], VXLANMode: modes[1]}
		enc, err := EncodeIPPool(p)
		if err != nil {
			t.Fatal(err)
		}
		want := [2]EncapMode{encapMode(string(modes[0])), encapMode(string(modes[1]))}
		if !strings.Contains(string(enc), fmt.Sprintf(`"ipipMode":%q,"vxlanMode":%q`, want[0], want[1])) {
			t.Errorf("EncodeIPPool(%v) = %s", modes, enc)
		}
		back, err := DecodeIPPool(enc)
		if err != nil || back.IPIPMode != want[0] || back.VXLANMode != want[1] {
			t.Errorf("round trip of %v: %+v, %v", modes, back, err)
		}
	}
}

func TestTestdataPoolEncap(t *testing.T) {
	want := map[string]PoolEncap{
		"default-ipv4-ippool": {Type: EncapIPIP},
		"vxlan-cross":         {Type: EncapVXLAN, CrossSubnet: true},
		"default-ipv6-ippool": {Type: EncapVXLAN},
		"flat":                {},
	}
	for _, f := range loadTestdataList(t, "encap/ippools.json") {
		k, err := ParseKey(f.Key)
		if err != nil || k.Kind != KindIPPool {
			t.Fatalf("ParseKey(%s) = %+v, %v", f.Key, k, err)
		}
		p, err := DecodeIPPool(f.Value)
		if err != nil || p.Name != k.Name {
			t.Fatalf("%s: %+v, %v", f.Key, p, err)
		}
		if got := p.Encap(); got != want[p.Name] || len(p.EncapProblems()) != 0 {
			t.Errorf("%s: Encap() = %+v (problems %v), want %+v", p.Name, got, p.EncapProblems(), want[p.Name])
		}
	}
}

// TestToward is felix's same-subnet rule: only a cross-subnet pool towards a node inside the local
// subnet goes unencapsulated, and anything unknown encapsulates.
func TestToward(t *testing.T) {
	cross := PoolEncap{Type: EncapIPIP, CrossSubnet: true}
	vx6 := PoolEncap{Type: EncapVXLAN, CrossSubnet: true}
	tests := []struct {
		name   string
		pool   PoolEncap
		local  string // "" for unknown
		remote string
		want   Encap
	}{
		{"same subnet", cross, "192.0.2.0/24", "192.0.2.12", EncapNone},
		{"unmasked local prefix", cross, "192.0.2.11/24", "192.0.2.200", EncapNone},
		{"other subnet", cross, "192.0.2.0/24", "198.51.100.7", EncapIPIP},
		{"subnet edge", cross, "192.0.2.0/25", "192.0.2.128", EncapIPIP},
		{"bare local address: a /32", cross, "192.0.2.11/32", "192.0.2.12", EncapIPIP},
		{"unknown local subnet", cross, "", "192.0.2.12", EncapIPIP},
		{"unknown remote", cross, "192.0.2.0/24", "", EncapIPIP},
		{"IPv4-mapped remote", cross, "192.0.2.0/24", "::ffff:192.0.2.12", EncapNone},
		{"family mismatch", cross, "192.0.2.0/24", "2001:db8::1", EncapIPIP},
		{"always ignores the subnet", PoolEncap{Type: EncapIPIP}, "192.0.2.0/24", "192.0.2.12", EncapIPIP},
		{"v6 same subnet", vx6, "2001:db8:1::/64", "2001:db8:1::9", EncapNone},
		{"v6 other subnet", vx6, "2001:db8:1::/64", "2001:db8:2::9", EncapVXLAN},
		{"no encapsulation", PoolEncap{}, "", "", EncapNone},
	}
	for _, tc := range tests {
		var local netip.Prefix
		var remote netip.Addr
		if tc.local != "" {
			local = netip.MustParsePrefix(tc.local)
		}
		if tc.remote != "" {
			remote = mustAddr(tc.remote)
		}
		if got := tc.pool.Toward(local, remote); got != tc.want {
			t.Errorf("%s: %+v.Toward(%v, %v) = %v, want %v", tc.name, tc.pool, local, remote, got, tc.want)
		}
	}
}

func TestEncapOverhead(t *testing.T) {
	for _, tc := range []struct {
		e      Encap
		v6     bool
		want   int
		String string
	}{
		{EncapNone, false, 0, "none"}, {EncapNone, true, 0, "none"},
		{EncapIPIP, false, 20, "ipip"},
		{EncapVXLAN, false, 50, "vxlan"}, {EncapVXLAN, true, 70, "vxlan"},
	} {
		if got := tc.e.Overhead(tc.v6); got != tc.want || tc.e.String() != tc.String {
			t.Errorf("%v.Overhead(v6=%v) = %d (%s), want %d (%s)", tc.e, tc.v6, got, tc.e, tc.want, tc.String)
		}
	}
}

// TestGeneratedVTEPMAC: vectors computed independently with `printf %s NAME | sha1sum` (0x66, then the
// first five bytes of the digest).
func TestGeneratedVTEPMAC(t *testing.T) {
	for _, tc := range []struct {
		node string
		v6   bool
		want string
	}{
		{"node-a", false, "66:07:02:c1:cc:60"},
		{"node-a", true, "66:d4:d5:51:3d:42"}, // SHA-1("node-a-v6")
		{"worker-1.example.com", false, "66:79:5c:76:d6:59"},
		{"worker-1.example.com", true, "66:72:b8:bf:90:80"},
		{"", false, "66:da:39:a3:ee:5e"},
	} {
		if got := GeneratedVTEPMAC(tc.node, tc.v6).String(); got != tc.want {
			t.Errorf("GeneratedVTEPMAC(%q, %v) = %s, want %s", tc.node, tc.v6, got, tc.want)
		}
	}
}

func TestParseVTEPMAC(t *testing.T) {
	for _, tc := range []struct {
		in, want string // want "" = error
	}{
		{"00:15:5d:a1:b2:c3", "00:15:5d:a1:b2:c3"},
		{"00-15-5D-A1-B2-C3", "00:15:5d:a1:b2:c3"},
		{"0015.5da1.b2c3", "00:15:5d:a1:b2:c3"},
		{" 66:07:02:c1:cc:60 ", "66:07:02:c1:cc:60"},
		{"66:zz:00:11:22:33", ""},
		{"00:00:00:00:00:00", ""},                   // not an address
		{"01:00:5e:00:00:01", ""},                   // multicast
		{"00:00:00:00:fe:80:00:00:00:00:00:00", ""}, // not EUI-48
		{"", ""},
	} {
		m, err := ParseVTEPMAC(tc.in)
		if (err != nil) != (tc.want == "") || (err == nil && m.String() != tc.want) {
			t.Errorf("ParseVTEPMAC(%q) = %s, %v; want %q", tc.in, m, err, tc.want)
		}
	}
}

// TestTestdataNodes decodes Node resources as calico-node writes them and checks each family's
// address, subnet, tunnel endpoints and problems.
func TestTestdataNodes(t *testing.T) {
	type fam struct {
		addr, subnet string
		fromBGP      bool
		ipip, vxlan  string
		vtep         string // "addr mac node-ip", "none" for ErrNoVTEP, "problem" for a *FieldProblem
		problems     []string
	}
	tests := []struct {
		file   string
		labels map[string]string
		v4, v6 fam
	}{
		{file: "encap/node-ipip-v4.json", labels: map[string]string{"topology.kubernetes.io/zone": "rack-1"},
			v4: fam{addr: "192.0.2.11", subnet: "192.0.2.0/24", fromBGP: true, ipip: "10.244.97.128", vtep: "none"},
			v6: fam{vtep: "none"}},
		{file: "encap/node-vxlan-dual.json",
			v4: fam{addr: "198.51.100.7", subnet: "198.51.100.0/26", fromBGP: true, vxlan: "10.244.12.0",
				vtep: "10.244.12.0 66:79:5c:76:d6:59 198.51.100.7"},
			v6: fam{addr: "2001:db8:1::7", subnet: "2001:db8:1::/64", fromBGP: true, vxlan: "fd00:10:244:0:2f1e:8d3c:4b5a:6900",
				vtep: "fd00:10:244:0:2f1e:8d3c:4b5a:6900 66:72:b8:bf:90:80 2001:db8:1::7"}},
		{file: "encap/node-windows-mac.json",
			v4: fam{addr: "192.0.2.40", subnet: "192.0.2.0/24", fromBGP: true, vxlan: "10.244.33.1",
				vtep: "10.244.33.1 00:15:5d:a1:b2:c3 192.0.2.40"},
			v6: fam{vtep: "none"}},
		// No spec.bgp: the first InternalIP of each family, else the first ExternalIP; felix builds no
		// VTEP from these.
		{file: "encap/node-addresses-only.json",
			v4: fam{addr: "10.0.0.5", subnet: "10.0.0.0/16", vxlan: "10.244.70.64", vtep: "none"},
			v6: fam{addr: "2001:db8:9::5", subnet: "2001:db8:9::5/128", vtep: "none"}},
		{file: "encap/node-malformed.json", labels: map[string]string{"zone": "b"},
			v4: fam{vxlan: "10.244.5.0", vtep: "problem",
				problems: []string{"spec.bgp.ipv4Address", "spec.bgp.ipv4IPIPTunnelAddr", "spec.vxlanTunnelMACAddr"}},
			v6: fam{addr: "2001:db8::9", subnet: "2001:db8::/64", fromBGP: true, vtep: "problem",
				problems: []string{"spec.ipv6VXLANTunnelAddr", "spec.vxlanTunnelMACAddrV6"}}},
	}
	for _, tc := range tests {
		t.Run(tc.file, func(t *testing.T) {
			f := loadTestdata(t, tc.file)
			k, err := ParseKey(f.Key)
			if err != nil || k.Kind != KindNode || k.String() != f.Key {
				t.Fatalf("ParseKey(%s) = %+v, %v", f.Key, k, err)
			}
			n, err := DecodeNode(f.Value)
			if err != nil || n.Name != k.Name {
				t.Fatalf("DecodeNode = %+v, %v", n, err)
			}
			for lk, lv := range tc.labels {
				if n.Labels[lk] != lv {
					t.Errorf("label %s = %q, want %q", lk, n.Labels[lk], lv)
				}
			}
			for _, v6 := range []bool{false, true} {
				want, got := tc.v4, n.Family(v6)
				if v6 {
					want = tc.v6
				}
				str := func(v interface {
					IsValid() bool
					String() string
				}) string {
					if !v.IsValid() {
						return ""
					}
					return v.String()
				}
				if str(got.Addr) != want.addr || str(got.Subnet) != want.subnet || got.FromBGP != want.fromBGP ||
					str(got.IPIPTunnelAddr) != want.ipip || str(got.VXLANTunnelAddr) != want.vxlan {
					t.Errorf("v6=%v: %+v, want %+v", v6, got, want)
				}
				if !slices.Equal(problemFields(got.Problems), want.problems) {
					t.Errorf("v6=%v: problems %v, want fields %v", v6, got.Problems, want.problems)
				}
				vtep, err := n.VTEP(v6)
				var fp *FieldProblem
				switch {
				case want.vtep == "none" && !errors.Is(err, ErrNoVTEP):
					t.Errorf("v6=%v: VTEP = %+v, %v; want ErrNoVTEP", v6, vtep, err)
				case want.vtep == "problem" && !errors.As(err, &fp):
					t.Errorf("v6=%v: VTEP = %+v, %v; want a *FieldProblem", v6, vtep, err)
				case want.vtep != "none" && want.vtep != "problem" &&
					(err != nil || fmt.Sprintf("%s %s %s", vtep.Addr, vtep.MAC, vtep.NodeIP) != want.vtep):
					t.Errorf("v6=%v: VTEP = %+v, %v; want %s", v6, vtep, err, want.vtep)
				}
			}
		})
	}
}

// TestDecodeNodeShapes: odd but possible Node values. None fails the decode (labels survive); each
// malformed field is a problem of the family it concerns, and AddrProblem tells a malformed address
// from an absent one.
func TestDecodeNodeShapes(t *testing.T) {
	tests := []struct {
		name           string
		spec           string
		v4, v6         string // "addr subnet", "" when none
		v4Prob, v6Prob []string
		v4AddrProblem  bool
		v6AddrProblem  bool
	}{
		{name: "no spec", spec: ``},
		{name: "null spec", spec: `,"spec":null`},
		{name: "spec not an object", spec: `,"spec":[1]`, v4Prob: []string{"spec"}, v6Prob: []string{"spec"}, v4AddrProblem: true, v6AddrProblem: true},
		{name: "bgp not an object", spec: `,"spec":{"bgp":"x"}`, v4Prob: []string{"spec.bgp"}, v6Prob: []string{"spec.bgp"}, v4AddrProblem: true, v6AddrProblem: true},
		{name: "bare address is a /32", spec: `,"spec":{"bgp":{"ipv4Address":"192.0.2.11"}}`, v4: "192.0.2.11 192.0.2.11/32"},
		{name: "IPv4-mapped", spec: `,"spec":{"bgp":{"ipv4Address":"::ffff:192.0.2.11/120"}}`, v4: "192.0.2.11 192.0.2.0/24"},
		{name: "v6 address in the v4 field", spec: `,"spec":{"bgp":{"ipv4Address":"2001:db8::1/64"}}`, v4Prob: []string{"spec.bgp.ipv4Address"}, v4AddrProblem: true},
		{name: "zone", spec: `,"spec":{"bgp":{"ipv6Address":"fe80::1%eth0/64"}}`, v6Prob: []string{"spec.bgp.ipv6Address"}, v6AddrProblem: true},
		{name: "address not a string", spec: `,"spec":{"bgp":{"ipv4Address":7}}`, v4Prob: []string{"spec.bgp.ipv4Address"}, v4AddrProblem: true},
		// felix falls back to spec.addresses only when spec.bgp has no address of either family.
		{name: "bgp v6 only: no v4 fallback", spec: `,"spec":{"bgp":{"ipv6Address":"2001:db8::1/64"},"addresses":[{"address":"192.0.2.1/24","type":"InternalIP"}]}`,
			v6: "2001:db8::1 2001:db8::/64"},
		{name: "fallback skips CalicoNodeIP", spec: `,"spec":{"addresses":[{"address":"192.0.2.1/24","type":"CalicoNodeIP"},{"address":"198.51.100.1/24","type":"ExternalIP"}]}`,
			v4: "198.51.100.1 198.51.100.0/24"},
		{name: "fallback entry malformed", spec: `,"spec":{"addresses":[{"address":"192.0.2.999","type":"InternalIP"},{"address":"198.51.100.1/24","type":"ExternalIP"}]}`,
			v4: "198.51.100.1 198.51.100.0/24", v4Prob: []string{"spec.addresses[0].address"}, v6Prob: []string{"spec.addresses[0].address"},
			v4AddrProblem: true, v6AddrProblem: true},
		{name: "fallback not a list", spec: `,"spec":{"addresses":{"address":"192.0.2.1"}}`, v4Prob: []string{"spec.addresses"}, v6Prob: []string{"spec.addresses"},
			v4AddrProblem: true, v6AddrProblem: true},
		{name: "fallback entry not an object", spec: `,"spec":{"addresses":[5]}`, v4Prob: []string{"spec.addresses[0]"}, v6Prob: []string{"spec.addresses[0]"},
			v4AddrProblem: true, v6AddrProblem: true},
		{name: "tunnel address problems are not address problems", spec: `,"spec":{"bgp":{"ipv4Address":"192.0.2.11/24","ipv4IPIPTunnelAddr":"x"},"ipv4VXLANTunnelAddr":"fd00::1"}`,
			v4: "192.0.2.11 192.0.2.0/24", v4Prob: []string{"spec.bgp.ipv4IPIPTunnelAddr", "spec.ipv4VXLANTunnelAddr"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n, err := DecodeNode([]byte(`{"kind":"Node","metadata":{"name":"n1","labels":{"zone":"a"}}` + tc.spec + `}`))
			if err != nil || n.Name != "n1" || n.Labels["zone"] != "a" {
				t.Fatalf("DecodeNode = %+v, %v", n, err)
			}
			for _, v6 := range []bool{false, true} {
				f := n.Family(v6)
				want, wantProb, wantAddrProb := tc.v4, tc.v4Prob, tc.v4AddrProblem
				if v6 {
					want, wantProb, wantAddrProb = tc.v6, tc.v6Prob, tc.v6AddrProblem
				}
				got := ""
				if f.Addr.IsValid() {
					got = f.Addr.String() + " " + f.Subnet.String()
				}
				if got != want || !slices.Equal(problemFields(f.Problems), wantProb) || (f.AddrProblem() != nil) != wantAddrProb {
					t.Errorf("v6=%v: %q problems %v (AddrProblem %v); want %q %v (AddrProblem %v)",
						v6, got, f.Problems, f.AddrProblem(), want, wantProb, wantAddrProb)
				}
				for _, p := range f.Problems {
					if !strings.Contains(p.Error(), `Node "n1"`) {
						t.Errorf("problem %q does not name the node", p.Error())
					}
				}
			}
		})
	}
	long := FieldProblem{Kind: "Node", Name: "n", Field: "spec", Value: strings.Repeat("x", 1000), Reason: "not a JSON object"}
	if e := long.Error(); len(e) > 200 || !strings.HasSuffix(e, "...\": not a JSON object") {
		t.Errorf("long problem value not clipped: %d bytes", len(e))
	}
	if _, err := DecodeNode([]byte(`{"metadata":{"name":5}}`)); err == nil {
		t.Error("a Node whose metadata does not decode was accepted")
	}
}

// TestFelixConfiguration: the node override wins over default, default over Calico's defaults; a bad
// field is a problem left unset, so it falls through.
func TestFelixConfiguration(t *testing.T) {
	def, err := DecodeFelixConfiguration(loadTestdata(t, "encap/felixconfig-default.json").Value)
	if err != nil || def.Name != FelixConfigurationDefault || len(def.Problems) != 0 {
		t.Fatalf("default: %+v, %v", def, err)
	}
	f := loadTestdata(t, "encap/felixconfig-node.json")
	k, err := ParseKey(f.Key)
	if err != nil || k.Kind != KindFelixConfiguration || k.String() != f.Key {
		t.Fatalf("ParseKey(%s) = %+v, %v", f.Key, k, err)
	}
	if node, ok := FelixConfigurationNode(k.Name); !ok || node != "node-a" || FelixConfigurationNodeName(node) != k.Name {
		t.Fatalf("FelixConfigurationNode(%q) = %q, %v", k.Name, node, ok)
	}
	if _, ok := FelixConfigurationNode(FelixConfigurationDefault); ok {
		t.Error("default is read as a node override")
	}
	nodeCfg, err := DecodeFelixConfiguration(f.Value)
	if err != nil || !slices.Equal(problemFields(nodeCfg.Problems), []string{"spec.vxlanVNI", "spec.ipipMTU"}) {
		t.Fatalf("node: %+v, %v", nodeCfg, err)
	}
	tests := []struct {
		name         string
		global, node *FelixConfiguration
		want         TunnelConfig
	}{
		{"none", nil, nil, TunnelConfig{VXLANPort: 4789, VXLANVNI: 4096}},
		{"default only", &def, nil, TunnelConfig{VXLANPort: 4789, VXLANVNI: 4097, VXLANMTU: 1450, IPIPMTU: 1480}},
		{"node only", nil, &nodeCfg, TunnelConfig{VXLANPort: 8472, VXLANVNI: 4096, VXLANMTUV6: 1430}},
		// The node's VNI (out of range) and ipipMTU (a string) are problems: default's values apply.
		{"node over default", &def, &nodeCfg, TunnelConfig{VXLANPort: 8472, VXLANVNI: 4097, VXLANMTU: 1450, VXLANMTUV6: 1430, IPIPMTU: 1480}},
	}
	for _, tc := range tests {
		if got := EffectiveTunnelConfig(tc.global, tc.node); got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
	for _, tc := range []struct {
		spec  string
		field string // "" = accepted
	}{
		{`{"vxlanPort":0}`, "spec.vxlanPort"},
		{`{"vxlanPort":65536}`, "spec.vxlanPort"},
		{`{"vxlanPort":4789.5}`, "spec.vxlanPort"},
		{`{"vxlanVNI":0}`, ""},
		{`{"vxlanVNI":16777215}`, ""},
		{`{"vxlanVNI":-1}`, "spec.vxlanVNI"},
		{`{"vxlanMTU":0}`, ""},
		{`{"vxlanMTU":67}`, "spec.vxlanMTU"},
		{`{"vxlanMTUV6":1279}`, "spec.vxlanMTUV6"},
		{`{"ipipMTU":null}`, ""},
		{`"x"`, "spec"},
	} {
		c, err := DecodeFelixConfiguration([]byte(`{"kind":"FelixConfiguration","metadata":{"name":"default"},"spec":` + tc.spec + `}`))
		var want []string
		if tc.field != "" {
			want = []string{tc.field}
		}
		if err != nil || !slices.Equal(problemFields(c.Problems), want) {
			t.Errorf("spec %s: %+v, %v; want problems %v", tc.spec, c, err, want)
		}
	}
	eff := EffectiveTunnelConfig(&def, nil) // vxlanMTU 1450, ipipMTU 1480, vxlanMTUV6 unset
	for _, tc := range []struct {
		e    Encap
		v6   bool
		want int
	}{
		{EncapNone, false, 1500}, {EncapIPIP, false, 1480}, {EncapVXLAN, false, 1450}, {EncapVXLAN, true, 1430},
	} {
		if got := eff.MTU(tc.e, tc.v6, 1500); got != tc.want {
			t.Errorf("MTU(%v, v6=%v, 1500) = %d, want %d", tc.e, tc.v6, got, tc.want)
		}
	}
	if _, err := DecodeFelixConfiguration([]byte(`[`)); err == nil {
		t.Error("non-JSON FelixConfiguration accepted")
	}
}

// TestResourceKeys: Node and FelixConfiguration keys parse to their kind and name and format back.
func TestResourceKeys(t *testing.T) {
	for _, tc := range []struct {
		key  string
		want Key
	}{
		{"/calico/resources/v3/projectcalico.org/nodes/node-a", Key{Kind: KindNode, Name: "node-a"}},
		{"/calico/resources/v3/projectcalico.org/nodes/worker-1.example.com", Key{Kind: KindNode, Name: "worker-1.example.com"}},
		{"/calico/resources/v3/projectcalico.org/felixconfigurations/default", Key{Kind: KindFelixConfiguration, Name: "default"}},
		{"/calico/resources/v3/projectcalico.org/felixconfigurations/node.node-a", Key{Kind: KindFelixConfiguration, Name: "node.node-a"}},
	} {
		k, err := ParseKey(tc.key)
		if err != nil || k != tc.want || k.String() != tc.key {
			t.Errorf("ParseKey(%s) = %+v, %v; want %+v", tc.key, k, err, tc.want)
		}
	}
	if NodeKey("node-a") != NodePrefix+"node-a" || FelixConfigurationKey("default") != FelixConfigurationPrefix+"default" {
		t.Error("key builders")
	}
	for _, bad := range []string{NodePrefix, NodePrefix + "a/b", FelixConfigurationPrefix + "..", FelixConfigurationPrefix} {
		var ke *KeyError
		if _, err := ParseKey(bad); !errors.As(err, &ke) {
			t.Errorf("ParseKey(%q) = %v, want a KeyError", bad, err)
		}
	}
	if KindNode.String() != "node" || KindFelixConfiguration.String() != "felixconfiguration" {
		t.Error("kind names")
	}
}

func FuzzDecodeNode(f *testing.F) {
	for _, name := range []string{"node-ipip-v4.json", "node-vxlan-dual.json", "node-windows-mac.json", "node-addresses-only.json", "node-malformed.json"} {
		f.Add([]byte(loadTestdata(f, "encap/"+name).Value))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		n, err := DecodeNode(data)
		if err != nil {
			return
		}
		for _, v6 := range []bool{false, true} {
			fam := n.Family(v6)
			if fam.Addr.IsValid() != fam.Subnet.IsValid() {
				t.Fatalf("v6=%v: address %v without subnet %v or the reverse", v6, fam.Addr, fam.Subnet)
			}
			if fam.Addr.IsValid() && (fam.Addr.Is6() != v6 || !fam.Subnet.Contains(fam.Addr) || fam.Subnet != fam.Subnet.Masked()) {
				t.Fatalf("v6=%v: address %v, subnet %v", v6, fam.Addr, fam.Subnet)
			}
			for _, a := range []netip.Addr{fam.IPIPTunnelAddr, fam.VXLANTunnelAddr} {
				if a.IsValid() && a.Is6() != v6 {
					t.Fatalf("v6=%v: tunnel address %v of the other family", v6, a)
				}
			}
			vtep, err := n.VTEP(v6)
			var fp *FieldProblem
			if err != nil && !errors.Is(err, ErrNoVTEP) && !errors.As(err, &fp) {
				t.Fatalf("VTEP error of neither kind: %v", err)
			}
			if err == nil && (vtep.MAC == (MAC{}) || vtep.MAC[0]&1 != 0 || vtep.NodeIP != fam.Addr) {
				t.Fatalf("VTEP %+v", vtep)
			}
		}
	})
}

func FuzzDecodeFelixConfiguration(f *testing.F) {
	f.Add([]byte(loadTestdata(f, "encap/felixconfig-default.json").Value))
	f.Add([]byte(loadTestdata(f, "encap/felixconfig-node.json").Value))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := DecodeFelixConfiguration(data)
		if err != nil {
			return
		}
		e := EffectiveTunnelConfig(&c, nil)
		if e.VXLANPort < 1 || e.VXLANPort > 65535 || e.VXLANVNI < 0 || e.VXLANVNI >= 1<<24 || e.VXLANMTU < 0 || e.IPIPMTU < 0 || e.VXLANMTUV6 < 0 {
			t.Fatalf("effective config out of range: %+v", e)
		}
	})
}

func FuzzPoolEncap(f *testing.F) {
	for _, p := range loadTestdataList(f, "encap/ippools.json") {
		f.Add([]byte(p.Value))
	}
	f.Add([]byte(`{"spec":{"cidr":"fd00::/48","ipipMode":"CrossSubnet","vxlanMode":"always"}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := DecodeIPPool(data)
		if err != nil {
			return
		}
		e := p.Encap()
		if e.Type == EncapIPIP && p.CIDR.Addr().Is6() {
			t.Fatalf("IPIP on IPv6 pool %s", p.CIDR)
		}
		if e.Type == EncapNone && e.CrossSubnet {
			t.Fatalf("cross-subnet without encapsulation: %+v", e)
		}
		if len(p.EncapProblems()) == 0 && (!p.IPIPMode.Valid() || !p.VXLANMode.Valid()) {
			t.Fatalf("modes %q, %q without problems", p.IPIPMode, p.VXLANMode)
		}
		// The modes survive an encode and decode.
		enc, err := EncodeIPPool(p)
		if err != nil {
			t.Fatal(err)
		}
		if back, err := DecodeIPPool(enc); err != nil || back.Encap() != e {
			t.Fatalf("round trip %s: %+v, %v", enc, back, err)
		}
	})
}
