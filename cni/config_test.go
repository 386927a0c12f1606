package cni_test

import (
	"encoding/json"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/vpp-route-agent/vpp-route-agent/cni"
	"github.com/vpp-route-agent/vpp-route-agent/cni/shim"
	"github.com/vpp-route-agent/vpp-route-agent/internal/netaddr"
)

// confJSON builds a network configuration: the ipam section gets etcd and the node unless the test
// overrides them (nil deletes a key).
func confJSON(t *testing.T, ipam map[string]any, top map[string]any) []byte {
	t.Helper()
	im := map[string]any{"type": "block-ipam", "etcd_endpoints": "http://127.0.0.1:1"}
	for k, v := range ipam {
		if v == nil {
			delete(im, k)
		} else {
			im[k] = v
		}
	}
	c := map[string]any{"cniVersion": "1.1.0", "name": "net1", "type": "block-ipam", "ipam": im}
	for k, v := range top {
		if v == nil {
			delete(c, k)
		} else {
			c[k] = v
		}
	}
	data, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// TestConfigErrors: every invalid setting fails with code 7 (4 for CNI_ARGS) naming the field.
func TestConfigErrors(t *testing.T) {
	dir := t.TempDir()
	big := filepath.Join(dir, "big")
	if err := os.WriteFile(big, make([]byte, 100<<10), 0o600); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		ipam    map[string]any
		top     map[string]any
		cniArgs string
		code    uint
		field   string
	}{
		{"no ipam", nil, map[string]any{"ipam": nil}, "", 7, "ipam"},
		{"relative socket", map[string]any{"socket": "run/block-ipam.sock"}, nil, "", 7, "ipam.socket"},
		{"socket path too long", map[string]any{"socket": "/run/" + strings.Repeat("x", 103)}, nil, "", 7, "ipam.socket: \"/run/xxx"},
		{"node with slash", map[string]any{"nodename": "a/b"}, nil, "", 7, "ipam.nodename"},
		{"node with control character", nil, map[string]any{"nodename": "node\u00071"}, "", 7, "nodename"},
		{"node with newline", map[string]any{"nodename": "node1\nnode2"}, nil, "", 7, "ipam.nodename"},
		{"v6 in v4 pools", map[string]any{"ipv4_pools": []string{"10.0.0.0/16", "fd00::/64"}}, nil, "", 7, "ipam.ipv4_pools[1]"},
		{"pool host bits", map[string]any{"ipv6_pools": []string{"fd00::1/64"}}, nil, "", 7, "ipam.ipv6_pools[0]"},
		{"pool bad cidr", map[string]any{"ipv4_pools": []string{"10.0.0.0/33"}}, nil, "", 7, "ipam.ipv4_pools[0]"},
		{"assign not bool", map[string]any{"assign_ipv4": "yes"}, nil, "", 7, "ipam.assign_ipv4"},
		{"assign nothing", map[string]any{"assign_ipv4": "false"}, nil, "", 7, "assign_ipv4"},
		{"exclude bad", map[string]any{"exclude": []string{"10.0.0.0/8", "nope"}}, nil, "", 7, "ipam.exclude[1]"},
		{"route without dst", map[string]any{"routes": []any{map[string]any{"gw": "10.0.0.1"}}}, nil, "", 7, "ipam.routes[0]"},
		{"resolvConf missing", map[string]any{"resolvConf": filepath.Join(dir, "nope")}, nil, "", 7, "ipam.resolvConf"},
		{"resolvConf a directory", map[string]any{"resolvConf": dir}, nil, "", 7, "not a regular file"},
		{"resolvConf a FIFO", map[string]any{"resolvConf": fifo}, nil, "", 7, "not a regular file"},
		{"resolvConf too big", map[string]any{"resolvConf": big}, nil, "", 7, "more than a resolv.conf"},
		{"gateway bad", map[string]any{"gateway": "10.0.0.300"}, nil, "", 7, "ipam.gateway"},
		{"two v4 gateways", map[string]any{"gateways": []string{"10.0.0.1", "10.0.0.2"}}, nil, "", 7, "ipam.gateways[1]"},
		{"result_prefix", map[string]any{"result_prefix": "net"}, nil, "", 7, "ipam.result_prefix"},
		{"max blocks negative", map[string]any{"max_blocks_per_host": -1}, nil, "", 7, "ipam.max_blocks_per_host"},
		{"max blocks string", map[string]any{"max_blocks_per_host": "4"}, nil, "", 7, "ipam.max_blocks_per_host"},
		{"log level", map[string]any{"log_level": "loud"}, nil, "", 7, "ipam.log_level"},
		{"timeout", map[string]any{"timeout": "10"}, nil, "", 7, "ipam.timeout"},
		{"pools not a list", map[string]any{"ipv4_pools": "10.0.0.0/8"}, nil, "", 7, "ipam.ipv4_pools"},
		{"runtimeConfig ip", nil, map[string]any{"runtimeConfig": map[string]any{"ips": []string{"10.0.0.1", "x"}}}, "", 7, "runtimeConfig.ips[1]"},
		{"args ip", nil, map[string]any{"args": map[string]any{"cni": map[string]any{"ips": []string{"1.2.3"}}}}, "", 7, "args.cni.ips[0]"},
		{"duplicate ip", nil, map[string]any{"args": map[string]any{"cni": map[string]any{"ips": []string{"10.0.0.1", "10.0.0.1/24"}}}}, "", 7, "args.cni.ips[1]"},
		{"CNI_ARGS IP", nil, nil, "IgnoreUnknown=1;IP=10.0.0.x", 4, "CNI_ARGS IP"},
		{"CNI_ARGS pair", nil, nil, "K8S_POD_NAME", 4, "CNI_ARGS"},
		{"CNI_ARGS two IP", nil, nil, "IP=10.0.0.1;IgnoreUnknown=1;IP=10.0.0.2", 4, "IP given twice"},
		{"CNI_ARGS IP with prefix", nil, nil, "IP=10.0.0.1/24", 4, "prefix length"},
		{"bad network name", nil, map[string]any{"name": "a b"}, "", 7, "name"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := cni.LoadConfig("ADD", confJSON(t, tc.ipam, tc.top), tc.cniArgs)
			var te *types.Error
			if !errors.As(err, &te) {
				t.Fatalf("err = %v, want *types.Error", err)
			}
			if te.Code != tc.code || !strings.Contains(te.Msg, tc.field) {
				t.Fatalf("err = %d %q, want code %d naming %q", te.Code, te.Msg, tc.code, tc.field)
			}
		})
	}
}

