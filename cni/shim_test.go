package cni_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/utils"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/vpp-route-agent/vpp-route-agent/cni"
	"github.com/vpp-route-agent/vpp-route-agent/cni/shim"
)

var (
	skelOnce sync.Once
	skelBin  string
	skelErr  error
)

// skelPlugin builds testdata/skelplugin, block-ipam's plugin as it was before the thin shim (skel, the
// configuration and the result's rendering in the plugin; only the allocation asked of the daemon):
// the reference the shim's output is compared with.
func skelPlugin(t *testing.T) string {
	t.Helper()
	skelOnce.Do(func() {
		cmd := exec.Command("go", append(append([]string{"build"}, buildFlags...), "-o", pluginDir+"/", "./testdata/skelplugin")...)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			skelErr = fmt.Errorf("build skelplugin: %v\n%s", err, out)
			return
		}
		skelBin = filepath.Join(pluginDir, "skelplugin")
	})
	if skelErr != nil {
		t.Fatal(skelErr)
	}
	return skelBin
}

// outcome is what a runtime sees of one plugin call.
type outcome struct {
	stdout, stderr string
	exit           int
}

func runBinary(t *testing.T, bin string, envv []string, stdin []byte) outcome {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin)
	cmd.Env, cmd.Stdin = envv, bytes.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	o := outcome{stdout: out.String(), stderr: errb.String()}
	if ee, ok := err.(*exec.ExitError); ok {
		o.exit = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("exec %s: %v", bin, err)
	}
	return o
}

// TestShimVersionWithoutDaemon: VERSION and the about text need no daemon, and read as skel's.
func TestShimVersionWithoutDaemon(t *testing.T) {
	var want bytes.Buffer
	if err := version.PluginSupports(shim.Versions...).Encode(&want); err != nil {
		t.Fatal(err)
	}
	env := []string{"CNI_COMMAND=VERSION"}
	got := runBinary(t, filepath.Join(pluginDir, "block-ipam"), env, []byte("not even json"))
	if got.exit != 0 || got.stdout != want.String() {
		t.Fatalf("VERSION: exit %d, %q; want 0, %q", got.exit, got.stdout, want.String())
	}
	// No CNI_COMMAND: the about text on stderr, exit 0, as skel prints it.
	got = runBinary(t, filepath.Join(pluginDir, "block-ipam"), nil, nil)
	ref := runBinary(t, skelPlugin(t), nil, nil)
	if got != ref || got.exit != 0 || !strings.Contains(got.stderr, "CNI protocol versions supported: 0.3.1, 0.4.0, 1.0.0, 1.1.0") {
		t.Fatalf("about: got %+v, skel's plugin %+v", got, ref)
	}
}

