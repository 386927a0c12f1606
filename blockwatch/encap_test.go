package blockwatch

import (
	"encoding/json"
	"log/slog"
	"maps"
	"net/netip"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/internal/calicotest"
)

// encapFixture reads one file of calico/testdata/encap ({"key", "value"}).
func encapFixture(t testing.TB, name string) testdataValue {
	t.Helper()
	raw, err := os.ReadFile("../calico/testdata/encap/" + name + ".json")
	if err != nil {
		t.Fatal(err)
	}
	var v testdataValue
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return v
}

// felixValue is a FelixConfiguration value with the given spec.
func felixValue(name, spec string) string {
	return `{"kind":"FelixConfiguration","apiVersion":"projectcalico.org/v3","metadata":{"name":"` + name + `"},"spec":` + spec + `}`
}

// nodeValue is a Node value with the given spec.
func nodeValue(name, spec string) string {
	return `{"kind":"Node","apiVersion":"projectcalico.org/v3","metadata":{"name":"` + name + `","labels":{"a":"b"}},"spec":` + spec + `}`
}

// TestNodesAndFelixConfigs lists Calico's Node and FelixConfiguration resources as calico-node
// writes them, then watches them: Nodes (routing data only) and ChangedNodes, this node's effective
// tunnel configuration; other nodes' FelixConfigurations are ignored; a Node that does not decode
// keeps its last good value, also across a relist; a field problem is counted once, when it appears.
func TestNodesAndFelixConfigs(t *testing.T) {
	_, cli := startEtcd(t)
	for _, f := range []string{"node-ipip-v4", "node-vxlan-dual", "node-malformed", "felixconfig-default", "felixconfig-node"} {
		v := encapFixture(t, f)
		put(t, cli, v.Key, string(v.Value))
	}
	// Another node's override and a name felix does not read: never decoded, never counted.
	put(t, cli, calico.FelixConfigurationKey("node.node-b"), felixValue("node.node-b", `{"vxlanPort":9999}`))
	put(t, cli, calico.FelixConfigurationKey("other"), `{not json`)
	h := newHarness(t, cli, func(c *Config) { c.NodeName = "node-a" })
	h.run()
	s := h.next()

	if len(s.Nodes) != 3 || s.ChangedNodes != nil {
		t.Fatalf("initial: nodes %v changed %v", s.Nodes, s.ChangedNodes)
	}
	a := s.Nodes["node-a"]
	if a.Name != "node-a" || a.Labels != nil || a.V4.Addr != mustAddr("192.0.2.11") || a.V4.Subnet != mustPrefix("192.0.2.0/24") ||
		!a.V4.FromBGP || a.V4.IPIPTunnelAddr != mustAddr("10.244.97.128") || a.V6.Addr.IsValid() {
		t.Errorf("node-a: %+v", a)
	}
	if vtep, err := s.Nodes["worker-1.example.com"].VTEP(true); err != nil || vtep.Addr != mustAddr("fd00:10:244:0:2f1e:8d3c:4b5a:6900") ||
		vtep.NodeIP != mustAddr("2001:db8:1::7") || vtep.MAC.String() != "66:72:b8:bf:90:80" {
		t.Errorf("worker-1 IPv6 VTEP %+v, %v", vtep, err)
	}
	bad := s.Nodes["node-bad"]
	if bad.V4.AddrProblem() == nil || bad.V6.Addr != mustAddr("2001:db8::9") || len(bad.V4.Problems) == 0 {
		t.Errorf("node-bad: %+v", bad)
	}
	// default: VNI 4097, vxlanMTU 1450, ipipMTU 1480; node.node-a: port 8472, vxlanMTUV6 1430 (its VNI
	// and ipipMTU are problems and fall through); node.node-b's port is not read.
	want := calico.TunnelConfig{VXLANPort: 8472, VXLANVNI: 4097, VXLANMTU: 1450, VXLANMTUV6: 1430, IPIPMTU: 1480}
	if s.Tunnel != want || len(s.TunnelProblems) != 2 || !s.TunnelChanged {
		t.Errorf("tunnel %+v problems %v changed %v, want %+v", s.Tunnel, s.TunnelProblems, s.TunnelChanged, want)
	}
	if n := h.counter("vpp_route_agent_malformed_values_total"); n != 0 {
		t.Errorf("malformed = %v, want 0 (other FelixConfigurations are not read)", n)
	}
	if n := h.counter("vpp_route_agent_field_problems_total", "kind", "FelixConfiguration"); n != 2 {
		t.Errorf("field_problems{FelixConfiguration} = %v, want 2", n)
	}
	nodeProblemCount := h.counter("vpp_route_agent_field_problems_total", "kind", "Node")
	if want := len(nodeProblems(bad)); nodeProblemCount != float64(want) || want == 0 {
		t.Errorf("field_problems{Node} = %v, want %d", nodeProblemCount, want)
	}

	// A new node arrives, alone in ChangedNodes.
	put(t, cli, calico.NodeKey("node-b"), nodeValue("node-b", `{"bgp":{"ipv4Address":"192.0.2.12/24"}}`))
	s = h.next()
	if !slices.Equal(s.ChangedNodes, []string{"node-b"}) || s.Nodes["node-b"].V4.Addr != mustAddr("192.0.2.12") || s.TunnelChanged || s.PoolsChanged {
		t.Fatalf("node-b added: changed %v nodes %v tunnel changed %v", s.ChangedNodes, s.Nodes, s.TunnelChanged)
	}
	// Another node's override changes nothing; nor does a write of node-bad with the same problems,
	// which are not counted again.
	put(t, cli, calico.FelixConfigurationKey("node.node-b"), felixValue("node.node-b", `{"vxlanPort":9998}`))
	rev := put(t, cli, encapFixture(t, "node-malformed").Key, string(encapFixture(t, "node-malformed").Value))
	h.settled(rev)
	if n := h.counter("vpp_route_agent_field_problems_total", "kind", "Node"); n != nodeProblemCount {
		t.Errorf("field_problems{Node} = %v after a rewrite with the same problems, want %v", n, nodeProblemCount)
	}

	// A Node that does not decode keeps its last good value: no change, counted by source.
	rev = put(t, cli, calico.NodeKey("node-a"), `{"metadata":`)
	h.settled(rev)
	rev = put(t, cli, calico.NodeKey("node-c"), nodeValue("node-d", `{}`)) // name differs from the key's
	h.settled(rev)
	if n := h.counter("vpp_route_agent_malformed_values_total", "source", "nodes"); n != 2 {
		t.Errorf("malformed{nodes} = %v, want 2", n)
	}
	// This node's override changes: the tunnel changes, its problems are gone.
	put(t, cli, calico.FelixConfigurationKey("node.node-a"), felixValue("node.node-a", `{"vxlanPort":4790}`))
	s = h.next()
	want = calico.TunnelConfig{VXLANPort: 4790, VXLANVNI: 4097, VXLANMTU: 1450, IPIPMTU: 1480}
	if !s.TunnelChanged || s.Tunnel != want || len(s.TunnelProblems) != 0 || len(s.ChangedNodes) != 0 {
		t.Fatalf("override changed: tunnel %+v (changed %v) problems %v nodes changed %v", s.Tunnel, s.TunnelChanged, s.TunnelProblems, s.ChangedNodes)
	}
	if !nodeEqual(s.Nodes["node-a"], a) {
		t.Errorf("node-a after a malformed write: %+v, want its last good value %+v", s.Nodes["node-a"], a)
	}
	if _, ok := s.Nodes["node-c"]; ok {
		t.Error("node-c, never good, is in Nodes")
	}

	// A relist keeps the last good value of the malformed node and reports no change.
	h.w.Relist()
	s = h.next()
	if !s.Full || !nodeEqual(s.Nodes["node-a"], a) || len(s.Nodes) != 4 || s.ChangedNodes != nil || s.TunnelChanged || s.Tunnel != want {
		t.Fatalf("relist: full %v nodes %v changed %v tunnel %+v (changed %v)", s.Full, s.Nodes, s.ChangedNodes, s.Tunnel, s.TunnelChanged)
	}
	if n := h.counter("vpp_route_agent_field_problems_total", "kind", "Node"); n != nodeProblemCount {
		t.Errorf("field_problems{Node} = %v after a relist, want %v (each problem reported once)", n, nodeProblemCount)
	}

	// Deletes remove: the node, and this node's override (back to the default's settings).
	del(t, cli, calico.NodeKey("node-b"))
	s = h.next()
	if _, ok := s.Nodes["node-b"]; ok || !slices.Equal(s.ChangedNodes, []string{"node-b"}) {
		t.Fatalf("node-b deleted: nodes %v changed %v", s.Nodes, s.ChangedNodes)
	}
	del(t, cli, calico.FelixConfigurationKey("node.node-a"))
	s = h.next()
	if want := (calico.TunnelConfig{VXLANPort: calico.DefaultVXLANPort, VXLANVNI: 4097, VXLANMTU: 1450, IPIPMTU: 1480}); !s.TunnelChanged || s.Tunnel != want {
		t.Fatalf("override deleted: tunnel %+v (changed %v), want %+v", s.Tunnel, s.TunnelChanged, want)
	}
	if n := h.counter("vpp_route_agent_etcd_events_total", "source", "felixconfigurations", "type", "delete"); n != 1 {
		t.Errorf("events{felixconfigurations,delete} = %v", n)
	}
}

