package cni_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/cni"
)

func mustPrefix(s string) netip.Prefix { return netip.MustParsePrefix(s) }

// TestPoolSelection: without ipv4_pools only enabled, automatic, workload pools that select every
// node are used; named pools are used as named, disabled or missing names fail with 7, and a CIDR no
// IPPool has is a pool of the default block size.
func TestPoolSelection(t *testing.T) {
	e := newEnv(t)
	e.putPool("pool-a", "10.10.0.0/16", 26)
	e.putPool("pool-b", "10.20.0.0/16", 28)
	e.putPool("pool-off", "10.30.0.0/16", 26, func(p *calico.IPPool) { p.Disabled = true })
	e.putPool("pool-manual", "10.40.0.0/16", 26, func(p *calico.IPPool) { p.AssignmentMode = "Manual" })
	e.putPool("pool-sel", "10.60.0.0/16", 26, func(p *calico.IPPool) { p.NodeSelector = "rack == 'a'" })
	e.putPool("pool-tunnel", "10.70.0.0/16", 26, func(p *calico.IPPool) { p.AllowedUses = []string{"Tunnel"} })

	tests := []struct {
		pools []string
		in    string
		block int
	}{
		{nil, "10.10.0.0/16", 26},
		{[]string{"pool-b"}, "10.20.0.0/16", 28},
		{[]string{"10.50.0.0/24"}, "10.50.0.0/24", 26},
		{[]string{"pool-manual"}, "10.40.0.0/16", 26},
		{[]string{"10.20.0.0/16"}, "10.20.0.0/16", 28},
	}
	for i, tc := range tests {
		extra := map[string]any{"result_prefix": "block"}
		if tc.pools != nil {
			extra["ipv4_pools"] = tc.pools
		}
		r := e.mustAdd(e.list(netOpts{ipam: e.ipam("node1", extra)}), rt(fmt.Sprintf("c%d", i), "eth0"))
		got := addrs(r)[0]
		if !mustPrefix(tc.in).Contains(got.Addr()) || got.Bits() != tc.block {
			t.Errorf("pools %v: got %v, want an address of %s in a /%d block", tc.pools, got, tc.in, tc.block)
		}
	}
	for _, tc := range []struct {
		pools []string
		msg   string
	}{{[]string{"nope"}, "ipam.ipv4_pools[0]"}, {[]string{"pool-a", "pool-off"}, "ipam.ipv4_pools[1]"}} {
		_, err := e.add(e.list(netOpts{ipam: e.ipam("node1", map[string]any{"ipv4_pools": tc.pools})}), rt("bad", "eth0"))
		wantCode(t, err, 7, tc.msg)
	}

	empty := newEnv(t)
	_, err := empty.add(empty.list(netOpts{ipam: empty.ipam("node1", nil)}), rt("c1", "eth0"))
	wantCode(t, err, 7, "ipv4_pools")
}

