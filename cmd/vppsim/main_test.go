package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"go.fd.io/govpp/adapter/socketclient"
	"go.fd.io/govpp/binapi/bfd"
	"go.fd.io/govpp/binapi/fib_types"
	interfaces "go.fd.io/govpp/binapi/interface"
	"go.fd.io/govpp/binapi/interface_types"
	"go.fd.io/govpp/binapi/ip"
	"go.fd.io/govpp/binapi/ip_types"
	"go.fd.io/govpp/binapi/memclnt"
	"go.fd.io/govpp/core"

	"github.com/vpp-route-agent/vpp-route-agent/test/vppsim"
)

// TestMain runs the command itself when the test binary is re-executed with
// VPPSIM_RUN_MAIN=1, so process-level tests need no separate build.
func TestMain(m *testing.M) {
	if os.Getenv("VPPSIM_RUN_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	core.SetLogLevel(logrus.ErrorLevel)
	os.Exit(m.Run())
}

func TestFlagErrors(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"--socket", "/tmp/x.sock", "--bogus"},
		{"--socket", "/tmp/x.sock", "--crc", "ip_route_add_del"},
		{"--socket", "/tmp/x.sock", "--crc", "ip_route_add_del=xyz"},
		{"--socket", "/tmp/x.sock", "--crc", "no_such_message=deadbeef"},
		{"--socket", "/tmp/x.sock", "--interface", "eth0", "--interface", "eth0"},
		{"--socket", "/tmp/" + strings.Repeat("s", 120)},
		{"--socket", "/tmp/x.sock", "extra"},
		{"--socket", "/tmp/x.sock", "--reply-delay", "-1s"},
		{"--socket", "/tmp/x.sock", "--hang-up-after", "-2"},
	} {
		var stdout, stderr bytes.Buffer
		err := run(args, &stdout, &stderr)
		if err == nil || !strings.Contains(err.Error(), "usage error") {
			t.Errorf("run(%q) = %v, want a usage error", args, err)
		}
		if stdout.Len() != 0 {
			t.Errorf("run(%q) printed %q on stdout", args, stdout.String())
		}
	}
}

// TestFaultFlags: the faults a process-level test needs are flags.
func TestFaultFlags(t *testing.T) {
	o, cfg, err := parseFlags([]string{"--socket", "/tmp/x.sock", "--interfaces-after", "2s", "--reply-delay", "5ms",
		"--hang-up-after", "7", "--stall"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := vppsim.Faults{HangUpAfter: 7, NoReply: true, NoPingReply: true, ReplyDelay: 5 * time.Millisecond}
	if cfg.InterfaceDelay != 2*time.Second || o.faults != want {
		t.Errorf("interface delay %v, faults %+v; want 2s and %+v", cfg.InterfaceDelay, o.faults, want)
	}
	if _, cfg, err := parseFlags([]string{"--socket", "/tmp/x.sock", "--interfaces-on-demand"}, io.Discard); err != nil || !cfg.InterfacesOnDemand {
		t.Errorf("--interfaces-on-demand: %+v, %v", cfg, err)
	}
	if _, _, err := parseFlags([]string{"--socket", "/tmp/x.sock", "--interfaces-on-demand", "--interfaces-after", "2s"}, io.Discard); !errors.Is(err, errUsage) {
		t.Errorf("--interfaces-on-demand with --interfaces-after: %v, want a usage error", err)
	}
}

// proc is the simulator running as a separate process.
type proc struct {
	cmd   *exec.Cmd
	lines chan string
}

func startProc(t *testing.T, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "VPPSIM_RUN_MAIN=1")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, lines: make(chan string, 10)}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return p
}

func (p *proc) line(t *testing.T) string {
	t.Helper()
	select {
	case l, ok := <-p.lines:
		if !ok {
			t.Fatal("stdout closed")
		}
		return l
	case <-time.After(10 * time.Second):
		t.Fatal("no line on stdout")
		return ""
	}
}

