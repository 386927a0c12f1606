//go:build linux && amd64

package deploy

import (
	"bufio"
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/cni"
	"github.com/vpp-route-agent/vpp-route-agent/internal/calicotest"
	"github.com/vpp-route-agent/vpp-route-agent/internal/etcdtest"
	"github.com/vpp-route-agent/vpp-route-agent/internal/ipamcall"
)

// sandboxEnv makes the test binary the sandbox helper (see sandboxHelper): the value is the program
// to execute in the sandbox, or "probe-chown".
const sandboxEnv = "DEPLOY_TEST_SANDBOX"

// init turns the re-executed test binary into the sandbox helper before any test runs.
func init() {
	if target := os.Getenv(sandboxEnv); target != "" {
		sandboxHelper(target)
	}
}

// ipamcallAdd is the test's request to the daemon.
var ipamcallAdd = cni.Request{Verb: "ADD", ContainerID: "c1", IfName: "eth0", Network: "net1", Assign: [2]bool{true, false}}

// sandboxUID is the unprivileged user the helper becomes (the unit's User=block-ipam, which this
// machine need not have).
const sandboxUID = 65534

// unitSandbox is what the test emulates of a unit's [Service] section.
type unitSandbox struct {
	filters  []string // SystemCallFilter= values, in order
	errno    string   // SystemCallErrorNumber=
	umask    string
	dirMode  string // RuntimeDirectoryMode=
	nnp      string // NoNewPrivileges=
	capBound string // CapabilityBoundingSet=
}

func readUnitSandbox(t *testing.T, path string) unitSandbox {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var u unitSandbox
	capSet := false
	for line := range strings.Lines(string(data)) {
		k, v, ok := strings.Cut(strings.TrimSpace(line), "=")
		if !ok || strings.HasPrefix(k, "#") {
			continue
		}
		switch k {
		case "SystemCallFilter":
			u.filters = append(u.filters, v)
		case "SystemCallErrorNumber":
			u.errno = v
		case "UMask":
			u.umask = v
		case "RuntimeDirectoryMode":
			u.dirMode = v
		case "NoNewPrivileges":
			u.nnp = v
		case "CapabilityBoundingSet":
			u.capBound, capSet = v, true
		}
	}
	if u.errno != "EPERM" || u.nnp != "yes" || !capSet || u.capBound != "" || len(u.filters) == 0 || strings.HasPrefix(u.filters[0], "~") {
		t.Fatalf("%s: the test emulates an allow-list SystemCallFilter with SystemCallErrorNumber=EPERM, NoNewPrivileges=yes and "+
			"an empty CapabilityBoundingSet; the unit has %+v", path, u)
	}
	return u
}

// readSets reads name -> members (system calls and nested @sets) from testdata.
func readSets(t *testing.T, path string, numbers bool) (map[string][]string, map[string]int) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sets, nrs := map[string][]string{}, map[string]int{}
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") || line == "" {
			continue
		}
		if numbers {
			name, nr, _ := strings.Cut(line, " ")
			n, err := strconv.Atoi(nr)
			if err != nil {
				t.Fatalf("%s: %q", path, line)
			}
			nrs[name] = n
			continue
		}
		name, members, _ := strings.Cut(line, ":")
		sets[name] = strings.Fields(members)
	}
	return sets, nrs
}

// allowedSyscalls expands the unit's SystemCallFilter= lines as systemd does: the first, an allow list,
// sets the default (deny); each later one adds its calls, or, with "~", removes them.
func allowedSyscalls(t *testing.T, u unitSandbox) []int {
	t.Helper()
	sets, _ := readSets(t, "testdata/systemd-syscall-sets.txt", false)
	_, nrs := readSets(t, "testdata/syscalls-amd64.txt", true)
	var expand func(name string, into map[string]bool)
	expand = func(name string, into map[string]bool) {
		if !strings.HasPrefix(name, "@") {
			into[name] = true
			return
		}
		members, ok := sets[name]
		if !ok {
			t.Fatalf("unknown system call set %s", name)
		}
		for _, m := range members {
			expand(m, into)
		}
	}
	allowed := map[string]bool{}
	for _, f := range u.filters {
		deny := strings.HasPrefix(f, "~")
		names := map[string]bool{}
		for _, n := range strings.Fields(strings.TrimPrefix(f, "~")) {
			expand(n, names)
		}
		for n := range names {
			if deny {
				delete(allowed, n)
			} else {
				allowed[n] = true
			}
		}
	}
	var out []int
	for n := range allowed {
		if nr, ok := nrs[n]; ok { // names of other architectures (chown32...) have no amd64 number
			out = append(out, nr)
		}
	}
	return out
}

