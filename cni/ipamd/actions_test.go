package ipamd

import (
	"bytes"
	"context"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/cni"
	"github.com/vpp-route-agent/vpp-route-agent/internal/ipamcall"
)

// logBuffer is a daemon's log, safe for the state loop to write while the test reads it.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// lines returns the log lines that contain s.
func (b *logBuffer) lines(s string) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for _, l := range strings.Split(b.buf.String(), "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return out
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *logBuffer) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

func mustCall(t *testing.T, sock string, req *cni.Request) *cni.Reply {
	t.Helper()
	r, err := ipamcall.Call(context.Background(), sock, req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Verb, req.ContainerID, err)
	}
	return r
}

// TestStatusLogsNothing: STATUS decides as ADD would (on a node without blocks and on one whose
// blocks are full, that decision claims a block) but writes nothing: it logs no line, where the old
// code logged `msg="claiming block"` for a claim nobody made.
func TestStatusLogsNothing(t *testing.T) {
	var log logBuffer
	// Blocks of 4 addresses: four ADDs fill the node's first block.
	srv := startServer(t, Config{Logger: log.logger()}, nil,
		calico.IPPool{Name: "p", CIDR: netip.MustParsePrefix("10.244.0.0/16"), BlockSize: 30})
	status := &cni.Request{Verb: "STATUS", Network: "net1", Assign: [2]bool{true, false}, Timeout: 5 * time.Second}
	if r := mustCall(t, srv.sock, status); r.Code != 0 {
		t.Fatalf("STATUS on a node without blocks: %+v", r)
	}
	if s := log.String(); s != "" {
		t.Errorf("STATUS on a node without blocks logged:\n%s", s)
	}
	for i := range 4 {
		if r := mustCall(t, srv.sock, addRequest("c"+string(rune('0'+i)), 5*time.Second)); r.Code != 0 {
			t.Fatalf("ADD %d: %+v", i, r)
		}
	}
	if n := len(log.lines(`msg="claiming block"`)); n != 1 {
		t.Fatalf("4 ADDs into blocks of 4 logged %d claims, want 1:\n%s", n, log.String())
	}
	before := log.String()
	if r := mustCall(t, srv.sock, status); r.Code != 0 {
		t.Fatalf("STATUS on a node whose blocks are full: %+v", r)
	}
	if s := strings.TrimPrefix(log.String(), before); s != "" {
		t.Errorf("STATUS on a node whose blocks are full logged:\n%s", s)
	}
}

// TestRetriedClaimLogsOnce: an ADD whose claim loses a race (another node creates the block before
// its write) claims again and commits: it logs its claim once, the one that committed,
// and the reply says it took two attempts.
func TestRetriedClaimLogsOnce(t *testing.T) {
	var log logBuffer
	var cli *clientv3.Client
	var once sync.Once
	srv := startServer(t, Config{Logger: log.logger(), Pause: func(ctx context.Context) {
		once.Do(func() {
			// Another node takes the block this claim chose: its write is conditional on the block's
			// absence.
			pool := calico.IPPool{Name: "p", CIDR: netip.MustParsePrefix("10.244.0.0/16"), BlockSize: 26}
			cidr, _ := calico.NextFreeBlock(pool, "node1", nil, nil)
			b := calico.NewBlock(cidr, "host:node2", 1)
			v, _ := calico.EncodeBlock(b)
			if _, err := cli.Put(ctx, calico.BlockKey(b.CIDR), string(v)); err != nil {
				t.Error(err)
			}
		})
	}}, &cli)
	r := mustCall(t, srv.sock, addRequest("c1", 5*time.Second))
	// The figures travel in the reply frame: two attempts, each a listing of the blocks and a write
	// (the first lost, its failure branch reading the state).
	if r.Code != 0 || r.Attempts != 2 || r.RoundTrips != 4 || r.Node != "node1" {
		t.Fatalf("ADD: %+v, want success on node1 in 2 attempts and 4 etcd round trips", r)
	}
	claims := log.lines(`msg="claiming block"`)
	if len(claims) != 1 {
		t.Fatalf("a retried ADD logged %d claims, want 1:\n%s", len(claims), log.String())
	}
	if want := "block=" + netip.PrefixFrom(r.Allocations[0].Addr, 26).Masked().String(); !strings.Contains(claims[0], want) {
		t.Errorf("the claim logged is not the committed one (%s): %s", want, claims[0])
	}
}

// TestUncommittedClaimLogsNothing: an ADD whose claim is never written (its deadline passes before
// the write) logs no claim.
func TestUncommittedClaimLogsNothing(t *testing.T) {
	var log logBuffer
	srv := startServer(t, Config{Logger: log.logger(), Pause: func(ctx context.Context) { <-ctx.Done() }}, nil)
	r := mustCall(t, srv.sock, addRequest("c1", time.Second))
	if r.Code == 0 {
		t.Fatalf("ADD held past its deadline succeeded: %+v", r)
	}
	if claims := log.lines("claiming block"); len(claims) != 0 {
		t.Errorf("an ADD that wrote nothing logged its claim:\n%s", strings.Join(claims, "\n"))
	}
	if failed := log.lines(`msg="ADD failed"`); len(failed) != 1 {
		t.Errorf("the failed ADD logged %d failures, want 1:\n%s", len(failed), log.String())
	}
}