func ping(t *testing.T, sock string) uint32 {
	t.Helper()
	conn, err := core.Connect(socketclient.NewVppClient(sock))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Disconnect()
	ch, err := conn.NewAPIChannel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	ch.SetReplyTimeout(2 * time.Second)
	r := new(memclnt.ControlPingReply)
	if err := ch.SendRequest(&memclnt.ControlPing{}).ReceiveReply(r); err != nil {
		t.Fatal(err)
	}
	route := &ip.IPRouteAddDel{IsAdd: true, Route: ip.IPRoute{
		Prefix: ip_types.Prefix{Address: ip_types.Address{Af: ip_types.ADDRESS_IP4, Un: ip_types.AddressUnionIP4(ip_types.IP4Address{10, 244, 3, 0})}, Len: 26},
		NPaths: 1,
		Paths:  []fib_types.FibPath{{SwIfIndex: 1, Weight: 1, Nh: fib_types.FibPathNh{Address: ip_types.AddressUnionIP4(ip_types.IP4Address{172, 16, 0, 2})}}},
	}}
	if err := ch.SendRequest(route).ReceiveReply(new(ip.IPRouteAddDelReply)); err != nil {
		t.Fatal(err)
	}
	return r.VpePID
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
}

func TestProcess(t *testing.T) {
	dir, err := os.MkdirTemp("", "vs")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "api.sock")
	p := startProc(t, "--socket", sock, "--interface", "eth0", "--interface", "eth1", "--http", "127.0.0.1:0")

	var gotSock, httpAddr string
	var pid uint32
	ready := p.line(t)
	if _, err := fmt.Sscanf(ready, "vppsim ready socket=%s pid=%d http=%s", &gotSock, &pid, &httpAddr); err != nil || gotSock != sock {
		t.Fatalf("ready line %q: %v", ready, err)
	}
	if got := ping(t, sock); got != pid {
		t.Errorf("control_ping pid %d, ready line %d", got, pid)
	}

	var fib []struct {
		TableID uint32 `json:"table_id"`
		Prefix  string `json:"prefix"`
		Source  string `json:"source"`
		Paths   []struct {
			NextHop   string `json:"next_hop"`
			SwIfIndex uint32 `json:"sw_if_index"`
		} `json:"paths"`
	}
	getJSON(t, "http://"+httpAddr+"/fib?source=api", &fib)
	if len(fib) != 1 || fib[0].Prefix != "10.244.3.0/26" || fib[0].Source != "api" || fib[0].Paths[0].NextHop != "172.16.0.2" {
		t.Errorf("/fib?source=api = %+v", fib)
	}
	getJSON(t, "http://"+httpAddr+"/fib", &fib)
	if len(fib) != 8 { // 5 IPv4 specials, the API route, ::/0, fe80::/10
		t.Errorf("/fib has %d routes: %+v", len(fib), fib)
	}
	resp, err := http.Post("http://"+httpAddr+"/neighbor?sw_if_index=1&address=172.16.0.9", "", nil)
	if err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("POST /neighbor: %v %v", resp, err)
	}
	resp.Body.Close()
	fib = nil
	getJSON(t, "http://"+httpAddr+"/fib?source=adjacency", &fib)
	if len(fib) != 1 || fib[0].Prefix != "172.16.0.9/32" || fib[0].Paths[0].NextHop != "172.16.0.9" || fib[0].Paths[0].SwIfIndex != 1 {
		t.Errorf("/fib?source=adjacency after POST /neighbor = %+v", fib)
	}
	checkBFD(t, sock, httpAddr)
	var counts map[string]int
	getJSON(t, "http://"+httpAddr+"/requests", &counts)
	if counts["ip_route_add_del"] != 1 || counts["control_ping"] != 1 || counts["bfd_udp_add"] != 1 {
		t.Errorf("/requests = %v", counts)
	}
	var ifs []struct{ Name string }
	getJSON(t, "http://"+httpAddr+"/interfaces", &ifs)
	if len(ifs) != 3 || ifs[2].Name != "eth1" {
		t.Errorf("/interfaces = %+v", ifs)
	}

	req, _ := http.NewRequest(http.MethodDelete, "http://"+httpAddr+"/interface?name=eth1", nil)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("DELETE /interface: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	getJSON(t, "http://"+httpAddr+"/interfaces", &ifs)
	if len(ifs) != 2 {
		t.Errorf("/interfaces after deleting eth1 = %+v", ifs)
	}
	resp, err = http.Post("http://"+httpAddr+"/interface?name=eth1", "", nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /interface: %v %v", resp, err)
	}
	var created struct {
		SwIfIndex uint32 `json:"sw_if_index"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&created); err != nil || created.SwIfIndex != 2 {
		t.Errorf("POST /interface answered %+v, %v; want sw_if_index 2 (reused)", created, err)
	}
	resp.Body.Close()

	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	var pid2 uint32
	if l := p.line(t); func() error { _, err := fmt.Sscanf(l, "vppsim restarted pid=%d", &pid2); return err }() != nil || pid2 == pid {
		t.Fatalf("restart line %q (old pid %d)", l, pid)
	}
	if got := ping(t, sock); got != pid2 {
		t.Errorf("pid after restart %d, want %d", got, pid2)
	}

	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("exit after SIGTERM: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no exit after SIGTERM")
	}
	// Like VPP, the simulator leaves its socket file behind; connecting to it is refused.
	if _, err := os.Stat(sock); err != nil {
		t.Errorf("socket file gone: %v", err)
	}
	if c, err := net.Dial("unix", sock); err == nil {
		c.Close()
		t.Error("a connection to the socket of an exited simulator succeeded")
	}
}

// checkBFD: with eth0 up, the API route via 172.16.0.2 forwards (GET /forward); a BFD session to that
// peer takes it out until POST /bfd/peer says the peer answers, and GET /bfd shows the session Up then.
func checkBFD(t *testing.T, sock, httpAddr string) {
	t.Helper()
	conn, err := core.Connect(socketclient.NewVppClient(sock))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Disconnect()
	ch, err := conn.NewAPIChannel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	ch.SetReplyTimeout(2 * time.Second)
	up := &interfaces.SwInterfaceSetFlags{SwIfIndex: 1, Flags: interface_types.IF_STATUS_API_FLAG_ADMIN_UP}
	if err := ch.SendRequest(up).ReceiveReply(new(interfaces.SwInterfaceSetFlagsReply)); err != nil {
		t.Fatal(err)
	}
	var paths []struct {
		NextHop string `json:"next_hop"`
	}
	forward := "http://" + httpAddr + "/forward?address=10.244.3.1"
	getJSON(t, forward, &paths)
	if len(paths) != 1 || paths[0].NextHop != "172.16.0.2" {
		t.Errorf("/forward before BFD = %+v, want via 172.16.0.2", paths)
	}
	v4 := func(a [4]byte) ip_types.Address {
		return ip_types.Address{Af: ip_types.ADDRESS_IP4, Un: ip_types.AddressUnionIP4(a)}
	}
	add := &bfd.BfdUDPAdd{SwIfIndex: 1, DesiredMinTx: 300000, RequiredMinRx: 300000, DetectMult: 3,
		LocalAddr: v4([4]byte{172, 16, 0, 1}), PeerAddr: v4([4]byte{172, 16, 0, 2})}
	if err := ch.SendRequest(add).ReceiveReply(new(bfd.BfdUDPAddReply)); err != nil {
		t.Fatal(err)
	}
	getJSON(t, forward, &paths)
	if len(paths) != 0 {
		t.Errorf("/forward with the session Down = %+v, want [] (drop)", paths)
	}
	resp, err := http.Post("http://"+httpAddr+"/bfd/peer?address=172.16.0.2&answering=true", "", nil)
	if err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("POST /bfd/peer: %v %v", resp, err)
	}
	resp.Body.Close()
	var sessions []struct {
		Peer  string `json:"peer"`
		State string `json:"state"`
	}
	getJSON(t, "http://"+httpAddr+"/bfd", &sessions)
	if len(sessions) != 1 || sessions[0].Peer != "172.16.0.2" || sessions[0].State != "up" {
		t.Errorf("/bfd = %+v, want the session to 172.16.0.2 up", sessions)
	}
	getJSON(t, forward, &paths)
	if len(paths) != 1 {
		t.Errorf("/forward with the session Up = %+v, want via 172.16.0.2", paths)
	}
}