// seccompProgram returns a filter that allows the system calls allowed and fails every other, and any
// call of another architecture, with EPERM.
func seccompProgram(allowed []int) []unix.SockFilter {
	const (
		ld   = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
		jeq  = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
		ret  = unix.BPF_RET | unix.BPF_K
		deny = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
	)
	prog := []unix.SockFilter{
		{Code: ld, K: 4}, // seccomp_data.arch
		{Code: jeq, Jt: 1, Jf: 0, K: unix.AUDIT_ARCH_X86_64},
		{Code: ret, K: deny},
		{Code: ld, K: 0}, // seccomp_data.nr
	}
	for _, nr := range allowed {
		prog = append(prog, unix.SockFilter{Code: jeq, Jt: 0, Jf: 1, K: uint32(nr)}, unix.SockFilter{Code: ret, K: unix.SECCOMP_RET_ALLOW})
	}
	return append(prog, unix.SockFilter{Code: ret, K: deny})
}

// sandboxHelper runs in the re-executed test binary: it becomes sandboxUID, sets no_new_privs, the
// umask and the seccomp filter (the allowed numbers in DEPLOY_TEST_SYSCALLS) on its thread, and
// executes the program (which keeps the filter), or probes chown.
func sandboxHelper(target string) {
	runtime.LockOSThread()
	fail := func(what string, err error) {
		fmt.Fprintf(os.Stderr, "sandbox: %s: %v\n", what, err)
		os.Exit(127)
	}
	var allowed []int
	for _, s := range strings.Split(os.Getenv("DEPLOY_TEST_SYSCALLS"), ",") {
		n, err := strconv.Atoi(s)
		if err != nil {
			fail("DEPLOY_TEST_SYSCALLS", err)
		}
		allowed = append(allowed, n)
	}
	umask, err := strconv.ParseUint(os.Getenv("DEPLOY_TEST_UMASK"), 8, 32)
	if err != nil {
		fail("DEPLOY_TEST_UMASK", err)
	}
	if err := syscall.Setgroups(nil); err != nil {
		fail("setgroups", err)
	}
	if err := syscall.Setgid(sandboxUID); err != nil {
		fail("setgid", err)
	}
	if err := syscall.Setuid(sandboxUID); err != nil {
		fail("setuid", err)
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		fail("no_new_privs", err)
	}
	syscall.Umask(int(umask))
	prog := seccompProgram(allowed)
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	if err := unix.Prctl(unix.PR_SET_SECCOMP, unix.SECCOMP_MODE_FILTER, uintptr(unsafe.Pointer(&fprog)), 0, 0); err != nil {
		fail("seccomp", err)
	}
	if target == "probe-chown" {
		// A file of its own, to its own group: what no privilege is needed for, and what the
		// filter alone forbids.
		fd, err := unix.Open(os.Getenv("DEPLOY_TEST_PROBE"), unix.O_CREAT|unix.O_WRONLY, 0o600)
		if err != nil {
			fail("open", err)
		}
		fmt.Printf("fchown: %v\n", unix.Fchown(fd, -1, sandboxUID))
		os.Exit(0)
	}
	env := []string{}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DEPLOY_TEST_") {
			env = append(env, kv)
		}
	}
	fail("exec", syscall.Exec(target, append([]string{target}, flagArgs()...), env))
}

// flagArgs are the helper's arguments after "--".
func flagArgs() []string {
	for i, a := range os.Args {
		if a == "--" {
			return os.Args[i+1:]
		}
	}
	return nil
}

