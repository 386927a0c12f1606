package cni_test

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/vpp-route-agent/vpp-route-agent/cni/shim"
)

// TestCNICodes is block-ipam's CNI contract as a runtime sees it, through libcni: each case is a
// call and the CNI code it ends with, and for ADD the result (each address inside its pool, with
// its prefix length), across CNI versions. The codes are the spec's; the cases without a daemon
// (unreachable: 11, 50 for STATUS; an ipam.socket that cannot be a socket: 7) are the plugin's own.
func TestCNICodes(t *testing.T) {
	e := newEnv(t)
	e.putPool("p", "10.244.0.0/16", 26)
	e.putPool("p6", "fd00:10::/48", 122)
	resolv := filepath.Join(e.tmp, "resolv.conf")
	if err := os.WriteFile(resolv, []byte("nameserver 10.96.0.10\nsearch svc.cluster.local\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	v4, v6 := netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:10::/48")
	type addr struct {
		pool netip.Prefix
		bits int
	}
	down := map[string]any{"socket": "/nonexistent/block-ipam.sock"}
	tooLong := map[string]any{"socket": "/run/" + strings.Repeat("x", shim.MaxSocketPath)}
	list := func(ver string, ipam map[string]any, top map[string]any) *libcni.NetworkConfigList {
		return e.list(netOpts{cniVersion: ver, ipam: e.ipam("node1", ipam), top: top})
	}
	type tc struct {
		name string
		verb string
		list *libcni.NetworkConfigList
		rt   *libcni.RuntimeConf
		code uint
		ips  []addr // ADD's result
	}
	var cases []tc
	for _, ver := range []string{"0.3.1", "0.4.0", "1.0.0", "1.1.0"} {
		cid := "v" + strings.ReplaceAll(ver, ".", "")
		cases = append(cases,
			tc{ver + " ADD", "ADD", list(ver, nil, nil), rt(cid, "eth0"), 0, []addr{{v4, 32}}},
			tc{ver + " ADD again: the same address", "ADD", list(ver, nil, nil), rt(cid, "eth0"), 0, []addr{{v4, 32}}},
			tc{ver + " ADD dual stack", "ADD", list(ver, map[string]any{"assign_ipv6": "true", "resolvConf": resolv}, nil), rt(cid+"d", "eth0"), 0, []addr{{v4, 32}, {v6, 128}}},
			tc{ver + " ADD result_prefix block", "ADD", list(ver, map[string]any{"result_prefix": "block"}, nil), rt(cid+"b", "eth0"), 0, []addr{{v4, 26}}},
			tc{ver + " DEL", "DEL", list(ver, nil, nil), rt(cid, "eth0"), 0, nil},
			tc{ver + " DEL again", "DEL", list(ver, nil, nil), rt(cid, "eth0"), 0, nil},
			tc{ver + " ADD, a bad setting", "ADD", list(ver, map[string]any{"assign_ipv4": "maybe"}, nil), rt(cid, "eth0"), 7, nil},
			tc{ver + " ADD, daemon unreachable", "ADD", list(ver, down, nil), rt(cid, "eth0"), 11, nil},
			tc{ver + " DEL, daemon unreachable", "DEL", list(ver, down, nil), rt(cid, "eth0"), 11, nil},
			tc{ver + " ADD, ipam.socket too long", "ADD", list(ver, tooLong, nil), rt(cid, "eth0"), 7, nil},
		)
	}
	cases = append(cases,
		tc{"CHECK", "CHECK", list("1.1.0", nil, nil), rt("v110b", "eth0"), 0, nil},
		tc{"CHECK of an address not held", "CHECK", list("1.1.0", nil, nil), rt("nobody", "eth0"), 103, nil},
		tc{"GC", "GC", list("1.1.0", nil, nil), nil, 0, nil},
		tc{"STATUS", "STATUS", list("1.1.0", nil, nil), nil, 0, nil},
		tc{"STATUS, daemon unreachable", "STATUS", list("1.1.0", down, nil), nil, 50, nil},
		tc{"STATUS, ipam.socket too long", "STATUS", list("1.1.0", tooLong, nil), nil, 7, nil},
		tc{"ADD, unsupported cniVersion", "ADD", list("0.2.0", nil, nil), rt("c1", "eth0"), 1, nil},
		tc{"ADD, cniVersion not a version", "ADD", list("1.x", nil, nil), rt("c1", "eth0"), 6, nil},
		// Without an ipam section the plugin asks the daemon at the default socket (none here): the
		// daemon refuses the configuration (7; TestDecodeChecksEachRule).
		tc{"ADD, no ipam section", "ADD", list("1.1.0", nil, map[string]any{"ipam": nil}), rt("c1", "eth0"), 11, nil},
		tc{"ADD, nodename of another node", "ADD", list("1.1.0", map[string]any{"nodename": "node9"}, nil), rt("c1", "eth0"), 7, nil},
		tc{"ADD, ipam.socket not absolute", "ADD", list("1.1.0", map[string]any{"socket": "rel.sock"}, nil), rt("c1", "eth0"), 7, nil},
		tc{"ADD, resolvConf missing", "ADD", list("1.1.0", map[string]any{"resolvConf": "/nonexistent/resolv.conf"}, nil), rt("c1", "eth0"), 7, nil},
		tc{"ADD, IP= with a prefix length", "ADD", list("1.1.0", nil, nil), rt("c1", "eth0", [2]string{"IP", "10.244.0.9/24"}), 4, nil},
		tc{"ADD, a requested address", "ADD", list("1.1.0", nil, nil), rt("c2", "eth0", [2]string{"IP", "10.244.3.9"}), 0, []addr{{netip.MustParsePrefix("10.244.3.9/32"), 32}}},
		tc{"ADD, the same address for another container", "ADD", list("1.1.0", nil, nil), rt("c3", "eth0", [2]string{"IP", "10.244.3.9"}), 101, nil},
		tc{"ADD in the plugin's own netns", "ADD", list("1.1.0", nil, nil), &libcni.RuntimeConf{ContainerID: "own", IfName: "eth0", NetNS: "/proc/self/ns/net"}, 8, nil},
		tc{"DEL c2", "DEL", list("1.1.0", nil, nil), rt("c2", "eth0"), 0, nil},
	)
	// CHECK's prevResult is the cached result of the ADD before it.
	held := map[string]*current.Result{}
	for _, c := range cases {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		var err error
		var res *current.Result
		switch c.verb {
		case "ADD":
			var r types.Result
			if r, err = e.cni.AddNetworkList(ctx, c.list, c.rt); err == nil {
				res, err = current.NewResultFromResult(r)
			}
		case "DEL":
			err = e.cni.DelNetworkList(ctx, c.list, c.rt)
		case "CHECK":
			err = e.cni.CheckNetworkList(ctx, c.list, c.rt)
		case "GC":
			err = e.cni.GCNetworkList(ctx, c.list, &libcni.GCArgs{ValidAttachments: []types.GCAttachment{{ContainerID: "v110b", IfName: "eth0"}}})
		case "STATUS":
			err = e.cni.GetStatusNetworkList(ctx, c.list)
		}
		cancel()
		if err != nil && codeOf(err) == 0 {
			t.Errorf("%s: %v is not a CNI error", c.name, err)
			continue
		}
		if codeOf(err) != c.code {
			t.Errorf("%s: code %d (%v), want %d", c.name, codeOf(err), err, c.code)
			continue
		}
		if c.verb != "ADD" || err != nil {
			continue
		}
		got := addrs(res)
		ok := len(got) == len(c.ips)
		for i := 0; ok && i < len(got); i++ {
			ok = c.ips[i].pool.Contains(got[i].Addr()) && got[i].Bits() == c.ips[i].bits
		}
		if prev := held[c.rt.ContainerID]; prev != nil && ok {
			ok = addrs(prev)[0] == got[0]
		}
		if !ok {
			t.Errorf("%s: result %v, want addresses in %v", c.name, got, c.ips)
		}
		held[c.rt.ContainerID] = res
	}
}