// TestShimMatchesSkel runs the shim and the skel-based plugin it replaces against one daemon, across
// CNI versions, into success and every error, and compares what a runtime sees: stdout and the exit
// code, byte for byte. ADD and DEL are idempotent, so both plugins giving the same container the same
// address is part of what is compared.
func TestShimMatchesSkel(t *testing.T) {
	e := newEnv(t)
	e.putPool("p", "10.244.0.0/16", 26)
	e.putPool("p6", "fd00:10::/48", 122)
	skelBin := skelPlugin(t)
	shimBin := filepath.Join(pluginDir, "block-ipam")

	resolv := filepath.Join(e.tmp, "resolv.conf")
	if err := os.WriteFile(resolv, []byte("nameserver 10.96.0.10\nsearch svc.cluster.local cluster.local\noptions ndots:5\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(e.tmp, "fifo")
	if err := exec.Command("mkfifo", fifo).Run(); err != nil {
		t.Fatal(err)
	}
	conf := func(ver string, ipam map[string]any, top map[string]any) []byte {
		return pluginConf(t, e.list(netOpts{cniVersion: ver, ipam: e.ipam("node1", ipam), top: top}))
	}
	rich := map[string]any{"assign_ipv6": "true", "ipv6_pools": []string{"fd00:10::/48"}, "gateway": "10.244.0.1",
		"routes": []map[string]string{{"dst": "0.0.0.0/0"}, {"dst": "192.0.2.0/24", "gw": "10.244.0.1"}}, "resolvConf": resolv}
	prev := map[string]any{"prevResult": map[string]any{"cniVersion": "1.0.0", "ips": []map[string]string{{"address": "10.244.0.200/32"}}}}
	ownNetns := "/proc/self/ns/net"
	down := map[string]any{"socket": "/nonexistent/x.sock"}

	type tc struct {
		name  string
		env   []string
		stdin []byte
	}
	var cases []tc
	for _, ver := range []string{"0.3.1", "0.4.0", "1.0.0", "1.1.0"} {
		cid := "v" + strings.ReplaceAll(ver, ".", "")
		cases = append(cases,
			tc{ver + " ADD", cniEnv("ADD", cid, "eth0", "/var/run/netns/x", "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web;IgnoreUnknown=1"), conf(ver, nil, nil)},
			tc{ver + " ADD dual stack, routes, gateway, resolvConf", cniEnv("ADD", cid+"r", "eth0", "/var/run/netns/x", ""), conf(ver, rich, nil)},
			tc{ver + " ADD result_prefix block", cniEnv("ADD", cid+"b", "eth0", "/var/run/netns/x", ""), conf(ver, map[string]any{"result_prefix": "block"}, nil)},
			tc{ver + " CHECK", cniEnv("CHECK", cid, "eth0", "/var/run/netns/x", ""), conf(ver, nil, prev)},
			tc{ver + " GC", cniEnv("GC", "", "", "", ""), conf(ver, nil, map[string]any{"cni.dev/valid-attachments": []any{}})},
			tc{ver + " STATUS", cniEnv("STATUS", "", "", "", ""), conf(ver, nil, nil)},
			tc{ver + " DEL", cniEnv("DEL", cid, "eth0", "", ""), conf(ver, nil, nil)},
			tc{ver + " bad assign_ipv4", cniEnv("ADD", cid, "eth0", "/x", ""), conf(ver, map[string]any{"assign_ipv4": "maybe"}, nil)},
			tc{ver + " nodename of another node", cniEnv("ADD", cid, "eth0", "/x", ""), conf(ver, map[string]any{"nodename": "node9"}, nil)},
		)
	}
	cases = append(cases,
		tc{"not JSON", cniEnv("ADD", "c1", "eth0", "/x", ""), []byte("{not json")},
		tc{"JSON but not an object", cniEnv("ADD", "c1", "eth0", "/x", ""), []byte(`["a"]`)},
		tc{"name of the wrong type", cniEnv("ADD", "c1", "eth0", "/x", ""), []byte(`{"name":5,"cniVersion":"1.0.0"}`)},
		tc{"no name", cniEnv("ADD", "c1", "eth0", "/x", ""), []byte(`{"cniVersion":"1.0.0","ipam":{}}`)},
		tc{"bad name", cniEnv("ADD", "c1", "eth0", "/x", ""), []byte(`{"name":"a b","cniVersion":"1.0.0"}`)},
		tc{"no ipam", cniEnv("ADD", "c1", "eth0", "/x", ""), []byte(`{"name":"n","cniVersion":"1.0.0"}`)},
		tc{"unsupported cniVersion", cniEnv("ADD", "c1", "eth0", "/x", ""), conf("0.2.0", nil, nil)},
		tc{"bogus cniVersion", cniEnv("ADD", "c1", "eth0", "/x", ""), conf("1.x", nil, nil)},
		tc{"newer cniVersion", cniEnv("ADD", "c1", "eth0", "/x", ""), conf("1.2.0", nil, nil)},
		tc{"no CNI_CONTAINERID", cniEnv("ADD", "", "eth0", "/x", ""), conf("1.1.0", nil, nil)},
		tc{"no CNI_CONTAINERID nor CNI_NETNS", cniEnv("ADD", "", "eth0", "", ""), conf("1.1.0", nil, nil)},
		tc{"bad CNI_CONTAINERID", cniEnv("ADD", "-c1", "eth0", "/x", ""), conf("1.1.0", nil, nil)},
		tc{"long CNI_IFNAME", cniEnv("ADD", "c1", "eth0123456789abc", "/x", ""), conf("1.1.0", nil, nil)},
		tc{"CNI_IFNAME with a space", cniEnv("ADD", "c1", "eth 0", "/x", ""), conf("1.1.0", nil, nil)},
		tc{"unknown CNI_COMMAND", cniEnv("FROB", "c1", "eth0", "/x", ""), conf("1.1.0", nil, nil)},
		tc{"malformed CNI_ARGS", cniEnv("ADD", "c1", "eth0", "/x", "K8S_POD_NAME"), conf("1.1.0", nil, nil)},
		tc{"IP= with a prefix length", cniEnv("ADD", "c1", "eth0", "/x", "IP=10.244.0.9/24"), conf("1.1.0", nil, nil)},
		tc{"resolvConf missing", cniEnv("ADD", "c1", "eth0", "/x", ""), conf("1.1.0", map[string]any{"resolvConf": "/nonexistent/resolv.conf"}, nil)},
		tc{"resolvConf a directory", cniEnv("ADD", "c1", "eth0", "/x", ""), conf("1.1.0", map[string]any{"resolvConf": e.tmp}, nil)},
		tc{"resolvConf a FIFO", cniEnv("ADD", "c1", "eth0", "/x", ""), conf("1.1.0", map[string]any{"resolvConf": fifo}, nil)},
		tc{"socket not absolute", cniEnv("ADD", "c1", "eth0", "/x", ""), conf("1.1.0", map[string]any{"socket": "rel.sock"}, nil)},
		tc{"ADD in the plugin's own netns", cniEnv("ADD", "own", "eth0", ownNetns, ""), conf("1.1.0", nil, nil)},
		tc{"DEL in the plugin's own netns", cniEnv("DEL", "own", "eth0", ownNetns, ""), conf("1.1.0", nil, nil)},
		tc{"ADD in the plugin's own netns, overridden", append(cniEnv("ADD", "own2", "eth0", ownNetns, ""), "CNI_NETNS_OVERRIDE=1"), conf("1.1.0", nil, nil)},
		tc{"daemon unreachable: ADD", cniEnv("ADD", "c1", "eth0", "/x", ""), conf("1.1.0", map[string]any{"socket": "/nonexistent/x.sock"}, nil)},
		tc{"daemon unreachable: DEL", cniEnv("DEL", "c1", "eth0", "/x", ""), conf("1.1.0", map[string]any{"socket": "/nonexistent/x.sock"}, nil)},
		tc{"daemon unreachable: STATUS", cniEnv("STATUS", "", "", "", ""), conf("1.1.0", map[string]any{"socket": "/nonexistent/x.sock"}, nil)},
		// What skel answers before the plugin's verb: the plugin answers it without the daemon.
		tc{"daemon unreachable: unknown CNI_COMMAND", cniEnv("FROB", "c1", "eth0", "/x", ""), conf("1.1.0", down, nil)},
		tc{"daemon unreachable: CHECK at 0.3.1", cniEnv("CHECK", "c1", "eth0", "/x", ""), conf("0.3.1", down, prev)},
		tc{"daemon unreachable: GC at 1.0.0", cniEnv("GC", "", "", "", ""), conf("1.0.0", down, nil)},
		tc{"daemon unreachable: STATUS at 0.4.0", cniEnv("STATUS", "", "", "", ""), conf("0.4.0", down, nil)},
		tc{"daemon unreachable: unsupported cniVersion", cniEnv("ADD", "c1", "eth0", "/x", ""), conf("0.2.0", down, nil)},
		tc{"daemon unreachable: newer cniVersion", cniEnv("DEL", "c1", "eth0", "/x", ""), conf("1.2.0", down, nil)},
		tc{"daemon unreachable: bogus cniVersion, CHECK", cniEnv("CHECK", "c1", "eth0", "/x", ""), conf("1.x", down, nil)},
		tc{"daemon unreachable: cniVersion not a string", cniEnv("ADD", "c1", "eth0", "/x", ""), []byte(`{"name":"n","cniVersion":5,"ipam":{"socket":"/nonexistent/x.sock"}}`)},
		// skel checks the version before the plugin reads its section.
		tc{"unsupported cniVersion and no ipam", cniEnv("ADD", "c1", "eth0", "/x", ""), []byte(`{"name":"n","cniVersion":"0.2.0"}`)},
		tc{"unsupported cniVersion and a bad socket", cniEnv("ADD", "c1", "eth0", "/x", ""), conf("0.2.0", map[string]any{"socket": "rel.sock"}, nil)},
		tc{"unknown CNI_COMMAND and no ipam", cniEnv("FROB", "c1", "eth0", "/x", ""), []byte(`{"name":"n","cniVersion":"1.1.0"}`)},
		tc{"GC at 1.0.0 and a bad socket", cniEnv("GC", "", "", "", ""), conf("1.0.0", map[string]any{"socket": "rel.sock"}, nil)},
	)
	for _, c := range cases {
		// The reference first: the shim repeats its ADD and DEL, which are idempotent.
		ref := runBinary(t, skelBin, c.env, c.stdin)
		got := runBinary(t, shimBin, c.env, c.stdin)
		if got.stdout != ref.stdout || got.exit != ref.exit {
			t.Errorf("%s: the shim printed (exit %d)\n%s\nthe skel-based plugin (exit %d)\n%s", c.name, got.exit, got.stdout, ref.exit, ref.stdout)
			continue
		}
		t.Logf("%s: exit %d, %.100q", c.name, got.exit, got.stdout)
	}
}

// TestServeFrameChecksFirst: the daemon refuses a call whose environment or configuration is wrong
// before it serves the request (no etcd work), naming what is wrong.
func TestServeFrameChecksFirst(t *testing.T) {
	frame := func(env map[string]string, stdin string) []byte {
		var f []byte
		for k, v := range env {
			f = shim.AppendRecord(f, k, []byte(v))
		}
		return shim.Seal(shim.AppendRecord(f, shim.KeyStdin, []byte(stdin)))
	}
	add := map[string]string{"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1", "CNI_IFNAME": "eth0", "CNI_NETNS": "/x", "CNI_PATH": "/opt/cni/bin"}
	good := `{"cniVersion":"1.1.0","name":"n","ipam":{"type":"block-ipam"}}`
	for _, c := range []struct {
		name   string
		frame  []byte
		served bool
		want   string
	}{
		{"good", frame(add, good), true, ""},
		{"not a frame", []byte(shim.Magic + "\xff"), false, `"code": 6`},
		{"no CNI_PATH", frame(map[string]string{"CNI_COMMAND": "GC"}, good), false, "CNI_PATH"},
		{"not JSON", frame(add, "{"), false, "error unmarshall network config"},
		{"bad field", frame(add, `{"cniVersion":"1.1.0","name":"n","ipam":{"exclude":["x"]}}`), false, "ipam.exclude[0]"},
		{"CHECK at 0.3.1", frame(map[string]string{"CNI_COMMAND": "CHECK", "CNI_CONTAINERID": "c1", "CNI_IFNAME": "eth0", "CNI_NETNS": "/x", "CNI_PATH": "/p"},
			`{"cniVersion":"0.3.1","name":"n","ipam":{}}`), false, "config version does not allow CHECK"},
		{"own netns", frame(map[string]string{"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1", "CNI_IFNAME": "eth0", "CNI_NETNS": "/x", "CNI_PATH": "/p", shim.KeyNetNS: shim.NetNSOwn}, good),
			false, "own network namespace"},
		// The rules the daemon checks once, here, and not again before it queues the request.
		{"bad container ID", frame(map[string]string{"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "../x", "CNI_IFNAME": "eth0", "CNI_NETNS": "/x", "CNI_PATH": "/p"}, good),
			false, `"code": 4`},
		{"long interface name", frame(map[string]string{"CNI_COMMAND": "DEL", "CNI_CONTAINERID": "c1", "CNI_IFNAME": "a-very-long-interface-name", "CNI_PATH": "/p"}, good),
			false, `"code": 4`},
		{"unknown command", frame(map[string]string{"CNI_COMMAND": "PUT", "CNI_CONTAINERID": "c1", "CNI_IFNAME": "eth0", "CNI_PATH": "/p"}, good),
			false, `"code": 4`},
		{"bad network name", frame(add, `{"cniVersion":"1.1.0","name":"a b","ipam":{}}`), false, `"code": 7`},
		{"nothing to assign", frame(add, `{"cniVersion":"1.1.0","name":"n","ipam":{"assign_ipv4":"false"}}`), false, "nothing to assign"},
	} {
		served := false
		out := cni.ServeFrame(c.frame, func(*cni.Request) *cni.Reply {
			served = true
			return &cni.Reply{Node: "n", Allocations: []cni.Allocation{}}
		})
		rec, err := shim.ParseFrame(out)
		if err != nil {
			t.Fatalf("%s: reply: %v", c.name, err)
		}
		if served != c.served || !strings.Contains(string(rec[shim.KeyStdout]), c.want) || (string(rec[shim.KeyExit]) == "0") != c.served {
			t.Errorf("%s: served %v, exit %s, printed %s; want served %v, %q", c.name, served, rec[shim.KeyExit], rec[shim.KeyStdout], c.served, c.want)
		}
	}
	// DEL is served (the release never needs the netns), then fails as skel fails it after DEL: the
	// plugin's own netns, or one the plugin could not read.
	for _, ns := range []string{shim.NetNSOwn, "get plugin's netns failed: permission denied"} {
		served := false
		del := map[string]string{"CNI_COMMAND": "DEL", "CNI_CONTAINERID": "c1", "CNI_IFNAME": "eth0", "CNI_NETNS": "/x", "CNI_PATH": "/p", shim.KeyNetNS: ns}
		out := cni.ServeFrame(frame(del, good), func(*cni.Request) *cni.Reply {
			served = true
			return &cni.Reply{Node: "n"}
		})
		rec, err := shim.ParseFrame(out)
		if err != nil {
			t.Fatalf("DEL, netns %q: reply: %v", ns, err)
		}
		if !served || string(rec[shim.KeyExit]) == "0" || !strings.Contains(string(rec[shim.KeyStdout]), `"code": 8`) {
			t.Errorf("DEL, netns %q: served %v, exit %s, printed %s; want served, code 8", ns, served, rec[shim.KeyExit], rec[shim.KeyStdout])
		}
	}
}

// TestValidNameMatchesCNI: the shim's check of container IDs (no regexp: it costs the plugin's start)
// accepts exactly what the CNI library's does.
func TestValidNameMatchesCNI(t *testing.T) {
	alphabet := []byte("aZ09_.-/ :\x00\xff\n")
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 20000 {
		b := make([]byte, i%6)
		for j := range b {
			b[j] = alphabet[r.IntN(len(alphabet))]
		}
		s := string(b)
		want := utils.ValidateNetworkName(s) == nil
		if got := shim.ValidName(s); got != want {
			t.Fatalf("ValidName(%q) = %v, the CNI library says %v", s, got, want)
		}
	}
}

// TestShimRefusesOversizedConfig: a configuration that makes a request over the daemon's limit,
// with the environment and the resolvConf file, or that is itself over it, is error 7 naming the limit,
// answered by the plugin before it dials: never "daemon unreachable" (11), which the runtime retries for
// ever.
func TestShimRefusesOversizedConfig(t *testing.T) {
	e := newEnv(t)
	e.putPool("p", "10.244.0.0/16", 26)
	resolv := filepath.Join(e.tmp, "resolv.conf")
	if err := os.WriteFile(resolv, bytes.Repeat([]byte("search a.example\n"), 3000), 0o644); err != nil {
		t.Fatal(err)
	}
	base := pluginConf(t, e.list(netOpts{cniVersion: "1.1.0", ipam: e.ipam("node1", map[string]any{"resolvConf": resolv})}))
	// Over with the resolvConf file (51 KB), with the environment, and on its own.
	for _, size := range []int{shim.MaxFrame - 20000, shim.MaxFrame - 200, shim.MaxFrame + 10} {
		stdin := append(bytes.Clone(bytes.TrimSuffix(bytes.TrimSpace(base), []byte("}"))), `,"pad":"`...)
		stdin = append(append(stdin, bytes.Repeat([]byte("x"), size-len(stdin)-2)...), `"}`...)
		got := runBinary(t, filepath.Join(pluginDir, "block-ipam"), cniEnv("ADD", "c1", "eth0", "/x", ""), stdin)
		if got.exit != 1 || !strings.Contains(got.stdout, `"code": 7`) || !strings.Contains(got.stdout, fmt.Sprintf("limit of %d bytes", shim.MaxFrame)) {
			t.Errorf("stdin of %d bytes: exit %d, %s", len(stdin), got.exit, got.stdout)
		}
	}
}

// skelCheckVersion is skel's check of the command and the configuration's version
// (containernetworking/cni v1.3.0 skel.pluginMain and checkVersionAndCall), with the CNI library:
// the reference shim.CheckVersion is compared with.
func skelCheckVersion(cmd string, stdin []byte) *types.Error {
	info := version.PluginSupports(shim.Versions...)
	var minimum string
	switch cmd {
	case "ADD", "DEL":
	case "CHECK":
		minimum = "0.4.0"
	case "GC", "STATUS":
		minimum = "1.1.0"
	default:
		return types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("unknown CNI_COMMAND: %v", cmd), "")
	}
	configVersion, err := (&version.ConfigDecoder{}).Decode(stdin)
	if err != nil {
		return types.NewError(types.ErrDecodingFailure, err.Error(), "")
	}
	if minimum != "" {
		if ok, err := version.GreaterThanOrEqualTo(configVersion, minimum); err != nil {
			return types.NewError(types.ErrDecodingFailure, err.Error(), "")
		} else if !ok {
			return types.NewError(types.ErrIncompatibleCNIVersion, "config version does not allow "+cmd, "")
		}
		supported := false
		for _, v := range info.SupportedVersions() {
			ok, err := version.GreaterThanOrEqualTo(v, configVersion)
			if err != nil {
				return types.NewError(types.ErrDecodingFailure, err.Error(), "")
			}
			if supported = ok; ok {
				break
			}
		}
		if !supported {
			return types.NewError(types.ErrIncompatibleCNIVersion, "plugin version does not allow "+cmd, "")
		}
	}
	if verErr := (&version.Reconciler{}).Check(configVersion, info); verErr != nil {
		return types.NewError(types.ErrIncompatibleCNIVersion, "incompatible CNI versions", verErr.Details())
	}
	return nil
}

// TestCheckVersionMatchesCNI: the plugin's check of the command and the cniVersion (no CNI library:
// it costs the plugin's start) gives skel's codes and words, for listed and random versions.
func TestCheckVersionMatchesCNI(t *testing.T) {
	versions := []any{nil, 5, true, "", "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0", "1.2.0", "2.0.0", "1.x", "x",
		"1.0.0.0", "01.1.0", "1.1", "1", "-1.0.0", " 1.0.0", "1..0", "1.1.0-rc1", "99999999999999999999.0.0", "+1.1.0", "1.1.0\n", "é"}
	alphabet := []byte("0149.-+ xé")
	r := rand.New(rand.NewPCG(3, 4))
	for i := range 3000 {
		b := make([]byte, i%7)
		for j := range b {
			b[j] = alphabet[r.IntN(len(alphabet))]
		}
		versions = append(versions, string(b))
	}
	for _, v := range versions {
		conf := map[string]any{"name": "n"}
		if v != nil {
			conf["cniVersion"] = v
		}
		stdin, err := json.Marshal(conf)
		if err != nil {
			t.Fatal(err)
		}
		for _, cmd := range []string{"ADD", "DEL", "CHECK", "GC", "STATUS", "FROB"} {
			got, want := shim.CheckVersion(cmd, stdin), skelCheckVersion(cmd, stdin)
			if (got == nil) != (want == nil) || got != nil && (got.Code != want.Code || got.Msg != want.Msg || got.Details != want.Details) {
				t.Fatalf("%s %s: the plugin says %+v, skel %+v", cmd, stdin, got, want)
			}
		}
	}
}

// fakeDaemon serves sock with answer, one goroutine per connection, after reading the request,
// until the test ends.
func fakeDaemon(t *testing.T, answer func(net.Conn)) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "bi")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "d.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { l.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				c.SetDeadline(time.Now().Add(30 * time.Second))
				// The request to its end (its length): the plugin keeps its side open.
				var req []byte
				buf := make([]byte, 4096)
				for {
					if n, ok := shim.FrameSize(req); ok && len(req) >= n {
						break
					}
					n, err := c.Read(buf)
					if err != nil {
						return
					}
					req = append(req, buf[:n]...)
				}
				answer(c)
			}()
		}
	}()
	return sock
}