// TestBlockIPAMDUnderUnitSandbox: block-ipamd starts, serves and stops as deploy/systemd/block-ipamd.service
// runs it: as an unprivileged user (User=), with no_new_privs and no capability (NoNewPrivileges=,
// CapabilityBoundingSet=), the unit's UMask, its socket in a runtime directory of the unit's mode owned
// by that user, under the unit's system call filter (its SystemCallFilter= lines expanded with
// systemd 252's sets, every other call failing with EPERM). That filter forbids chown, which the
// removed --socket-group needed: the probe shows the emulated filter does deny it. Not emulated: the
// mount namespace (ProtectSystem= and the like) and the address families.
func TestBlockIPAMDUnderUnitSandbox(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to become the unit's unprivileged user")
	}
	u := readUnitSandbox(t, "systemd/block-ipamd.service")
	allowed := allowedSyscalls(t, u)
	nrs := make([]string, len(allowed))
	for i, n := range allowed {
		nrs[i] = strconv.Itoa(n)
	}
	umask := strings.TrimPrefix(u.umask, "0")
	base, err := os.MkdirTemp("", "bi")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(base)
	os.Chmod(base, 0o755)
	bin := filepath.Join(base, "block-ipamd")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	build := exec.CommandContext(ctx, goTool(), "build", "-o", bin, "./cmd/block-ipamd")
	build.Dir = repoRoot
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/block-ipamd: %v\n%s", err, out)
	}
	helper := func(target string, args ...string) *exec.Cmd {
		cmd := exec.CommandContext(ctx, os.Args[0], append([]string{"--"}, args...)...)
		cmd.Env = append(os.Environ(), sandboxEnv+"="+target, "DEPLOY_TEST_SYSCALLS="+strings.Join(nrs, ","), "DEPLOY_TEST_UMASK="+umask,
			"DEPLOY_TEST_PROBE="+filepath.Join(base, "block-ipam", "probe"))
		return cmd
	}

	// The runtime directory as systemd creates it: owned by the service's user, the unit's mode.
	mode, err := strconv.ParseUint(u.dirMode, 8, 32)
	if err != nil {
		t.Fatalf("RuntimeDirectoryMode=%s: %v", u.dirMode, err)
	}
	rt := filepath.Join(base, "block-ipam")
	if err := os.Mkdir(rt, os.FileMode(mode)); err != nil {
		t.Fatal(err)
	}
	os.Chmod(rt, os.FileMode(mode))
	if err := os.Chown(rt, sandboxUID, sandboxUID); err != nil {
		t.Fatal(err)
	}
	// The emulation is real: chown of its own file to its own group fails.
	out, err := helper("probe-chown").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "fchown: operation not permitted") {
		t.Fatalf("chown under the unit's filter: %v\n%s", err, out)
	}

	sock := filepath.Join(rt, "block-ipam.sock")
	_, cli := etcdtest.Start(t)
	if err := calicotest.PutPool(ctx, cli, calico.IPPool{Name: "p", CIDR: netip.MustParsePrefix("10.244.0.0/16"), BlockSize: 26}); err != nil {
		t.Fatal(err)
	}
	daemon := helper(bin, "--nodename", "n1", "--socket", sock, "--metrics-address", "", "--etcd-endpoints", cli.Endpoints()[0])
	var logs strings.Builder
	daemon.Stdout, daemon.Stderr = &logs, &logs
	if err := daemon.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- daemon.Wait() }()
	defer func() {
		daemon.Process.Kill()
		<-done
	}()
	// Root (the runtime executing the plugin) asks it for an address.
	var reply error
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		r, err := ipamcall.Call(cctx, sock, &ipamcallAdd)
		ccancel()
		if reply = err; err == nil {
			reply = r.Err()
		}
		if reply == nil {
			break
		}
		select {
		case err := <-done:
			done <- err
			t.Fatalf("block-ipamd under the unit's sandbox exited: %v\n%s", err, logs.String())
		default:
		}
	}
	if reply != nil {
		t.Fatalf("ADD to block-ipamd under the unit's sandbox: %v\n%s", reply, logs.String())
	}
	var st unix.Stat_t
	if err := unix.Stat(sock, &st); err != nil || st.Mode&0o777 != 0o600 || st.Uid != sandboxUID {
		t.Errorf("socket: %v, mode %o, owner %d; want 0600, owned by the service's user", err, st.Mode&0o777, st.Uid)
	}
	daemon.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-done:
		done <- err
		if err != nil {
			t.Errorf("stop: %v\n%s", err, logs.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("no stop within the unit's TimeoutStopSec\n%s", logs.String())
	}
	if _, err := os.Lstat(sock); !os.IsNotExist(err) {
		t.Errorf("socket left after stop: %v", err)
	}
	if strings.Contains(logs.String(), "operation not permitted") {
		t.Errorf("a system call was refused:\n%s", logs.String())
	}
}
