package ipamd

import (
	"bytes"
	"context"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/vpp-route-agent/vpp-route-agent/cni/shim"
	"github.com/vpp-route-agent/vpp-route-agent/internal/ipamcall"
)

// TestConnectionLimits: at the connection limit, a real request displaces the connection that has
// waited longest for its request and is answered; a request that needs more than the request
// bytes left is refused with 11 as a frame the plugin reads (counted), not dropped.
func TestConnectionLimits(t *testing.T) {
	srv := startServer(t, Config{MaxConnections: 2, MaxRequestBytes: 64 << 10}, nil)
	var idle []net.Conn
	for range 2 {
		c, err := net.Dial("unix", srv.sock)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		idle = append(idle, c)
	}
	// Both are accepted, and idle for longer than displaceAge.
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		srv.limits.mu.Lock()
		reading := srv.limits.reading.Len()
		srv.limits.mu.Unlock()
		if reading == 2 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("%d of the 2 idle connections accepted", reading)
		}
	}
	time.Sleep(2 * displaceAge)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if r, err := ipamcall.Call(ctx, srv.sock, addRequest("c1", 5*time.Second)); err != nil || r.Err() != nil {
		t.Fatalf("ADD at the connection limit: %+v %v", r, err)
	}
	// The first idle connection was closed for it, well before the read deadline.
	idle[0].SetReadDeadline(time.Now().Add(connTimeout / 2))
	if _, err := idle[0].Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("the oldest idle connection: %v, want it closed", err)
	}
	if n := dropped(t, srv.Server, "displaced"); n != 1 {
		t.Errorf("%v connections displaced, want 1", n)
	}

	// A request over the bytes left: 11, as a frame.
	c, err := net.Dial("unix", srv.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	frame := shim.AppendRecord(nil, "CNI_COMMAND", []byte("ADD"))
	frame = shim.Seal(shim.AppendRecord(frame, shim.KeyStdin, bytes.Repeat([]byte("x"), 100<<10)))
	if _, err := c.Write(frame); err != nil {
		t.Fatal(err)
	}
	reply, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := shim.ParseFrame(reply)
	if err != nil || string(rec[shim.KeyExit]) != "1" || !strings.Contains(string(rec[shim.KeyStdout]), `"code": 11`) ||
		!strings.Contains(string(rec[shim.KeyStdout]), "busy") {
		t.Fatalf("request over the bytes left: %q %v", reply, err)
	}
	if n := dropped(t, srv.Server, "bytes"); n != 1 {
		t.Errorf("%v requests refused for bytes, want 1", n)
	}
	srv.limits.mu.Lock()
	defer srv.limits.mu.Unlock()
	if srv.limits.bytes != 0 {
		t.Errorf("%d request bytes still reserved", srv.limits.bytes)
	}
}

// dropped returns block_ipam_connections_dropped_total{reason}.
func dropped(t *testing.T, srv *Server, reason string) float64 {
	t.Helper()
	var m dto.Metric
	if err := srv.metrics.dropped.WithLabelValues(reason).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// TestWholeRequestIsNotDisplaced: a connection displaced after its reader took the last byte of its
// request, but before it marked the request read, is served all the same. The plugin keeps its side
// open after its request, so such a connection looks idle in the kernel, like an attacker's.
func TestWholeRequestIsNotDisplaced(t *testing.T) {
	l := newConnLimits(1, 1<<20, newMetrics(nil))
	ln, err := net.Listen("unix", t.TempDir()+"/l.sock")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	plugin, err := net.Dial("unix", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer plugin.Close()
	conn, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := l.admit(conn, time.Minute)
	frame := shim.Seal(shim.AppendRecord(nil, shim.KeyStdin, []byte("{}")))
	if _, err := plugin.Write(frame); err != nil {
		t.Fatal(err)
	}
	data, size, _, err := l.read(c, 1<<20)
	if err != nil || size != len(frame) || !bytes.Equal(data, frame) {
		t.Fatalf("read %q (size %d), %v", data, size, err)
	}
	time.Sleep(2 * displaceAge)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if !l.makeRoom(ctx) || !c.displaced {
		t.Fatal("the connection, idle in the kernel and at the limit, was not displaced: the case under test did not arise")
	}
	l.doneReading(c)
	if c.displaced || l.open != 1 || l.reading.Len() != 0 {
		t.Errorf("after its whole request was read: displaced %v, %d open, %d reading; want it served, counted", c.displaced, l.open, l.reading.Len())
	}
}