func TestConfigDefaultsAndFallbacks(t *testing.T) {
	dir := t.TempDir()
	resolv := filepath.Join(dir, "resolv.conf")
	if err := os.WriteFile(resolv, []byte("# comment\nnameserver 10.96.0.10\nsearch a.svc b.svc\ndomain cluster.local\noptions ndots:5\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	// Defaults: the default socket, no node name (the daemon's), etcd settings ignored.
	c, err := cni.LoadConfig("ADD", confJSON(t, nil, nil), "")
	if err != nil {
		t.Fatal(err)
	}
	if !c.Assign[netaddr.V4] || c.Assign[netaddr.V6] || c.Timeout != shim.DefaultTimeout || c.Request.Timeout != shim.DefaultTimeout ||
		c.ResultBlock || c.MaxBlocks != 0 || c.Socket != cni.DefaultSocket || c.Node != "" || c.LogLevel != "info" ||
		c.HaveAttachments || c.Pools[0] != nil {
		t.Errorf("defaults: %+v", c)
	}
	// Calico's nodename: in ipam, else at the top level.
	c, _ = cni.LoadConfig("ADD", confJSON(t, map[string]any{"socket": "/run/x.sock"}, map[string]any{"nodename": "top-node"}), "")
	if c.Node != "top-node" || c.Socket != "/run/x.sock" {
		t.Errorf("top-level nodename %q, socket %q", c.Node, c.Socket)
	}
	c, _ = cni.LoadConfig("ADD", confJSON(t, map[string]any{"nodename": "ipam-node"}, map[string]any{"nodename": "top-node"}), "")
	if c.Node != "ipam-node" {
		t.Errorf("ipam nodename %q", c.Node)
	}

	// Calico's string booleans and JSON booleans; pools; exclude; result; requested addresses.
	c, err = cni.LoadConfig("ADD", confJSON(t, map[string]any{
		"assign_ipv4": false, "assign_ipv6": "true",
		"ipv6_pools": []string{"fd00:10::/64", "my-pool"}, "exclude": []string{"fd00:10::/126", "fd00:10::9"},
		"resolvConf": resolv, "gateways": []string{"fd00:10::1"}, "gateway": "10.0.0.1", "result_prefix": "block",
		"max_blocks_per_host": 3, "timeout": "3s",
	}, map[string]any{
		"runtimeConfig":             map[string]any{"ips": []string{"fd00:10::5/64"}},
		"args":                      map[string]any{"cni": map[string]any{"ips": []string{"10.0.0.9"}}},
		"cni.dev/valid-attachments": []any{},
	}), "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns1;K8S_POD_NAME=pod1;K8S_POD_INFRA_CONTAINER_ID=abc;IP=10.0.0.7")
	if err != nil {
		t.Fatal(err)
	}
	if c.Assign != [2]bool{false, true} || len(c.Pools[netaddr.V6]) != 2 || c.Pools[netaddr.V6][1].Name != "my-pool" ||
		c.Pools[netaddr.V6][0].CIDR != netip.MustParsePrefix("fd00:10::/64") {
		t.Errorf("assign %v pools %+v", c.Assign, c.Pools)
	}
	if !slices.Equal(c.Exclude, []netip.Prefix{netip.MustParsePrefix("fd00:10::/126"), netip.MustParsePrefix("fd00:10::9/128")}) {
		t.Errorf("exclude %v", c.Exclude)
	}
	if !slices.Equal(c.DNS.Nameservers, []string{"10.96.0.10"}) || c.DNS.Domain != "cluster.local" ||
		!slices.Equal(c.DNS.Search, []string{"a.svc", "b.svc"}) || !slices.Equal(c.DNS.Options, []string{"ndots:5"}) {
		t.Errorf("dns %+v", c.DNS)
	}
	if c.Gateways[netaddr.V4] != netip.MustParseAddr("10.0.0.1") || c.Gateways[netaddr.V6] != netip.MustParseAddr("fd00:10::1") {
		t.Errorf("gateways %v", c.Gateways)
	}
	if !c.ResultBlock || c.MaxBlocks != 3 || c.Timeout != 3*time.Second {
		t.Errorf("result_prefix/max/timeout/lock: %+v", c)
	}
	// runtimeConfig.ips wins over args.cni.ips, which wins over CNI_ARGS IP.
	if !slices.Equal(c.RequestedIPs, []netip.Addr{netip.MustParseAddr("fd00:10::5")}) {
		t.Errorf("requested %v", c.RequestedIPs)
	}
	if c.Namespace != "ns1" || c.Pod != "pod1" {
		t.Errorf("pod %s/%s", c.Namespace, c.Pod)
	}
	if !c.HaveAttachments || len(c.ValidAttachments) != 0 {
		t.Errorf("an empty valid-attachments list must be present and empty: %v %v", c.HaveAttachments, c.ValidAttachments)
	}
	c, _ = cni.LoadConfig("ADD", confJSON(t, nil, nil), "IP=10.0.0.7,10.0.0.8")
	if len(c.RequestedIPs) != 2 {
		t.Errorf("CNI_ARGS IP list: %v", c.RequestedIPs)
	}
	// libcni's legacy key is honoured too.
	c, _ = cni.LoadConfig("ADD", confJSON(t, nil, map[string]any{"cni.dev/attachments": []any{map[string]string{"containerID": "a", "ifname": "eth0"}}}), "")
	if !c.HaveAttachments || len(c.ValidAttachments) != 1 {
		t.Errorf("legacy attachments: %v", c.ValidAttachments)
	}
}