// TestPoolModeChange: an edit of a pool's ipipMode or vxlanMode alone is a pool change; a pool whose
// modes Calico would refuse is kept as written, its problem counted once.
func TestPoolModeChange(t *testing.T) {
	_, cli := startEtcd(t)
	pool := func(ipip, vxlan string) string {
		return `{"kind":"IPPool","metadata":{"name":"p"},"spec":{"cidr":"10.244.0.0/16","blockSize":26,"ipipMode":"` + ipip + `","vxlanMode":"` + vxlan + `"}}`
	}
	put(t, cli, calico.IPPoolKey("p"), pool("Never", "Never"))
	h := newHarness(t, cli, nil)
	h.run()
	if s := h.next(); s.Pools["p"].Encap().Type != calico.EncapNone {
		t.Fatalf("initial: %+v", s.Pools)
	}
	put(t, cli, calico.IPPoolKey("p"), pool("Always", "Never"))
	s := h.next()
	if !s.PoolsChanged || s.Pools["p"].IPIPMode != calico.EncapAlways || s.Pools["p"].Encap().Type != calico.EncapIPIP {
		t.Fatalf("ipipMode Always: changed %v pools %+v", s.PoolsChanged, s.Pools)
	}
	put(t, cli, calico.IPPoolKey("p"), pool("Never", "CrossSubnet"))
	s = h.next()
	if e := s.Pools["p"].Encap(); !s.PoolsChanged || e != (calico.PoolEncap{Type: calico.EncapVXLAN, CrossSubnet: true}) {
		t.Fatalf("vxlanMode CrossSubnet: changed %v encap %+v", s.PoolsChanged, e)
	}
	// Both modes on: kept as written (VXLAN wins in felix's reading), the problem counted once.
	put(t, cli, calico.IPPoolKey("p"), pool("Always", "CrossSubnet"))
	s = h.next()
	if p := s.Pools["p"]; !s.PoolsChanged || p.IPIPMode != calico.EncapAlways || p.Encap().Type != calico.EncapVXLAN || len(p.EncapProblems()) != 1 {
		t.Fatalf("both modes: changed %v pool %+v", s.PoolsChanged, p)
	}
	rev := put(t, cli, calico.IPPoolKey("p"), pool("Always", "CrossSubnet"))
	h.settled(rev)
	if n := h.counter("vpp_route_agent_field_problems_total", "kind", "IPPool", "field", "spec.ipipMode"); n != 1 {
		t.Errorf("field_problems{IPPool,spec.ipipMode} = %v, want 1", n)
	}
}

