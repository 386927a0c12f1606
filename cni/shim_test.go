package cni_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/version"

	"github.com/vpp-route-agent/vpp-route-agent/cni"
	"github.com/vpp-route-agent/vpp-route-agent/cni/shim"
	"github.com/vpp-route-agent/vpp-route-agent/internal/netaddr"
)

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
	// No CNI_COMMAND (someone ran it by hand): the about text on stderr, exit 0, as skel prints it.
	got = runBinary(t, filepath.Join(pluginDir, "block-ipam"), nil, nil)
	if got.exit != 0 || got.stdout != "" || !strings.HasPrefix(got.stderr, "CNI block-ipam ") ||
		!strings.HasSuffix(got.stderr, "\nCNI protocol versions supported: 0.3.1, 0.4.0, 1.0.0, 1.1.0\n") {
		t.Fatalf("about: %+v", got)
	}
}

// requestFrame is the frame the plugin sends for env and stdin.
func requestFrame(env map[string]string, stdin string) []byte {
	var f []byte
	for k, v := range env {
		f = shim.AppendRecord(f, k, []byte(v))
	}
	return shim.Seal(shim.AppendRecord(f, shim.KeyStdin, []byte(stdin)))
}

// TestDecodeChecksEachRule: the daemon's front door refuses a call whose environment or
// configuration is wrong, with the spec's code and a message naming what is wrong, before any
// request is made of the daemon; a good call decodes into the request the daemon serves.
func TestDecodeChecksEachRule(t *testing.T) {
	env := func(cmd string, kv ...string) map[string]string {
		m := map[string]string{"CNI_COMMAND": cmd, "CNI_CONTAINERID": "c1", "CNI_IFNAME": "eth0", "CNI_NETNS": "/x", "CNI_PATH": "/opt/cni/bin"}
		for i := 0; i < len(kv); i += 2 {
			if kv[i+1] == "" {
				delete(m, kv[i])
			} else {
				m[kv[i]] = kv[i+1]
			}
		}
		return m
	}
	conf := func(ver, ipam string) string {
		return `{"cniVersion":"` + ver + `","name":"n","ipam":{"type":"block-ipam"` + ipam + `}}`
	}
	good := conf("1.1.0", "")
	for _, c := range []struct {
		name  string
		frame []byte
		code  uint
		want  string
	}{
		{"good ADD", requestFrame(env("ADD"), good), 0, ""},
		{"good DEL without CNI_NETNS", requestFrame(env("DEL", "CNI_NETNS", ""), good), 0, ""},
		{"good GC", requestFrame(env("GC", "CNI_CONTAINERID", "", "CNI_IFNAME", "", "CNI_NETNS", ""), good), 0, ""},
		{"not a frame", []byte(shim.Magic + "\xff"), 6, "the plugin's request"},
		{"too large", append([]byte(shim.Magic), make([]byte, shim.MaxFrame)...), 7, "larger than"},
		{"no CNI_COMMAND", requestFrame(env("ADD", "CNI_COMMAND", ""), good), 4, "CNI_COMMAND"},
		{"no CNI_PATH", requestFrame(env("STATUS", "CNI_PATH", ""), good), 4, "CNI_PATH"},
		{"no CNI_CONTAINERID nor CNI_NETNS", requestFrame(env("ADD", "CNI_CONTAINERID", "", "CNI_NETNS", ""), good), 4, "CNI_CONTAINERID, CNI_NETNS"},
		{"unknown command", requestFrame(env("PUT"), good), 4, `"PUT"`},
		{"bad container ID", requestFrame(env("ADD", "CNI_CONTAINERID", "../x"), good), 4, "CNI_CONTAINERID"},
		{"long interface name", requestFrame(env("DEL", "CNI_IFNAME", "a-very-long-interface-name"), good), 4, "CNI_IFNAME"},
		{"interface name with a space", requestFrame(env("ADD", "CNI_IFNAME", "eth 0"), good), 4, "CNI_IFNAME"},
		{"not JSON", requestFrame(env("ADD"), "{"), 6, "decoding the network configuration"},
		{"not an object", requestFrame(env("ADD"), `["a"]`), 6, "decoding the network configuration"},
		{"name not a string", requestFrame(env("ADD"), `{"cniVersion":"1.1.0","name":5,"ipam":{}}`), 6, "decoding the network configuration"},
		{"no name", requestFrame(env("ADD"), `{"cniVersion":"1.1.0","ipam":{}}`), 7, "name: missing"},
		{"bad network name", requestFrame(env("ADD"), `{"cniVersion":"1.1.0","name":"a b","ipam":{}}`), 7, `name: "a b"`},
		{"unsupported cniVersion", requestFrame(env("ADD"), conf("0.2.0", "")), 1, `"0.2.0" is not one block-ipam supports`},
		{"newer cniVersion", requestFrame(env("DEL"), conf("1.2.0", "")), 1, `"1.2.0"`},
		{"cniVersion not a version", requestFrame(env("ADD"), conf("1.x", "")), 6, "cniVersion"},
		{"cniVersion not a string", requestFrame(env("ADD"), `{"cniVersion":5,"name":"n","ipam":{}}`), 6, "decoding"},
		{"CHECK at 0.3.1", requestFrame(env("CHECK"), conf("0.3.1", "")), 1, "does not allow CHECK"},
		{"GC at 1.0.0", requestFrame(env("GC"), conf("1.0.0", "")), 1, "does not allow GC"},
		{"STATUS at 0.4.0", requestFrame(env("STATUS"), conf("0.4.0", "")), 1, "does not allow STATUS"},
		// The version is checked before the settings, which it may change the meaning of.
		{"unsupported cniVersion and a bad field", requestFrame(env("ADD"), conf("0.2.0", `,"exclude":5`)), 1, `"0.2.0"`},
		{"no ipam", requestFrame(env("ADD"), `{"cniVersion":"1.1.0","name":"n"}`), 7, "ipam: missing"},
		{"field of the wrong type", requestFrame(env("ADD"), conf("1.1.0", `,"exclude":5`)), 7, "ipam.exclude"},
		{"bad field", requestFrame(env("ADD"), conf("1.1.0", `,"exclude":["x"]`)), 7, "ipam.exclude[0]"},
		{"bad timeout", requestFrame(env("STATUS"), conf("1.1.0", `,"timeout":"soon"`)), 7, "ipam.timeout"},
		{"nothing to assign", requestFrame(env("ADD"), conf("1.1.0", `,"assign_ipv4":"false"`)), 7, "nothing to assign"},
		{"malformed CNI_ARGS", requestFrame(env("ADD", "CNI_ARGS", "K8S_POD_NAME"), good), 4, "CNI_ARGS"},
		{"resolvConf unreadable", requestFrame(env("ADD", shim.KeyResolvConfErr, "open /r: no such file"), conf("1.1.0", `,"resolvConf":"/r"`)), 7, "ipam.resolvConf"},
		{"ADD in the plugin's own netns", requestFrame(env("ADD", shim.KeyNetNS, shim.NetNSOwn), good), 8, "own network namespace"},
		{"ADD in a netns the plugin could not compare", requestFrame(env("ADD", shim.KeyNetNS, "get plugin's netns failed: permission denied"), good), 8, "permission denied"},
	} {
		call, err := cni.Decode(c.frame)
		switch {
		case c.code == 0 && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case c.code != 0 && err == nil:
			t.Errorf("%s: decoded into %+v; want code %d", c.name, call.Request(), c.code)
		case c.code != 0 && (err.Code != c.code || !strings.Contains(err.Msg, c.want)):
			t.Errorf("%s: code %d, %q; want %d, %q", c.name, err.Code, err.Msg, c.code, c.want)
		}
	}

	// A good call: the request the daemon serves, with the call's environment and timeout.
	call, err := cni.Decode(requestFrame(env("STATUS", "CNI_CONTAINERID", "", "CNI_IFNAME", ""), conf("1.1.0", `,"timeout":"7s"`)))
	if err != nil {
		t.Fatal(err)
	}
	if r := call.Request(); r.Verb != "STATUS" || r.Network != "n" || r.Timeout != shim.StatusTimeout || !r.Assign[netaddr.V4] {
		t.Errorf("STATUS decoded into %+v", r)
	}
	call, err = cni.Decode(requestFrame(env("ADD", "CNI_CONTAINERID", "c-7", "CNI_IFNAME", "net1"), conf("1.1.0", `,"timeout":"7s"`)))
	if err != nil {
		t.Fatal(err)
	}
	if r := call.Request(); r.Verb != "ADD" || r.ContainerID != "c-7" || r.IfName != "net1" || r.Timeout != 7*time.Second {
		t.Errorf("ADD decoded into %+v", r)
	}

	// DEL is served (the release never needs the netns), then fails as skel failed it after DEL: the
	// plugin's own netns, or one the plugin could not compare with its own.
	for _, ns := range []string{shim.NetNSOwn, "get plugin's netns failed: permission denied"} {
		call, err := cni.Decode(requestFrame(env("DEL", shim.KeyNetNS, ns), good))
		if err != nil {
			t.Fatalf("DEL, netns %q: %v", ns, err)
		}
		rec, perr := shim.ParseFrame(call.Render(&cni.Reply{Node: "n"}))
		if perr != nil {
			t.Fatalf("DEL, netns %q: reply: %v", ns, perr)
		}
		if string(rec[shim.KeyExit]) == "0" || !strings.Contains(string(rec[shim.KeyStdout]), `"code": 8`) {
			t.Errorf("DEL, netns %q: exit %s, printed %s; want code 8", ns, rec[shim.KeyExit], rec[shim.KeyStdout])
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