// TestShimIncompleteReply: a reply cut short (the daemon died while answering) is 11, try again
// later, not 999: the operation's outcome is unknown and the runtime's retry is idempotent. So is a
// reply without this release's magic (a daemon of another release), which says so.
func TestShimIncompleteReply(t *testing.T) {
	records := shim.AppendRecord(nil, shim.KeyExit, []byte("0"))
	afterExit := len(records)
	records = shim.AppendRecord(records, shim.KeyStdout, bytes.Repeat([]byte("r"), 300))
	whole := shim.Seal(records)
	afterExit += len(whole) - len(records)
	replies := map[string][]byte{"another release's": []byte(`{"code":6,"msg":"decoding the request","node":"n"}`)}
	for _, cut := range []int{len(shim.Magic) + 3, afterExit, afterExit + 10, len(whole) - 1} {
		replies[fmt.Sprintf("cut at %d of %d bytes", cut, len(whole))] = whole[:cut]
	}
	for name, reply := range replies {
		sock := fakeDaemon(t, func(c net.Conn) { c.Write(reply) })
		stdin := []byte(`{"cniVersion":"1.1.0","name":"n","ipam":{"type":"block-ipam","socket":"` + sock + `"}}`)
		got := runBinary(t, filepath.Join(pluginDir, "block-ipam"), cniEnv("ADD", "c1", "eth0", "/x", ""), stdin)
		if got.exit != 1 || !strings.Contains(got.stdout, `"code": 11`) || !strings.Contains(got.stdout, "incomplete reply") ||
			!strings.Contains(got.stdout, "another release") {
			t.Errorf("reply %s: exit %d, %s", name, got.exit, got.stdout)
		}
		if bytes.HasPrefix(reply, []byte("{")) && !strings.Contains(got.stdout, "not a block-ipam/3 frame") {
			t.Errorf("reply %s: %s does not say the reply is not a frame", name, got.stdout)
		}
	}
}