// TestSpecificIPs: runtimeConfig.ips (capability "ips"), args.cni.ips and CNI_ARGS IP= each give the
// requested address, claiming its block when needed; an address held by another container, outside
// the pools, excluded, or (strict affinity) in another node's block is refused with 101.
func TestSpecificIPs(t *testing.T) {
	e := newEnv(t)
	e.putPool("p", "10.244.0.0/16", 26)
	base := e.ipam("node1", map[string]any{"exclude": []string{"10.244.7.12"}})
	capList := e.list(netOpts{ipam: base, caps: map[string]bool{"ips": true}})

	withIPs := func(cid string, ips ...string) *libcni.RuntimeConf {
		r := rt(cid, "eth0")
		r.CapabilityArgs = map[string]any{"ips": ips}
		return r
	}
	if got := addrs(e.mustAdd(capList, withIPs("c1", "10.244.7.9/24"))); got[0] != mustPrefix("10.244.7.9/32") {
		t.Fatalf("runtimeConfig.ips: got %v", got)
	}
	b := e.block("10.244.7.0/26")
	if b.Affinity == nil || *b.Affinity != "host:node1" {
		t.Fatalf("claimed block affinity %v", b.Affinity)
	}
	// Idempotent with a requested address, too.
	if got := addrs(e.mustAdd(capList, withIPs("c1", "10.244.7.9"))); got[0] != mustPrefix("10.244.7.9/32") {
		t.Fatalf("repeated ADD: %v", got)
	}
	_, err := e.add(capList, withIPs("c2", "10.244.7.9"))
	wantCode(t, err, cni.ErrAddressUnavailable, `held by handle "net1.c1"`)

	argsList := e.list(netOpts{ipam: base, top: map[string]any{"args": map[string]any{"cni": map[string]any{"ips": []string{"10.244.7.10"}}}}})
	if got := addrs(e.mustAdd(argsList, rt("c3", "eth0"))); got[0] != mustPrefix("10.244.7.10/32") {
		t.Fatalf("args.cni.ips: got %v", got)
	}
	plain := e.list(netOpts{ipam: base})
	if got := addrs(e.mustAdd(plain, rt("c4", "eth0", [2]string{"IP", "10.244.7.11"}))); got[0] != mustPrefix("10.244.7.11/32") {
		t.Fatalf("CNI_ARGS IP: got %v", got)
	}
	_, err = e.add(plain, rt("c5", "eth0", [2]string{"IP", "192.168.1.1"}))
	wantCode(t, err, cni.ErrAddressUnavailable, "outside")
	_, err = e.add(plain, rt("c6", "eth0", [2]string{"IP", "10.244.7.12"}))
	wantCode(t, err, cni.ErrAddressUnavailable, "excluded")

	// An address in node2's block: refused under strict affinity, borrowed without it.
	node2 := e.list(netOpts{ipam: e.ipam("node2", nil)})
	n2 := addrs(e.mustAdd(node2, rt("n2c1", "eth0")))[0].Addr()
	n2block := netip.PrefixFrom(n2, 26).Masked()
	want, _ := calico.OrdinalAddr(n2block, 5)
	e.putIPAMConfig(calico.IPAMConfig{StrictAffinity: true, AutoAllocateBlocks: true})
	_, err = e.add(plain, rt("c7", "eth0", [2]string{"IP", want.String()}))
	wantCode(t, err, cni.ErrAddressUnavailable, "strict affinity")
	e.putIPAMConfig(calico.DefaultIPAMConfig())
	if got := addrs(e.mustAdd(plain, rt("c7", "eth0", [2]string{"IP", want.String()}))); got[0].Addr() != want {
		t.Fatalf("borrowed specific address: %v", got)
	}
	for _, a := range e.snapshot().Allocations {
		if a.Addr == want && (a.Owner != "node2" || a.Node != "node1") {
			t.Fatalf("borrowed %s: owner %s node %s", want, a.Owner, a.Node)
		}
	}
}

// TestDualStack: one ADD gives an IPv4 and an IPv6 address in one transaction, with per-family
// gateways, the configured routes and DNS, and block-sized masks when asked; DEL frees both.
func TestDualStack(t *testing.T) {
	e := newEnv(t)
	e.putPool("default-ipv4-ippool", "10.244.0.0/16", 26)
	e.putPool("default-ipv6-ippool", "fd00:10:244::/56", 122)
	ipam := e.ipam("node1", map[string]any{
		"assign_ipv6": "true", "gateways": []string{"10.244.0.1", "fd00:10:244::1"},
		"routes": []any{map[string]any{"dst": "0.0.0.0/0"}, map[string]any{"dst": "::/0"}},
		"dns":    map[string]any{"nameservers": []string{"10.96.0.10"}, "search": []string{"svc.cluster.local"}},
	})
	list := e.list(netOpts{ipam: ipam})
	r := e.mustAdd(list, rt("c1", "eth0"))
	if len(r.IPs) != 2 || r.IPs[0].Address.IP.To4() == nil || r.IPs[1].Address.IP.To4() != nil {
		t.Fatalf("IPs %v: want IPv4 then IPv6", r.IPs)
	}
	if r.IPs[0].Gateway.String() != "10.244.0.1" || r.IPs[1].Gateway.String() != "fd00:10:244::1" {
		t.Errorf("gateways %v %v", r.IPs[0].Gateway, r.IPs[1].Gateway)
	}
	if ones, _ := r.IPs[1].Address.Mask.Size(); ones != 128 {
		t.Errorf("IPv6 mask /%d", ones)
	}
	if len(r.Routes) != 2 || len(r.DNS.Nameservers) != 1 || r.DNS.Search[0] != "svc.cluster.local" {
		t.Errorf("routes %v dns %+v", r.Routes, r.DNS)
	}
	if h := e.snapshot().Handles["net1.c1"]; h == nil || len(h.Block) != 2 {
		t.Fatalf("handle %+v: want one count in each family's block", h)
	}
	ipam["result_prefix"] = "block"
	rb := e.mustAdd(e.list(netOpts{ipam: ipam}), rt("c2", "eth0"))
	if a := addrs(rb); a[0].Bits() != 26 || a[1].Bits() != 122 {
		t.Errorf("result_prefix block: %v", a)
	}
	e.mustDel(list, rt("c1", "eth0"))
	e.mustDel(list, rt("c2", "eth0"))
	if n := len(e.snapshot().Allocations); n != 0 {
		t.Fatalf("%d allocations left", n)
	}
}