// TestCompactionRelistNodes: the relist after a compaction reads the Nodes and FelixConfigurations
// too, and reports what changed in them while the watch was behind.
func TestCompactionRelistNodes(t *testing.T) {
	srv, cli := startEtcd(t)
	px := newProxy(t, srv.Endpoint())
	put(t, cli, calico.NodeKey("node-a"), nodeValue("node-a", `{"bgp":{"ipv4Address":"192.0.2.11/24"}}`))
	put(t, cli, calico.NodeKey("node-b"), nodeValue("node-b", `{"bgp":{"ipv4Address":"192.0.2.12/24"}}`))
	h := newHarness(t, fastClient(t, px.Endpoint()), func(c *Config) {
		c.NodeName, c.ProbeInterval, c.CompactedRelistSpread = "node-a", 5*time.Second, -1
	})
	h.run()
	if s := h.next(); len(s.Nodes) != 2 || s.Tunnel.VXLANVNI != calico.DefaultVXLANVNI {
		t.Fatalf("initial: %v %+v", s.Nodes, s.Tunnel)
	}
	px.Block()
	put(t, cli, calico.NodeKey("node-b"), nodeValue("node-b", `{"bgp":{"ipv4Address":"198.51.100.12/24"},"ipv4VXLANTunnelAddr":"10.244.1.0"}`))
	del(t, cli, calico.NodeKey("node-a"))
	put(t, cli, calico.NodeKey("node-c"), nodeValue("node-c", `{"bgp":{"ipv4Address":"192.0.2.13/24"}}`))
	put(t, cli, calico.FelixConfigurationKey("default"), felixValue("default", `{"vxlanVNI":7}`))
	crev, err := srv.Compact(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	px.Unblock()
	s, _ := h.waitFor("a Full snapshot", func(s *Snapshot) bool { return s.Full })
	if s.RelistReason != ReasonCompacted || s.Revision < crev {
		t.Fatalf("relist reason %q at revision %d (compacted at %d)", s.RelistReason, s.Revision, crev)
	}
	if !slices.Equal(s.ChangedNodes, []string{"node-a", "node-b", "node-c"}) || len(s.Nodes) != 2 ||
		s.Nodes["node-b"].V4.VXLANTunnelAddr != mustAddr("10.244.1.0") || !s.TunnelChanged || s.Tunnel.VXLANVNI != 7 {
		t.Errorf("relist: nodes %v changed %v tunnel %+v (changed %v)", s.Nodes, s.ChangedNodes, s.Tunnel, s.TunnelChanged)
	}
}

// TestInstallNodes: the revision and incarnation rules of the other sources apply to Nodes and
// FelixConfigurations.
func TestInstallNodes(t *testing.T) {
	w, err := New(Config{Client: &clientv3.Client{}, Logger: slog.New(slog.DiscardHandler), NodeName: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	c := newCache()
	step := func(src source, key string, rev, created int64, value string, del bool) *changes {
		ch := &changes{}
		d := w.decode(src, &mvccpb.KeyValue{Key: []byte(key), Value: []byte(value), ModRevision: rev, CreateRevision: created}, del)
		w.install(c, c, &d, ch)
		return ch
	}
	key := calico.NodeKey("n1")
	good := nodeValue("n1", `{"bgp":{"ipv4Address":"192.0.2.1/24"}}`)
	if ch := step(srcNodes, key, 10, 10, good, false); len(ch.nodes) != 1 || c.nodes["n1"].V4.Addr != mustAddr("192.0.2.1") {
		t.Fatalf("create: %v %+v", ch.nodes, c.nodes)
	}
	if ch := step(srcNodes, key, 9, 9, nodeValue("n1", `{}`), false); !ch.empty() || !c.nodes["n1"].V4.Addr.IsValid() {
		t.Fatal("stale put applied")
	}
	if ch := step(srcNodes, key, 11, 10, `[`, false); !ch.empty() || c.nodeRevs["n1"] != 11 || !c.nodes["n1"].V4.Addr.IsValid() {
		t.Fatalf("malformed: %v rev %d", c.nodes, c.nodeRevs["n1"])
	}
	if ch := step(srcNodes, key, 11, 10, nodeValue("n1", `{}`), false); !ch.empty() {
		t.Fatal("put at the malformed value's revision applied")
	}
	// Same routing data, other labels: no change.
	if ch := step(srcNodes, key, 12, 10, `{"metadata":{"name":"n1","labels":{"x":"y"}},"spec":{"bgp":{"ipv4Address":"192.0.2.1/24"}}}`, false); !ch.empty() {
		t.Fatalf("labels only: %v", ch.nodes)
	}
	// A relist: a malformed value keeps the previous view's only for the same incarnation.
	for _, tc := range []struct {
		created int64
		kept    bool
	}{{10, true}, {13, false}} {
		next := newCache()
		d := w.decode(srcNodes, &mvccpb.KeyValue{Key: []byte(key), Value: []byte(`[`), ModRevision: 20, CreateRevision: tc.created}, false)
		w.install(next, c, &d, nil)
		if _, ok := next.nodes["n1"]; ok != tc.kept {
			t.Errorf("relist, malformed value created at %d: kept %v, want %v", tc.created, ok, tc.kept)
		}
	}
	if ch := step(srcNodes, key, 13, 0, "", true); !slices.Equal(slices.Collect(maps.Keys(ch.nodes)), []string{"n1"}) || len(c.nodes) != 0 || len(c.nodeRevs) != 0 {
		t.Fatalf("delete: %v %v", c.nodes, c.nodeRevs)
	}
	// A long problem value is clipped.
	step(srcNodes, key, 14, 14, nodeValue("n1", `{"bgp":{"ipv4Address":"`+string(slices.Repeat([]byte("9"), 500))+`"}}`), false)
	if p := c.nodes["n1"].V4.Problems; len(p) != 1 || len(p[0].Value) > maxProblemValue+3 {
		t.Errorf("problems of a long value: %+v", p)
	}

	// FelixConfigurations: this node's and default; others ignored, also when malformed.
	if ch := step(srcFelixConfigs, calico.FelixConfigurationKey("node.n2"), 30, 30, `[`, false); !ch.empty() || c.felix != [2]felixEntry{} {
		t.Fatalf("another node's: %+v", c.felix)
	}
	if ch := step(srcFelixConfigs, calico.FelixConfigurationKey("node.n1"), 31, 31, felixValue("node.n1", `{"vxlanVNI":5}`), false); !ch.tunnel || c.tunnel.VXLANVNI != 5 {
		t.Fatalf("this node's: %+v", c.tunnel)
	}
	if ch := step(srcFelixConfigs, calico.FelixConfigurationKey("default"), 32, 32, felixValue("default", `{"vxlanVNI":6,"vxlanPort":1000}`), false); !ch.tunnel || c.tunnel.VXLANVNI != 5 || c.tunnel.VXLANPort != 1000 {
		t.Fatalf("default under this node's: %+v", c.tunnel)
	}
	if ch := step(srcFelixConfigs, calico.FelixConfigurationKey("node.n1"), 33, 31, `{`, false); !ch.empty() || c.tunnel.VXLANVNI != 5 {
		t.Fatalf("malformed override: %+v", c.tunnel)
	}
	if ch := step(srcFelixConfigs, calico.FelixConfigurationKey("node.n1"), 34, 0, "", true); !ch.tunnel || c.tunnel.VXLANVNI != 6 {
		t.Fatalf("override deleted: %+v", c.tunnel)
	}
}

// TestPoolEqualComparesEveryField: a pool that differs in any one field is a change (a field added to
// calico.IPPool and forgotten in poolEqual fails here).
func TestPoolEqualComparesEveryField(t *testing.T) {
	base := calico.IPPool{Name: "p", CIDR: mustPrefix("10.0.0.0/16"), BlockSize: 26, NodeSelector: "all()", AllowedUses: []string{"Workload"}}
	rt := reflect.TypeOf(base)
	for i := range rt.NumField() {
		other := base
		f := reflect.ValueOf(&other).Elem().Field(i)
		switch f.Kind() {
		case reflect.String:
			f.SetString(f.String() + "x")
		case reflect.Int:
			f.SetInt(f.Int() + 1)
		case reflect.Bool:
			f.SetBool(!f.Bool())
		case reflect.Slice:
			f.Set(reflect.ValueOf([]string{"Tunnel"}))
		default:
			if f.Type() != reflect.TypeOf(netip.Prefix{}) {
				t.Fatalf("field %s of kind %s: extend this test", rt.Field(i).Name, f.Kind())
			}
			f.Set(reflect.ValueOf(mustPrefix("10.1.0.0/16")))
		}
		if poolEqual(base, other) {
			t.Errorf("poolEqual ignores %s", rt.Field(i).Name)
		}
	}
}

func TestFieldLabel(t *testing.T) {
	for in, want := range map[string]string{
		"spec.ipipMode":              "spec.ipipMode",
		"spec.addresses[12].address": "spec.addresses[].address",
		"spec.addresses[3]":          "spec.addresses[]",
	} {
		if got := fieldLabel(in); got != want {
			t.Errorf("fieldLabel(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestListingCarriesNodes: the parts of the first list carry the Nodes and the tunnel configuration,
// which the list reads before the blocks.
func TestListingCarriesNodes(t *testing.T) {
	_, cli := startEtcd(t)
	putBlock(t, cli, calicotest.Block(mustPrefix("10.244.1.0/26"), "node-b", 1))
	put(t, cli, calico.NodeKey("node-b"), nodeValue("node-b", `{"bgp":{"ipv4Address":"192.0.2.12/24"},"ipv4VXLANTunnelAddr":"10.244.1.0"}`))
	put(t, cli, calico.FelixConfigurationKey("default"), felixValue("default", `{"vxlanVNI":77}`))
	h := newHarness(t, cli, nil)
	h.run()
	full := h.next()
	var l *Listed
	select {
	case l = <-h.w.Listing():
	case <-time.After(waitLimit):
		t.Fatal("no listed part")
	}
	if len(l.Blocks) != 1 || !nodeEqual(l.Nodes["node-b"], full.Nodes["node-b"]) || l.Nodes["node-b"].V4.VXLANTunnelAddr != mustAddr("10.244.1.0") ||
		l.Tunnel != full.Tunnel || l.Tunnel.VXLANVNI != 77 {
		t.Errorf("part: blocks %v nodes %v tunnel %+v; snapshot nodes %v tunnel %+v", l.Blocks, l.Nodes, l.Tunnel, full.Nodes, full.Tunnel)
	}
}

// TestCoalesceNodes: coalescing takes the union of the changed nodes and ORs TunnelChanged; folded
// into the first list's snapshot, there are no changed nodes.
func TestCoalesceNodes(t *testing.T) {
	got := coalesce(&Snapshot{ChangedNodes: []string{"a", "c"}, TunnelChanged: true}, &Snapshot{ChangedNodes: []string{"b", "c"}})
	if !slices.Equal(got.ChangedNodes, []string{"a", "b", "c"}) || !got.TunnelChanged {
		t.Errorf("coalesce = %v %v", got.ChangedNodes, got.TunnelChanged)
	}
	got = coalesce(&Snapshot{Full: true, RelistReason: ReasonInitial, TunnelChanged: true}, &Snapshot{ChangedNodes: []string{"b"}})
	if got.ChangedNodes != nil || !got.TunnelChanged {
		t.Errorf("coalesced into the first list's: %v %v", got.ChangedNodes, got.TunnelChanged)
	}
}

func TestConfigValidateNodes(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{NodeName: "node-a.example.com"}, ""},
		{Config{NodeName: "a/b"}, `NodeName "a/b"`},
		{Config{NodePrefix: "/calico/resources/"}, "overlap"},
		{Config{FelixConfigurationPrefix: "felix/"}, "must start and end"},
	} {
		err := tc.cfg.Validate()
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%+v: Validate() = %v, want %q", tc.cfg, err, tc.want)
		}
	}
}
