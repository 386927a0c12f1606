package cni_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/cni/shim"
)

// daemonMemoryLimit is the block-ipamd container's memory limit in deploy/kubernetes/daemonset.yaml,
// which also sets GOMEMLIMIT to it.
const daemonMemoryLimit = 128 << 20

// TestSocketAttackWithinMemoryLimit: clients that connect and send nothing, and clients that send
// requests of the largest size slowly, do not take the daemon's memory past the DaemonSet's limit,
// and real ADDs and DELs through the plugin are answered meanwhile within a generous bound. Before
// the daemon bounded its connections and request bytes, 150 slow large requests alone held more
// than the limit. The attackers run in a process of their own (this test binary again, see
// runAttacker), as they would on a node: in the test process they would starve the embedded etcd,
// whose silence the daemon rightly reports as an etcd outage.
func TestSocketAttackWithinMemoryLimit(t *testing.T) {
	e := newEnv(t)
	e.putPool("p", "10.244.0.0/16", 26)
	sock := filepath.Join(e.sockDir, "atk.sock")
	cmd, _ := e.daemonProcess("node1", sock, "GOMEMLIMIT=128MiB")
	conf := []byte(fmt.Sprintf(`{"cniVersion":"1.1.0","name":"net1","type":"block-ipam","ipam":{"type":"block-ipam","socket":%q,"nodename":"node1","timeout":"20s"}}`, sock))
	plugin := filepath.Join(pluginDir, "block-ipam")
	// One ADD before the attack: the daemon has read the node's state and claimed a block.
	if got := runBinary(t, plugin, cniEnv("ADD", "warm", "eth0", "/x", ""), conf); got.exit != 0 {
		t.Fatalf("ADD before the attack: %+v", got)
	}

	attacker := exec.Command(os.Args[0])
	attacker.Env = append(os.Environ(), attackSockEnv+"="+sock)
	var out strings.Builder
	attacker.Stdout, attacker.Stderr = &out, &out
	if err := attacker.Start(); err != nil {
		t.Fatal(err)
	}
	defer attacker.Process.Kill()
	attackStart := time.Now()

	// Real requests while the attack runs.
	time.Sleep(time.Second)
	var took []time.Duration
	for i := range 10 {
		cid := "real" + strconv.Itoa(i)
		for _, verb := range []string{"ADD", "DEL"} {
			start := time.Now()
			got := runBinary(t, plugin, cniEnv(verb, cid, "eth0", "/x", ""), conf)
			d := time.Since(start)
			took = append(took, d)
			if got.exit != 0 {
				t.Errorf("%s %s during the attack: %+v", verb, cid, got)
			}
			// Generous: unattacked, a call takes a few ms here.
			if d > 3*time.Second {
				t.Errorf("%s %s during the attack took %v", verb, cid, d)
			}
		}
	}
	// The attack lasts 10 s at least, whatever the real calls took: long enough to fill what the daemon
	// lets connections buffer, many times over.
	time.Sleep(time.Until(attackStart.Add(10 * time.Second)))
	hwm, err := vmHWM(cmd.Process.Pid)
	attacker.Process.Signal(syscall.SIGTERM)
	if werr := attacker.Wait(); werr != nil {
		t.Fatalf("attacker: %v\n%s", werr, out.String())
	}
	if err != nil {
		t.Fatal(err)
	}
	var n attackCounts
	if err := json.Unmarshal([]byte(lastLine(out.String())), &n); err != nil {
		t.Fatalf("attacker's counts: %v\n%s", err, out.String())
	}
	slices.Sort(took)
	t.Logf("attack: %d idle connections, %d slow ones (%d MiB sent); real calls: median %v, max %v; daemon peak RSS %d MiB",
		n.Idle, n.Slow, n.SlowBytes>>20, took[len(took)/2], took[len(took)-1], hwm>>20)
	if hwm >= daemonMemoryLimit {
		t.Errorf("the daemon's peak RSS %d MiB, over the DaemonSet's limit of %d MiB", hwm>>20, daemonMemoryLimit>>20)
	}
	if n.Idle < 1500 || n.SlowBytes < 150<<20 {
		t.Errorf("the attack did not run: %d idle connections, %d MiB sent slowly", n.Idle, n.SlowBytes>>20)
	}
	if got := runBinary(t, plugin, cniEnv("ADD", "after", "eth0", "/x", ""), conf); got.exit != 0 {
		t.Errorf("ADD after the attack: %+v", got)
	}
}

// attackSockEnv names the socket the test binary attacks when started as the attacker (runMain).
const attackSockEnv = "BLOCK_IPAM_TEST_ATTACK_SOCKET"

// attackCounts is what the attacker did, printed as JSON on its last line.
type attackCounts struct {
	Idle, Slow, SlowBytes int64
}

// runAttacker attacks the daemon's socket until SIGTERM (at most 60 s): 1,500 clients that connect and
// send nothing, connecting again when the daemon closes them, and 150 that send requests of almost
// MaxFrame bytes, 64 KiB every 10 ms. It prints its counts and returns the exit status.
func runAttacker(sock string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var idleConns, slowConns, slowBytes atomic.Int64
	dial := func() net.Conn {
		for ctx.Err() == nil {
			c, err := net.Dial("unix", sock)
			if err == nil {
				return c
			}
			// The kernel's queue of connections is full: the daemon is busy accepting.
			time.Sleep(2 * time.Millisecond)
		}
		return nil
	}
	for range 1500 {
		wg.Go(func() {
			for ctx.Err() == nil {
				c := dial()
				if c == nil {
					return
				}
				idleConns.Add(1)
				stopRead := context.AfterFunc(ctx, func() { c.Close() })
				c.Read(make([]byte, 1))
				stopRead()
				c.Close()
			}
		})
	}
	for range 150 {
		wg.Go(func() {
			size := shim.MaxFrame - 100
			rec := shim.AppendRecord(nil, shim.KeyStdin, nil)
			rec = append(rec[:len(rec)-1], byte(size|0x80), byte(size>>7|0x80), byte(size>>14))
			// The frame's head: Magic and the length of the records with size bytes of stdin.
			head := shim.Seal(append(rec, make([]byte, size)...))
			head = head[:len(head)-size]
			chunk := make([]byte, 64<<10)
			for ctx.Err() == nil {
				c := dial()
				if c == nil {
					return
				}
				slowConns.Add(1)
				stopWrite := context.AfterFunc(ctx, func() { c.Close() })
				_, err := c.Write(head)
				for sent := 0; err == nil && sent < size && ctx.Err() == nil; sent += len(chunk) {
					var n int
					n, err = c.Write(chunk[:min(len(chunk), size-sent)])
					slowBytes.Add(int64(n))
					time.Sleep(10 * time.Millisecond)
				}
				stopWrite()
				c.Close()
			}
		})
	}
	wg.Wait()
	b, _ := json.Marshal(attackCounts{Idle: idleConns.Load(), Slow: slowConns.Load(), SlowBytes: slowBytes.Load()})
	fmt.Println(string(b))
	return 0
}

// lastLine returns the last non-empty line of s.
func lastLine(s string) string {
	s = strings.TrimSpace(s)
	return s[strings.LastIndexByte(s, '\n')+1:]
}

// vmHWM returns a process's peak resident set size.
func vmHWM(pid int) (int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(data)) {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, errors.New("no VmHWM in /proc/" + strconv.Itoa(pid) + "/status")
}