// TestShimTimeoutBoundsTheExchange: the configured timeout bounds the whole wait for the reply, not
// each read: a daemon that trickles its reply a byte at a time is given up on after it (11).
func TestShimTimeoutBoundsTheExchange(t *testing.T) {
	reply := shim.AppendRecord(nil, shim.KeyExit, []byte("0"))
	reply = shim.Seal(shim.AppendRecord(reply, shim.KeyStdout, bytes.Repeat([]byte("r"), 400)))
	sock := fakeDaemon(t, func(c net.Conn) {
		for i := range reply { // 400 bytes at 50 ms: 20 s
			if _, err := c.Write(reply[i : i+1]); err != nil {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
	stdin := []byte(`{"cniVersion":"1.1.0","name":"n","ipam":{"type":"block-ipam","timeout":"1s","socket":"` + sock + `"}}`)
	start := time.Now()
	got := runBinary(t, filepath.Join(pluginDir, "block-ipam"), cniEnv("ADD", "c1", "eth0", "/x", ""), stdin)
	took := time.Since(start)
	if got.exit != 1 || !strings.Contains(got.stdout, `"code": 11`) || !strings.Contains(got.stdout, "no answer within 1s") {
		t.Errorf("exit %d, %s", got.exit, got.stdout)
	}
	// A bound, not a speed target: without it the plugin waits the whole 20 s of the trickle.
	if took > 10*time.Second {
		t.Errorf("the plugin waited %v with a timeout of 1s", took)
	}
}

// TestShimLogsWhereItsConfigurationSays: the plugin appends the daemon's log line to the log_file it
// read itself; it opens no path named by the daemon (the plugin runs as root).
func TestShimLogsWhereItsConfigurationSays(t *testing.T) {
	dir := t.TempDir()
	mine, named := filepath.Join(dir, "plugin.log"), filepath.Join(dir, "daemon-named.log")
	reply := shim.AppendRecord(nil, shim.KeyExit, []byte("0"))
	reply = shim.AppendRecord(reply, shim.KeyStdout, nil)
	reply = shim.AppendRecord(reply, shim.KeyLog, []byte("level=INFO msg=DEL\n"))
	reply = shim.Seal(shim.AppendRecord(reply, "log_file", []byte(named)))
	sock := fakeDaemon(t, func(c net.Conn) { c.Write(reply) })
	stdin := []byte(`{"cniVersion":"1.1.0","name":"n","ipam":{"type":"block-ipam","log_file":"` + mine + `","socket":"` + sock + `"}}`)
	got := runBinary(t, filepath.Join(pluginDir, "block-ipam"), cniEnv("DEL", "c1", "eth0", "", ""), stdin)
	if got.exit != 0 {
		t.Fatalf("exit %d, %s", got.exit, got.stdout)
	}
	if data, err := os.ReadFile(mine); err != nil || string(data) != "level=INFO msg=DEL\n" {
		t.Errorf("log_file %s: %q, %v", mine, data, err)
	}
	if _, err := os.Stat(named); !os.IsNotExist(err) {
		t.Errorf("the plugin opened the path the daemon named: %v", err)
	}
}

// TestShimRefusesSocketPathTooLong: an ipam.socket longer than a unix socket path may be is a
// configuration error (7) naming the field, for every verb that dials, before any connection: not 11,
// "try again", which the runtime retries for ever.
func TestShimRefusesSocketPathTooLong(t *testing.T) {
	long := "/run/" + strings.Repeat("x", shim.MaxSocketPath-len("/run/")+1)
	conf := fmt.Sprintf(`{"cniVersion":"1.1.0","name":"net1","type":"block-ipam","ipam":{"type":"block-ipam","socket":%q}}`, long)
	for _, cmd := range []string{"ADD", "DEL", "CHECK", "STATUS", "GC"} {
		got := runBinary(t, filepath.Join(pluginDir, "block-ipam"), cniEnv(cmd, "c1", "eth0", "/x", ""), []byte(conf))
		if got.exit != 1 || !strings.Contains(got.stdout, `"code": 7`) || !strings.Contains(got.stdout, "ipam.socket") ||
			!strings.Contains(got.stdout, fmt.Sprintf("(%d)", shim.MaxSocketPath)) {
			t.Errorf("%s with a socket path of %d bytes: exit %d, %s", cmd, len(long), got.exit, got.stdout)
		}
	}
	// At the limit, the path is one the plugin dials (nobody listens there: 11).
	conf = fmt.Sprintf(`{"cniVersion":"1.1.0","name":"net1","type":"block-ipam","ipam":{"type":"block-ipam","socket":%q}}`, long[:shim.MaxSocketPath])
	got := runBinary(t, filepath.Join(pluginDir, "block-ipam"), cniEnv("ADD", "c1", "eth0", "/x", ""), []byte(conf))
	if got.exit != 1 || !strings.Contains(got.stdout, `"code": 11`) || !strings.Contains(got.stdout, "no such file") {
		t.Errorf("ADD with a socket path of %d bytes: exit %d, %s", shim.MaxSocketPath, got.exit, got.stdout)
	}
}