// TestExhaustion: a pool of four /30 blocks. With strict affinity a node stops at its block cap and
// at the end of the pool with 100 "pool exhausted"; without it, a full node borrows a free address
// from another node's block, recorded with its own node so that the agent routes it as a /32.
func TestExhaustion(t *testing.T) {
	e := newEnv(t)
	e.putPool("small", "10.9.0.0/28", 30)
	e.putIPAMConfig(calico.IPAMConfig{StrictAffinity: true, AutoAllocateBlocks: true})
	node1 := e.list(netOpts{ipam: e.ipam("node1", map[string]any{"max_blocks_per_host": 2})})
	node2 := e.list(netOpts{ipam: e.ipam("node2", nil)})
	for i := range 8 {
		e.mustAdd(node1, rt(fmt.Sprintf("n1c%d", i), "eth0"))
	}
	_, err := e.add(node1, rt("n1c8", "eth0"))
	wantCode(t, err, cni.ErrPoolExhausted, "maximum per host")
	for i := range 8 {
		e.mustAdd(node2, rt(fmt.Sprintf("n2c%d", i), "eth0"))
	}
	_, err = e.add(node2, rt("n2c8", "eth0"))
	wantCode(t, err, cni.ErrPoolExhausted, "strict affinity")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	wantCode(t, e.cni.GetStatusNetworkList(ctx, node2), cni.ErrPluginNotAvailable, "exhausted")

	e.putIPAMConfig(calico.DefaultIPAMConfig())
	_, err = e.add(node2, rt("n2c8", "eth0"))
	wantCode(t, err, cni.ErrPoolExhausted, "no free address")
	freed := addrs(e.mustAdd(node1, rt("n1c3", "eth0")))[0].Addr()
	e.mustDel(node1, rt("n1c3", "eth0"))
	if err := e.cni.GetStatusNetworkList(ctx, node2); err != nil {
		t.Fatalf("STATUS with a borrowable address: %v", err)
	}
	got := addrs(e.mustAdd(node2, rt("n2c8", "eth0")))[0].Addr()
	if got != freed {
		t.Fatalf("borrowed %s, the only free address is %s", got, freed)
	}
	for _, a := range e.snapshot().Allocations {
		if a.Addr == got && (a.Owner != "node1" || a.Node != "node2") {
			t.Fatalf("borrowed %s: block owner %q, node %q", got, a.Owner, a.Node)
		}
	}
	// The borrower releases it like any other address.
	e.mustDel(node2, rt("n2c8", "eth0"))
}

// TestBlockCapFromCalicoConfig: without max_blocks_per_host the cap is Calico's maxBlocksPerHost.
func TestBlockCapFromCalicoConfig(t *testing.T) {
	e := newEnv(t)
	e.putPool("small", "10.9.0.0/28", 30)
	e.putIPAMConfig(calico.IPAMConfig{StrictAffinity: true, AutoAllocateBlocks: true, MaxBlocksPerHost: 1})
	list := e.list(netOpts{ipam: e.ipam("node1", nil)})
	for i := range 4 {
		e.mustAdd(list, rt(fmt.Sprintf("c%d", i), "eth0"))
	}
	_, err := e.add(list, rt("c4", "eth0"))
	wantCode(t, err, cni.ErrPoolExhausted, "1 ipv4 blocks, the maximum")
}

// TestExcludeRanges: excluded addresses are never handed out, a block-sized subnet wholly excluded is
// never claimed, and the remaining addresses are all used.
func TestExcludeRanges(t *testing.T) {
	e := newEnv(t)
	e.putPool("p", "10.9.0.0/27", 28)
	e.putIPAMConfig(calico.IPAMConfig{StrictAffinity: true, AutoAllocateBlocks: true})
	list := e.list(netOpts{ipam: e.ipam("node1", map[string]any{"exclude": []string{"10.9.0.0/28", "10.9.0.16/30", "10.9.0.21"}})})
	var got []netip.Addr
	for i := range 11 {
		got = append(got, addrs(e.mustAdd(list, rt(fmt.Sprintf("c%d", i), "eth0")))[0].Addr())
	}
	want := []string{"10.9.0.20", "10.9.0.22", "10.9.0.23", "10.9.0.24", "10.9.0.25", "10.9.0.26", "10.9.0.27", "10.9.0.28", "10.9.0.29", "10.9.0.30", "10.9.0.31"}
	for i, w := range want {
		if got[i] != netip.MustParseAddr(w) {
			t.Fatalf("allocation %d = %s, want %s (all: %v)", i, got[i], w, got)
		}
	}
	_, err := e.add(list, rt("c11", "eth0"))
	wantCode(t, err, cni.ErrPoolExhausted, "")
	if _, ok := e.snapshot().Blocks[mustPrefix("10.9.0.0/28")]; ok {
		t.Fatal("a wholly excluded block was claimed")
	}
}

// TestClaimAvoidsOverlap: existing blocks of other sizes (after a block size change) are never
// overlapped by a new claim.
func TestClaimAvoidsOverlap(t *testing.T) {
	e := newEnv(t)
	e.putPool("p", "10.9.0.0/24", 26)
	for node, cidr := range map[string]string{"nodex": "10.9.0.0/25", "nodey": "10.9.0.128/28"} {
		b := calico.NewBlock(mustPrefix(cidr), "host:"+node, 1)
		data, _ := calico.EncodeBlock(b)
		e.put(calico.BlockKey(b.CIDR), data)
		aff, _ := calico.EncodeAffinity(calico.AffinityValue{State: calico.AffinityConfirmed})
		e.put(calico.HostAffinityKey(node, b.CIDR), aff)
	}
	r := e.mustAdd(e.list(netOpts{ipam: e.ipam("node1", map[string]any{"result_prefix": "block"})}), rt("c1", "eth0"))
	if got := addrs(r)[0]; got != mustPrefix("10.9.0.192/26") {
		t.Fatalf("claimed %v, the only free /26 is 10.9.0.192/26", got)
	}
}

// TestResultVersions: the result is converted to the configuration's cniVersion.
func TestResultVersions(t *testing.T) {
	e := newEnv(t)
	e.putPool("p", "10.244.0.0/16", 26)
	for i, v := range []string{"0.3.1", "0.4.0", "1.0.0", "1.1.0"} {
		list := e.list(netOpts{cniVersion: v, ipam: e.ipam("node1", nil)})
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		out, stderr, err := execPlugin(ctx, cniEnv("ADD", fmt.Sprintf("c%d", i), "eth0", "/var/run/netns/x", ""), pluginConf(t, list))
		cancel()
		if err != nil {
			t.Fatalf("%s: %v\n%s\n%s", v, err, out, stderr)
		}
		var res struct {
			CNIVersion string `json:"cniVersion"`
			IPs        []struct {
				Version string `json:"version"`
				Address string `json:"address"`
			} `json:"ips"`
		}
		if err := json.Unmarshal(out, &res); err != nil {
			t.Fatalf("%s: %v: %s", v, err, out)
		}
		wantVersion := ""
		if v == "0.3.1" || v == "0.4.0" {
			wantVersion = "4"
		}
		if res.CNIVersion != v || len(res.IPs) != 1 || res.IPs[0].Version != wantVersion {
			t.Errorf("%s: result %s", v, out)
		}
		e.mustDel(list, rt(fmt.Sprintf("c%d", i), "eth0"))
	}
}
